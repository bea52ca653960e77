import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import type { Task } from '../../recipes/openclawrl/record2task.js';
import { STD_EPS } from '../../recipes/openclawrl/steps.js';
import type { OutcomeReport } from '../../recipes/openclawrl/task2batch.js';
import { TrainerController } from './controller.js';
import { opts, rec, world } from './fixtures.js';

/**
 * Agent steps through the controller: grouped records wait for their episodes' outcome reports,
 * and the trainer gets each step with its (group, step) advantage as the task's reward.
 */
function agentWorld() {
  const dir = mkdtempSync(join(tmpdir(), 'tc-agent-'));
  const w = world(dir);
  const reports: OutcomeReport[] = [];
  const steps: Task[][] = [];
  const step = w.ports.trainer.step;
  w.ports.trainer.step = async (batchId, tasks) => {
    steps.push(tasks);
    return step(batchId, tasks);
  };
  // As the store pages them: after a cursor (a position), at most `limit`, `next` while more follow.
  w.ports.readReports = async (_scenario, after, limit) => {
    const from = after === null ? 0 : Number(after);
    const items = reports.slice(from, from + limit);
    return { items, next: from + limit < reports.length ? String(from + limit) : null };
  };
  /** Step `t` of an episode in group `g`, judged `process` (the t earlier steps are in its request). */
  const agentStep = (id: string, g: string, t: number, process: number, decision: 'anchor' | 'dropped' = 'anchor') => {
    const messages: unknown[] = [{ role: 'user', content: 'task' }];
    for (let i = 0; i < t; i++) messages.push({ role: 'assistant', content: null }, { role: 'tool', content: 'out' });
    w.records.set(id, { ...rec(id), tags: { group: g }, request: { messages, tools: null, params: {} } });
    w.log.push({ offset: w.log.length + 1, scenario: 's', turnRecordId: id, decision, reward: decision === 'dropped' ? 0 : process, hints: [], counters: [`eval:${process}`] });
  };
  return { dir, w, reports, steps, agentStep };
}

describe('trainer-controller: agent steps', () => {
  it('trains a complete group once, each step with its (group, step) advantage, across a restart', async () => {
    const { dir, w, reports, steps, agentStep } = agentWorld();
    const o = { ...opts(dir), batchSize: 4, steps: { outcomeCoef: 1, prmCoef: 1, discount: 1, groupSize: 2, groupTimeoutMs: 60_000 } };
    agentStep('a0', 'g', 0, 1);
    agentStep('b0', 'g', 0, 1);
    agentStep('a1', 'g', 1, 1);
    const c = new TrainerController(w.ports, o, 0, null);
    await c.tick();
    expect(steps).toEqual([]);
    reports.push({ id: 'repA', score: 1, references: ['a0', 'a1', 'a2'] }, { id: 'repB', score: -1, references: ['b0', 'b1', 'b2'] });
    await c.tick();
    // b1 is still with the judge: the group waits for it.
    expect(steps).toEqual([]);
    // A restart from what was committed: the reports are not applied twice, the group not lost.
    const c2 = new TrainerController(w.ports, o, w.durable.offset, w.durable.state);
    agentStep('b1', 'g', 1, -1);
    await c2.tick();
    expect(steps).toHaveLength(1);
    // r: a0 2, b0 0 (mean 1, std 1); a1 2, b1 -2 (mean 0, std 2).
    const got = Object.fromEntries(steps[0]!.map((t) => [t.taskId, t.reward]));
    expect(Object.keys(got).sort()).toEqual(['a0', 'a1', 'b0', 'b1']);
    expect(got.a0).toBeCloseTo(1 / (1 + STD_EPS), 12);
    expect(got.b0).toBeCloseTo(-1 / (1 + STD_EPS), 12);
    expect(got.a1).toBeCloseTo(2 / (2 + STD_EPS), 12);
    expect(got.b1).toBeCloseTo(-2 / (2 + STD_EPS), 12);
    const [line] = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { steps: { turn: string; outcome: number }[]; judged: Record<string, number> });
    expect(line!.steps.map((s) => [s.turn, s.outcome])).toEqual([['a0', 1], ['b0', -1], ['a1', 1], ['b1', -1]]);
    expect(line!.judged).toMatchObject({ groups_complete: 1, step_buckets: 2 });
    expect(c2.counters).toMatchObject({ reports: 2, step_batches: 1, groups_complete: 1, step_buckets: 2 });
    await c2.tick();
    expect(steps).toHaveLength(1);
  });

  it('trains an episode that never reports on its process reward once its group times out', async () => {
    const { dir, w, steps, agentStep } = agentWorld();
    let now = 1_000;
    const o = { ...opts(dir), batchSize: 2, now: () => now, steps: { outcomeCoef: 1, prmCoef: 1, discount: 1, groupSize: 2, groupTimeoutMs: 5_000 } };
    agentStep('a0', 'g', 0, 1);
    agentStep('b0', 'g', 0, -1);
    agentStep('x', 'g', 1, 0, 'dropped');
    const c = new TrainerController(w.ports, o, 0, null);
    await c.tick();
    now = 5_999;
    await c.tick();
    expect(steps).toEqual([]);
    now = 6_000;
    await c.tick();
    expect(steps.map((ts) => ts.map((t) => [t.taskId, Math.sign(t.reward)]))).toEqual([[['a0', 1], ['b0', -1]]]);
  });

  it('skips reports filed longer than the group timeout ago: none of their steps can still wait', async () => {
    const { dir, w, reports, agentStep } = agentWorld();
    const now = 100_000;
    const o = { ...opts(dir), now: () => now, steps: { outcomeCoef: 1, prmCoef: 1, discount: 1, groupSize: 2, groupTimeoutMs: 5_000 } };
    reports.push({ id: 'old', score: 1, references: ['o0', 'o1'], createdAt: now - 5_001 }, { id: 'new', score: 1, references: ['a0', 'a1'], createdAt: now - 10 });
    agentStep('a0', 'g', 0, 1);
    const c = new TrainerController(w.ports, o, 0, null);
    await c.tick();
    expect(c.counters).toMatchObject({ reports: 2, reports_too_old: 1 });
    expect(Object.keys(w.durable.state!.batcher.agent!.episodes)).toEqual(['new']);
  });

  it('trains chat turns without a group tag as before, beside agent steps', async () => {
    const { dir, w, steps, agentStep } = agentWorld();
    agentStep('a0', 'g', 0, 1);
    w.add('chat1', 1);
    w.add('chat2', -1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(steps.map((ts) => ts.map((t) => [t.taskId, t.reward]))).toEqual([[['chat1', 1], ['chat2', -1]]]);
  });
});
