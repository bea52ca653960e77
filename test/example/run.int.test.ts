import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { generateProblems, type Problem } from '../../recipes/openclawrl/harness/problems.js';
import type { SessionResult } from '../../recipes/openclawrl/harness/report.js';
import { runSessions, type Progress } from '../../recipes/openclawrl/harness/run.js';
import { ScriptedStudent } from '../../recipes/openclawrl/harness/student.js';
import { startGatewayFixture, type GatewayFixture, type PromptView } from './gateway-fixture.js';

/**
 * The example's agent loop and scripted student against a real gateway over the engine double.
 * The double "adapts" like a policy would: its first replies carry bold text (then a list), a
 * complaint gets a plain rewrite, and from the fourth session on it answers plainly at once. One
 * session's model does not call the save tool, and the session must still end.
 */

const problems = generateProblems(6, 11);
const NO_SAVE_SESSION = 5;

function scriptedModel(): (p: PromptView) => string {
  let openings = 0;
  let saveAsks = 0;
  return ({ text, userTurns }) => {
    const last = userTurns.at(-1) ?? '';
    const problem = problems.find((q) => text.includes(q.question)) as Problem;
    const plain = problem.solution_steps.join(' ');
    if (last.includes('<tool_response>')) return 'Done, it is saved in your homework file.';
    if (last.includes('HOMEWORK_DONE')) return 'You are welcome, good luck with school!';
    if (/save/i.test(last)) {
      saveAsks++;
      if (saveAsks === NO_SAVE_SESSION) return 'Sure! You can copy the text above.';
      return `<tool_call>\n${JSON.stringify({ name: 'save_homework', arguments: { content: plain } })}\n</tool_call>`;
    }
    if (userTurns.length > 1) return plain;
    openings++;
    if (openings <= 2) return `Here is the solution.\n\n${plain}\n\nThe answer is **${problem.answer}**.`;
    if (openings === 3) return problem.solution_steps.map((s) => `- ${s}`).join('\n');
    return plain;
  };
}

describe('the example run against a gateway', () => {
  let fx: GatewayFixture;
  let out: string;
  const progress: Progress[] = [];
  let summary: Awaited<ReturnType<typeof runSessions>>;

  beforeAll(async () => {
    fx = await startGatewayFixture(scriptedModel());
    out = mkdtempSync(join(tmpdir(), 'reef-example-out-'));
    const prm = join(out, 'prm.jsonl');
    writeFileSync(prm, `${JSON.stringify({ batch: 'homework:openclawrl:1', rewards: { '1': 5, '-1': 3, '0': 0 } })}\n`);
    // An earlier run's save of the session that saves nothing in this one.
    mkdirSync(join(out, 'homework'));
    writeFileSync(join(out, `homework/s00${NO_SAVE_SESSION}.txt`), 'an earlier run');
    writeFileSync(join(out, 'homework/notes.txt'), 'not the agent\'s');
    summary = await runSessions({
      gateway: fx.url,
      scenario: 'homework',
      problems,
      student: new ScriptedStudent(),
      outputDir: out,
      prmRecordFile: prm,
      agent: { model: 'tiny', maxTokens: 256 },
      onProgress: (p) => progress.push(p),
    });
  });

  afterAll(async () => {
    await fx?.close();
    if (out) rmSync(out, { recursive: true, force: true });
  });

  it('scores each session by its first reply and finds the adaptation point', () => {
    const lines = readFileSync(join(out, 'results/sessions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as SessionResult);
    expect(lines.map((s) => [s.index, s.problem_id, s.passed, s.bold, s.list])).toEqual([
      [1, problems[0]!.id, false, true, false],
      [2, problems[1]!.id, false, true, false],
      [3, problems[2]!.id, false, false, true],
      [4, problems[3]!.id, true, false, false],
      [5, problems[4]!.id, true, false, false],
      [6, problems[5]!.id, true, false, false],
    ]);
    expect(lines[0]!.first_reply).toContain('**');
    expect(summary).toMatchObject({ sessions: 6, passed: 3, bold: 2, list: 1, sessions_to_adaptation: 4, ended: { done: 6 } });
    // The habit is any of bold, a list or a heading: sessions 1-3 have one each, no heading.
    expect(lines.map((s) => s.habit)).toEqual([true, true, true, false, false, false]);
    expect(summary.rolling_end).toEqual({ session: 6, pass: 0.5, habit: 3 / 6, bold: 2 / 6, list: 1 / 6 });
  });

  it('complains, rewrites, asks to save in a separate message, saves, ends with HOMEWORK_DONE', () => {
    const t = readFileSync(join(out, 'results/transcripts.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { index: number; turns: Array<{ student: string; reply: string; tool_calls: Array<{ name: string; ok: boolean }> }> });
    const s1 = t[0]!.turns;
    expect(s1.map((x) => x.student)).toHaveLength(4);
    expect(s1[1]!.student).toMatch(/bold text/);
    expect(s1[2]!.student).toMatch(/save/i);
    expect(s1[2]!.tool_calls).toEqual([expect.objectContaining({ name: 'save_homework', ok: true })]);
    expect(s1[3]!.student).toContain('HOMEWORK_DONE');
    expect(readFileSync(join(out, 'homework/s001.txt'), 'utf8')).toBe(problems[0]!.solution_steps.join(' '));
    // A passing session: opening, save request, done.
    expect(t[3]!.turns).toHaveLength(3);
  });

  it('ends a session whose model never calls the save tool', () => {
    const lines = readFileSync(join(out, 'results/sessions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as SessionResult);
    expect(lines[NO_SAVE_SESSION - 1]).toMatchObject({ saved: false, ended: 'done', turns: 3 });
    expect(existsSync(join(out, `homework/s00${NO_SAVE_SESSION}.txt`))).toBe(false);
    expect(readFileSync(join(out, 'homework/notes.txt'), 'utf8')).toBe('not the agent\'s');
    expect(lines.filter((s) => s.saved)).toHaveLength(5);
  });

  it('tags every request with the scenario and the session, and keeps every receipt', async () => {
    const records = await fx.gw.store.readFrom(1, 1000);
    const lines = readFileSync(join(out, 'results/sessions.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as SessionResult);
    expect(records.length).toBe(lines.reduce((n, s) => n + s.record_ids.length, 0));
    for (const s of lines) {
      expect(s.tag).toBe(`homework-s${s.index}`);
      const mine = records.filter((r) => r.tags.session === s.tag);
      expect(mine.map((r) => r.id).sort()).toEqual([...s.record_ids].sort());
      expect(mine.every((r) => r.scenario === 'homework')).toBe(true);
    }
  });

  it('reports progress per session and writes the summary and plots', () => {
    expect(progress.map((p) => p.done)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(progress[3]!.line).toMatch(/^session 4\/6 {2}pass yes/);
    const written = JSON.parse(readFileSync(join(out, 'results/summary.json'), 'utf8'));
    expect(written).toMatchObject({ sessions: 6, sessions_to_adaptation: 4, batches: [{ batch: 'homework:openclawrl:1', rewards: { '1': 5, '-1': 3, '0': 0 } }] });
    expect(readFileSync(join(out, 'results/rates.svg'), 'utf8')).toContain('adapted at session 4');
    expect(readFileSync(join(out, 'results/rewards.svg'), 'utf8')).toContain('reward +1');
  });
});
