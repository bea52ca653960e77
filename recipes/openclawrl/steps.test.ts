import { describe, expect, it } from 'vitest';
import { combinedReward, groupOf, normaliseGroup, STD_EPS, stepIndexOf } from './steps.js';
import { Batcher, recordLine, type BatcherState } from './task2batch.js';
import { DEFAULT_STEP_OPTIONS, type StepRewardOptions } from './steps.js';

const opts = (o: Partial<StepRewardOptions> = {}): StepRewardOptions => ({ ...DEFAULT_STEP_OPTIONS, groupSize: 2, groupTimeoutMs: 1000, ...o });

describe('combinedReward', () => {
  it('adds the outcome, discounted by the steps from the end, to c_prm times the process reward', () => {
    const o = { outcomeCoef: 1, prmCoef: 0.5, discount: 0.5 };
    expect(combinedReward(1, { score: 1, stepsFromEnd: 2 }, o)).toBe(0.25 + 0.5);
    expect(combinedReward(-1, { score: 1, stepsFromEnd: 0 }, o)).toBe(1 - 0.5);
    expect(combinedReward(1, { score: -1, stepsFromEnd: 1 }, { outcomeCoef: 2, prmCoef: 1, discount: 1 })).toBe(-2 + 1);
  });

  it('trains a step whose episode reported no outcome on its process reward alone', () => {
    expect(combinedReward(-1, null, { outcomeCoef: 1, prmCoef: 0.5, discount: 1 })).toBe(-0.5);
  });
});

describe('normaliseGroup', () => {
  it('standardises each step-index bucket with the population standard deviation', () => {
    const { advantages, stats } = normaliseGroup([
      { index: 0, reward: 0 },
      { index: 0, reward: 0 },
      { index: 0, reward: 3 },
      { index: 1, reward: 2 },
      { index: 1, reward: -2 },
    ]);
    const std0 = Math.sqrt(2); // mean 1, variance (1 + 1 + 4) / 3
    expect(advantages[0]).toBeCloseTo(-1 / (std0 + STD_EPS), 12);
    expect(advantages[2]).toBeCloseTo(2 / (std0 + STD_EPS), 12);
    expect(advantages[3]).toBeCloseTo(2 / (2 + STD_EPS), 12);
    expect(advantages[4]).toBeCloseTo(-2 / (2 + STD_EPS), 12);
    expect(stats).toEqual({ buckets: 2, allEqual: 0, stepsDropped: 0, singletons: 0 });
  });

  it('drops and counts a bucket whose rewards are all equal, and keeps a singleton bucket raw', () => {
    const { advantages, stats } = normaliseGroup([
      { index: 0, reward: 2 },
      { index: 0, reward: 2 },
      { index: 3, reward: -0.5 },
      { index: 1, reward: 1 },
      { index: 1, reward: -1 },
    ]);
    expect(advantages.slice(0, 3)).toEqual([null, null, -0.5]);
    expect(advantages[3]).toBeGreaterThan(0);
    expect(stats).toEqual({ buckets: 2, allEqual: 1, stepsDropped: 2, singletons: 1 });
  });

  it('refuses a reward that is not a finite number', () => {
    expect(() => normaliseGroup([{ index: 0, reward: NaN }])).toThrow(/step 0: reward NaN/);
  });
});

describe('step index and group', () => {
  it('counts the assistant messages the step answered after', () => {
    expect(stepIndexOf([{ role: 'system' }, { role: 'user' }])).toBe(0);
    expect(stepIndexOf([{ role: 'user' }, { role: 'assistant' }, { role: 'tool' }, { role: 'assistant' }, { role: 'tool' }])).toBe(2);
    expect(stepIndexOf([null, 'x', { role: 'assistant' }])).toBe(1);
  });

  it('reads the group tag, and no group from an empty one', () => {
    expect(groupOf({ group: 'task-7' })).toBe('task-7');
    expect(groupOf({ group: '  ' })).toBeNull();
    expect(groupOf({ session: 's' })).toBeNull();
  });
});

/**
 * Two parallel episodes of one task: A succeeds (+1), B fails (−1). Each made three model calls;
 * the first two were judged against their tool outputs, the third is the final answer.
 */
