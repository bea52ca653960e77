import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { saveHomework } from './agent.js';
import { curveTable, readPrmRecords, rewardsPlot, summarize, writeReport, type SessionResult } from './report.js';
import { escapeXml } from './svg.js';

const dir = mkdtempSync(join(tmpdir(), 'reef-report-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function session(index: number, passed: boolean, bold = !passed, list = false): SessionResult {
  return { index, problem_id: `p${index}`, family: 'f', gold: 1, passed, bold, list, header: false, habit: bold || list, answered: true, violations: bold ? ['bold'] : [], steps: 2, has_answer: true, turns: 3, ended: 'done', saved: true, first_reply: 'x', tag: `hw-s${index}`, record_ids: [], error: null, wall_s: 1 };
}

/** Every opened tag is closed and attributes are quoted: enough to catch broken markup. */
function wellFormed(svg: string): boolean {
  const stack: string[] = [];
  for (const m of svg.matchAll(/<(\/?)([a-z]+)((?:\s+[a-zA-Z0-9:-]+="[^"<]*")*)\s*(\/?)>/g)) {
    if (m[4]) continue;
    if (m[1]) {
      if (stack.pop() !== m[2]) return false;
    } else stack.push(m[2]!);
  }
  return stack.length === 0 && svg.replace(/<[^>]*>/g, '').indexOf('<') < 0;
}

describe('prm record file', () => {
  it('reads batch lines in either spelling and skips what it cannot read', () => {
    const f = join(dir, 'prm.jsonl');
    writeFileSync(f, [
      JSON.stringify({ batch: 'hw:openclawrl:1', rewards: { '1': 10, '-1': 5, '0': 1 }, judge: { dropped: 2 } }),
      JSON.stringify({ batch_id: 'hw:openclawrl:2', reward_split: { '1': 12, '-1': 4 } }),
      // Reef's own line: the number as `batch`, the id as `batch_id` (regression: such lines were skipped).
      JSON.stringify({ batch: 3, batch_id: 'hw:openclawrl:3', scenario: 'hw', samples: 4, rewards: { '1': 3, '-1': 1, '0': 0 } }),
      '{"batch": "hw:openclawrl:4", "rewa',
      JSON.stringify({ unrelated: true }),
      '',
    ].join('\n'));
    expect(readPrmRecords(f)).toEqual([
      { batch: 'hw:openclawrl:1', rewards: { '1': 10, '-1': 5, '0': 1 } },
      { batch: 'hw:openclawrl:2', rewards: { '1': 12, '-1': 4, '0': 0 } },
      { batch: 'hw:openclawrl:3', rewards: { '1': 3, '-1': 1, '0': 0 } },
    ]);
    expect(readPrmRecords(join(dir, 'none.jsonl'))).toEqual([]);
  });

  it('counts only the last run of a file that several runs wrote to', () => {
    const f = join(dir, 'runs.jsonl');
    const line = (run: string, n: number, plus: number) => JSON.stringify({ batch: n, batch_id: `hw:openclawrl:${n}`, run, rewards: { '1': plus, '-1': 0, '0': 0 } });
    writeFileSync(f, [line('r1', 1, 5), line('r1', 2, 6), line('r2', 1, 7), ''].join('\n'));
    expect(readPrmRecords(f)).toEqual([{ batch: 'hw:openclawrl:1', rewards: { '1': 7, '-1': 0, '0': 0 } }]);
  });
});

describe('summary and plots', () => {
  const results = [1, 2, 3, 4, 5, 6].map((i) => session(i, i >= 3, i < 3, i === 1));

  it('counts, rolls and finds the adaptation session', () => {
    const s = summarize(results, { wallTimeS: 12.34, batches: null, dir });
    expect(s).toMatchObject({ sessions: 6, passed: 4, bold: 2, list: 1, sessions_to_adaptation: 3, wall_time_s: 12.3, ended: { done: 6 }, rolling_window: 10 });
    expect(s.rolling_start).toEqual(s.rolling[5]);
    expect(s.rolling_end).toEqual({ session: 6, pass: 4 / 6, habit: 2 / 6, bold: 2 / 6, list: 1 / 6 });
    expect(curveTable(s, 2).split('\n')).toEqual(['session  pass  habit  bold  list', '      2    0%   100%  100%   50%', '      4   50%    50%   50%   25%', '      6   67%    33%   33%   17%']);
  });

  it('writes summary.json and well-formed SVGs', () => {
    const prm = join(dir, 'prm2.jsonl');
    writeFileSync(prm, `${JSON.stringify({ batch: 'hw:openclawrl:1', rewards: { '1': 3, '-1': 1, '0': 0 } })}\n`);
    const s = writeReport(join(dir, 'out'), results, { wallTimeS: 1, prmRecordFile: prm });
    expect(JSON.parse(readFileSync(s.files.summary, 'utf8'))).toMatchObject({ sessions: 6, batches: [{ batch: 'hw:openclawrl:1' }] });
    const rates = readFileSync(s.files.rates_plot, 'utf8');
    expect(wellFormed(rates)).toBe(true);
    expect(rates).toContain('adapted at session 3');
    expect(rates.match(/<polyline/g)).toHaveLength(4);
    const rewards = readFileSync(s.files.rewards_plot, 'utf8');
    expect(wellFormed(rewards)).toBe(true);
    expect(rewards.match(/<rect x=/g)!.length).toBeGreaterThanOrEqual(2);
  });

  it('draws an empty reward chart with a note, and escapes text', () => {
    const svg = rewardsPlot([]);
    expect(wellFormed(svg)).toBe(true);
    expect(svg).toContain('no batches recorded');
    expect(escapeXml('a<b & "c"')).toBe('a&lt;b &amp; &quot;c&quot;');
  });
});

describe('save_homework', () => {
  it('writes the content and reports it', () => {
    const r = saveHomework(dir, 's001.txt', JSON.stringify({ content: 'My homework' }));
    expect(r.ok).toBe(true);
    expect(readFileSync(r.path!, 'utf8')).toBe('My homework');
  });

  it.each(['not json', '{}', '{"content": ""}', '{"content": 5}'])('refuses %s without throwing', (args) => {
    const r = saveHomework(dir, 'bad.txt', args);
    expect(r).toMatchObject({ ok: false, path: null });
    expect(r.result).toMatch(/^error:/);
    expect(existsSync(join(dir, 'homework', 'bad.txt'))).toBe(false);
  });
});
