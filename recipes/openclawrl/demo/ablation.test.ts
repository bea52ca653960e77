import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ablationOptions, ARM_FLAGS, armRow, runAblation, tableMarkdown, targetLines } from './ablation.js';
import { armOptions, doublesOf, type Arm, type ArmSummary } from './experiment.js';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import { sampleRecord } from '../../../actors/gateway/store/fixtures.js';

const dir = mkdtempSync(join(tmpdir(), 'reef-ablation-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A finished arm's summary, as runArm writes it, for the options `argv` gives. */
function summaryFor(arm: Arm, seed: number, habit: [number, number], answer: [number, number], adapted: number | null, argv: string[] = []): ArmSummary {
  const o = armOptions([...argv, ...ARM_FLAGS[arm], '--seed', String(seed)], () => {});
  const side = (h: number, a: number) => ({ habit_rate: h, habit_ci95: [0, 1], answer_rate: a, mean_tokens: 150, distinct_2: 0.5, greedy_accuracy: 0.1 });
  return {
    model: 'SmolLM2-135M-Instruct', model_dir: o.modelDir, arm, seed, w_rl: o.wRl, w_opd: o.wOpd, training_enabled: !o.control, lr: o.lr, batch_size: o.batchSize, sessions: o.sessions,
    training_options: [`--openclawrl-w-rl=${o.wRl}`, `--openclawrl-w-opd=${o.wOpd}`, `--lr=${o.lr}`, ...o.trainOptions],
    doubles: doublesOf({ kind: 'rule' }),
    heldout: { n: 100, problems: 'p', temperature: 0.7, max_tokens: o.maxTokens, before: side(habit[0], answer[0]), after: side(habit[1], answer[1]), habit_p_value: 0.5, exact_match_kept: { base_correct: 10, still_correct: 8, rate: 0.8 }, kl_to_base: { tokens: 100, mean_kl: arm === 'control' ? 0 : 0.02, max_kl: 1, reference: 'r' } },
    sessions_to_adaptation: adapted, pass_definition: 'no habit, an answer',
    session_results: { passed: 10, habit: 5, bold: 0, list: 1, ended: {}, rolling: [1, 2, 3].map((session) => ({ session, pass: 0.5, habit: arm === 'control' ? 0.3 : 0.3 / session, bold: 0, list: 0 })) },
    training: { batches: 10, releases: arm === 'control' ? 0 : 10, counters: {}, steps: [] }, wall_time_s: 1200, timings_s: {},
  };
}

describe('ablation options', () => {
  it('defaults to the four arms over seeds 1, 2 and 3, passing every other flag to each arm', () => {
    const o = ablationOptions(['--sessions', '24', '--lr=1e-5'], () => {});
    expect(o.seeds).toEqual([1, 2, 3]);
    expect(o.arms).toEqual(['control', 'rl', 'opd', 'both']);
    expect(o.shared).toEqual(['--sessions', '24', '--lr=1e-5']);
  });

  it.each([
    [['--seeds', '1,1'], /--seeds: expected distinct non-negative integers/],
    [['--arms', 'both,sft'], /--arms: sft not among control, rl, opd, both/],
    [['--seed', '4'], /--seed is set per arm by the table; use --seeds and --arms/],
    [['--sessions', 'many'], /--sessions: expected a non-negative number, got many/],
  ])('%j is refused: %s', (argv, message) => {
    expect(() => ablationOptions(argv, () => {})).toThrow(message);
  });
});

describe('the table', () => {
  const runs = {
    control: [summaryFor('control', 1, [0.2, 0.22], [0.8, 0.8], null), summaryFor('control', 2, [0.2, 0.2], [0.8, 0.79], null)],
    both: [summaryFor('both', 1, [0.2, 0.05], [0.8, 0.78], 12), summaryFor('both', 2, [0.2, 0.07], [0.8, 0.77], 25)],
  };

  it('pools the replies of every seed and means the per-seed figures', () => {
    const r = armRow('both', runs.both);
    expect(r.pooled_before).toMatchObject({ k: 40, n: 200 });
    expect(r.pooled_after).toMatchObject({ k: 12, n: 200 });
    expect(r.relative_fall).toBeCloseTo(0.7);
    expect(r.pooled_p).toBeLessThan(0.001);
    expect(r.habit_after?.mean).toBeCloseTo(0.06);
    expect(r.habit_after?.sd).toBeCloseTo(Math.sqrt(2 * 0.01 ** 2));
    expect(r.exact_kept).toEqual({ base_correct: 20, still_correct: 16, rate: 0.8 });
    expect(r.sessions_to_adaptation).toEqual([12, 25]);
  });

  it('reads the targets off the table as they came out, met or not', () => {
    const rows = [armRow('control', runs.control), armRow('both', runs.both)];
    const t = targetLines(rows);
    expect(t).toContain('both terms: held-out habit rate falls by at least half, relative: 70.0% → met');
    expect(t.find((l) => l.startsWith('both terms: answer rate'))).toMatch(/^both terms: answer rate falls by at most 5 points: \S+ → \S+, falls 2\.5 points → met$/);
    expect(t).toContain('both terms: sessions to adaptation ≤ 20: 12, 25 → not met in every seed');
    expect(t.find((l) => l.startsWith('control:'))).toMatch(/→ met$/);
    const md = tableMarkdown(rows, runs.both[0]!.doubles, 'SmolLM2-135M-Instruct');
    expect(md).toContain('Judge: rule-following PRM double');
    expect(md).toContain('Student: scripted student');
    expect(md.split('\n').filter((l) => l.startsWith('| both |'))).toHaveLength(1);
  });

  it('keeps finished arms whose settings match, so an interrupted table goes on without running them again', async () => {
    const out = join(dir, 'kept');
    const argv = ['--sessions', '24'];
    for (const seed of [1, 2]) {
      for (const arm of ['control', 'both'] as const) {
        const d = join(out, `${arm}-seed${seed}`);
        mkdirSync(d, { recursive: true });
        writeFileSync(join(d, 'summary.json'), JSON.stringify(summaryFor(arm, seed, [0.2, arm === 'both' ? 0.05 : 0.2], [0.8, 0.8], 10, argv)));
      }
    }
    const lines: string[] = [];
    const { rows } = await runAblation({ ...ablationOptions(['--seeds', '1,2', '--arms', 'control,both', '--out', out, ...argv], (l) => lines.push(l)) });
    expect(lines.filter((l) => /: kept from /.test(l))).toHaveLength(4);
    expect(rows.map((r) => r.arm)).toEqual(['control', 'both']);
    for (const f of ['table.md', 'table.json', 'habit-curves.svg', 'pass-curves.svg']) expect(existsSync(join(out, f))).toBe(true);
    expect(readFileSync(join(out, 'habit-curves.svg'), 'utf8').match(/<polyline/g)).toHaveLength(2);
  });

  it('with --kept, tables the finished arms with the seeds each has and runs nothing', async () => {
    const out = join(dir, 'kept-only');
    const argv = ['--sessions', '24'];
    for (const [arm, seed] of [['control', 1], ['both', 1], ['both', 2]] as const) {
      const d = join(out, `${arm}-seed${seed}`);
      mkdirSync(d, { recursive: true });
      writeFileSync(join(d, 'summary.json'), JSON.stringify(summaryFor(arm, seed, [0.2, arm === 'both' ? 0.05 : 0.2], [0.8, 0.8], 10, argv)));
    }
    const lines: string[] = [];
    const { rows } = await runAblation(ablationOptions(['--kept', '--seeds', '1,2', '--arms', 'control,both', '--out', out, ...argv], (l) => lines.push(l)));
    expect(lines).toContain('[3/4] control, seed 2: not run (--kept), left out of the table');
    expect(rows.map((r) => [r.arm, r.seeds])).toEqual([['control', [1]], ['both', [1, 2]]]);
    expect(() => ablationOptions(['--kept', '--fresh'], () => {})).toThrow(/give one of them/);
  });

  it("counts the judge's hints of a kept arm from its store when its summary predates them", async () => {
    const out = join(dir, 'kept-hints');
    const argv = ['--sessions', '24'];
    const d = join(out, 'both-seed1');
    mkdirSync(join(d, 'data'), { recursive: true });
    writeFileSync(join(d, 'summary.json'), JSON.stringify(summaryFor('both', 1, [0.2, 0.05], [0.8, 0.8], 10, argv)));
    const store = SqliteStore.open(join(d, 'data', 'records.sqlite'));
    const r = await store.append({ ...sampleRecord(1), scenario: 'homework' });
    await store.appendJudgedTurn({ turnRecordId: r.id, nextStateRecordId: 'next', scenario: 'homework', sessionKey: 's', decision: 'hint', reward: -1, teacherCandidates: ['End with the answer.'], judgment: {} });
    await store.close();
    const lines: string[] = [];
    await runAblation({ ...ablationOptions(['--seeds', '1', '--arms', 'both', '--out', out, ...argv], (l) => lines.push(l)) });
    expect(lines.filter((l) => /: kept from /.test(l))).toHaveLength(1);
    const kept = JSON.parse(readFileSync(join(d, 'summary.json'), 'utf8')) as ArmSummary;
    expect(kept.training.hints).toEqual({ turns: { '-1/hint': 1 }, hints: [{ hint: 'End with the answer.', turns: 1 }] });
  });
});