function twoEpisodes(b: Batcher, order: 'steps-first' | 'reports-first', roundTrip = (x: Batcher) => x): Batcher {
  const step = (x: Batcher, id: string, index: number, process: number) => x.addStep('s', 'g1', id, { process, index, hints: [] }, 0);
  const reports = (x: Batcher) => {
    x.report('s', { id: 'repA', score: 1, references: ['a0', 'a1', 'a2'] }, 0);
    x.report('s', { id: 'repB', score: -1, references: ['b0', 'b1', 'b2'] }, 0);
  };
  if (order === 'reports-first') reports(b);
  b = roundTrip(b);
  step(b, 'a0', 0, 1);
  step(b, 'b0', 0, 1);
  b = roundTrip(b);
  step(b, 'a1', 1, 1);
  step(b, 'b1', 1, -1);
  if (order === 'steps-first') reports(b);
  return roundTrip(b);
}

describe('Batcher: agent groups', () => {
  const advantages = (b: Batcher, now = 0) => b.flushGroups(now).flatMap((x) => x.tasks.map((t) => [t.turnRecordId, t.reward] as const));
  // r = outcome + process: a0 2, b0 0 (bucket 0: mean 1, std 1); a1 2, b1 -2 (bucket 1: mean 0, std 2).
  const expected = [['a0', 1 / (1 + STD_EPS)], ['b0', -1 / (1 + STD_EPS)], ['a1', 2 / (2 + STD_EPS)], ['b1', -2 / (2 + STD_EPS)]];

  it.each(['steps-first', 'reports-first'] as const)('batches a complete group with per-step advantages (%s)', (order) => {
    const b = twoEpisodes(new Batcher(4, null, opts()), order);
    const got = advantages(b);
    expect(got.map(([id]) => id)).toEqual(expected.map(([id]) => id));
    got.forEach(([, adv], i) => expect(adv).toBeCloseTo(expected[i]![1] as number, 12));
  });

  it('gives the same batches across a save and restore at every step', () => {
    const roundTrip = (x: Batcher) => new Batcher(4, JSON.parse(JSON.stringify(x.toJSON())) as BatcherState, opts());
    const once = advantages(twoEpisodes(new Batcher(4, null, opts()), 'reports-first'));
    expect(advantages(twoEpisodes(new Batcher(4, null, opts()), 'reports-first', roundTrip))).toEqual(once);
    expect(advantages(twoEpisodes(new Batcher(4, null, opts()), 'steps-first', roundTrip))).toEqual(once);
  });

  it('waits while a step a report names has not been read, and counts a turn read but not trained toward it', () => {
    const b = new Batcher(8, null, opts());
    b.report('s', { id: 'repA', score: 1, references: ['a0', 'a1', 'a2'] }, 0);
    b.report('s', { id: 'repB', score: 1, references: ['b0', 'b1', 'b2'] }, 0);
    b.addStep('s', 'g1', 'a0', { process: 1, index: 0, hints: [] }, 0);
    b.addStep('s', 'g1', 'a1', { process: -1, index: 1, hints: [] }, 0);
    b.addStep('s', 'g1', 'b0', { process: -1, index: 0, hints: [] }, 0);
    expect(b.flushGroups(10)).toEqual([]);
    // b1 was dropped by the judge: not trained, but read.
    b.addStep('s', 'g1', 'b1', null, 0);
    b.flushGroups(10);
    expect(b.waitingSteps('s')).toBe(0);
    // a0 2 and b0 0 in bucket 0; a1 0 alone in bucket 1.
    expect(b.pendingCount('s')).toBe(3);
  });

  it('drops and counts a bucket whose rewards are all equal, and keeps a singleton bucket raw', () => {
    const b = new Batcher(2, null, opts());
    b.addStep('s', 'g1', 'a0', { process: 1, index: 0, hints: ['h'] }, 0);
    b.addStep('s', 'g1', 'b0', { process: 1, index: 0, hints: [] }, 0);
    b.addStep('s', 'g1', 'a1', { process: -1, index: 1, hints: [] }, 0);
    b.report('s', { id: 'repA', score: 1, references: ['a0', 'a1', 'a2'] }, 0);
    b.report('s', { id: 'repB', score: 1, references: ['b0', 'b1'] }, 0);
    const [batch] = b.flushGroups(0);
    expect(batch).toBeUndefined();
    // a1 alone in its bucket: its raw reward 1 - 1 = 0 is its advantage; the all-equal bucket is gone.
    b.count('s', ['eval:1']);
    const next = b.add('s', { turnRecordId: 'chat', reward: 1, hints: [] })!;
    expect(next.tasks.map((t) => [t.turnRecordId, t.reward])).toEqual([['a1', 0], ['chat', 1]]);
    expect(next.judged).toMatchObject({ groups_complete: 1, step_buckets: 1, step_buckets_all_equal: 1, steps_all_equal_dropped: 2, step_buckets_singleton: 1, 'eval:1': 1 });
    expect(next.judged.steps_outcome_missing).toBeUndefined();
    const line = recordLine(next, {}) as { steps: unknown[] };
    expect(line.steps).toEqual([{ turn: 'a1', group: 'g1', index: 1, process: -1, outcome: 1, stepsFromEnd: 1, combined: 0, advantage: 0 }]);
  });

  it('batches a group whose episode never reports after the timeout, on the process reward alone; never before', () => {
    const b = new Batcher(3, null, opts({ prmCoef: 0.5 }));
    b.addStep('s', 'g1', 'a0', { process: 1, index: 0, hints: [] }, 100);
    b.addStep('s', 'g1', 'b0', { process: -1, index: 0, hints: [] }, 200);
    b.report('s', { id: 'repA', score: 1, references: ['a0', 'a1'] }, 300);
    expect(b.flushGroups(1099)).toEqual([]);
    expect(b.waitingSteps('s')).toBe(2);
    b.addStep('s', 'g1', 'c0', { process: -1, index: 0, hints: [] }, 1000);
    const [batch] = b.flushGroups(1100);
    // a0: 1 + 0.5 = 1.5; b0, c0: -0.5 each (no outcome). Mean 1/6.
    const rs = [1.5, -0.5, -0.5];
    const mean = rs.reduce((x, y) => x + y) / 3;
    const std = Math.sqrt(rs.reduce((x, r) => x + (r - mean) ** 2, 0) / 3);
    expect(batch!.tasks.map((t) => t.turnRecordId)).toEqual(['a0', 'b0', 'c0']);
    batch!.tasks.forEach((t, i) => expect(t.reward).toBeCloseTo((rs[i]! - mean) / (std + STD_EPS), 12));
    expect(batch!.tasks.map((t) => t.step!.outcome)).toEqual([1, null, null]);
    expect(batch!.judged).toMatchObject({ groups_timed_out: 1, steps_outcome_missing: 2 });
  });

  it('keeps groups of different tags and scenarios apart', () => {
    const b = new Batcher(8, null, opts({ groupSize: 1 }));
    b.addStep('s', 'g1', 'x0', { process: 1, index: 0, hints: [] }, 0);
    b.addStep('s', 'g2', 'y0', { process: -1, index: 0, hints: [] }, 0);
    b.addStep('t', 'g1', 'z0', { process: 1, index: 0, hints: [] }, 0);
    b.report('s', { id: 'r1', score: 1, references: ['x0', 'x1'] }, 0);
    b.flushGroups(0);
    expect([b.waitingSteps('s'), b.waitingSteps('t'), b.pendingCount('s')]).toEqual([1, 1, 1]);
    expect(b.reportCursors().map(([s]) => s).sort()).toEqual(['s', 't']);
  });

  it('forgets a report none of whose steps came within the timeout', () => {
    const b = new Batcher(8, null, opts());
    b.report('s', { id: 'r1', score: 1, references: ['q0', 'q1', 'q2'] }, 0);
    expect(Object.keys(b.toJSON().agent!.awaiting)).toEqual(['q0', 'q1']);
    b.flushGroups(1000);
    expect(b.toJSON().agent).toEqual({ groups: {}, awaiting: {}, episodes: {}, reports: {} });
  });

  it('reads a state saved before agent steps, and refuses a bad group size or outcome', () => {
    const old = { lastN: { s: 3 }, pending: { s: [{ turnRecordId: 'r1', reward: 1, hints: [] }] }, judged: {} };
    const b = new Batcher(2, old, opts());
    expect(b.flushGroups(0)).toEqual([]);
    expect(b.add('s', { turnRecordId: 'r2', reward: -1, hints: [] })!.batchId).toBe('s:openclawrl:4');
    expect(() => new Batcher(2, null, opts({ groupSize: 0 }))).toThrow(/group_size must be a positive integer/);
    expect(() => b.report('s', { id: 'r', score: Infinity, references: [] }, 0)).toThrow(/report r: outcome Infinity/);
  });
});
