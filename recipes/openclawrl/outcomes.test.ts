import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { TrainerController, type SavedControllerState } from '../../actors/trainer-controller/controller.js';
import { opts, world } from '../../actors/trainer-controller/fixtures.js';
import type { Task } from './record2task.js';
import { reportReader } from './outcomes.js';
import { STD_EPS } from './steps.js';

let dir: string | null = null;
afterEach(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = null;
});

describe('reportReader', () => {
  it('pages a scenario’s reports oldest first; a last page read again from its cursor holds the new ones after it', async () => {
    dir = mkdtempSync(join(tmpdir(), 'reef-outcomes-'));
    const store = SqliteStore.open(join(dir, 'r.db'));
    try {
      const ref = (await store.append(sampleRecord(1, { scenario: 'env' }))).id;
      const file = (score: number) => store.putReport({ scenario: 'env', score, feedback: null, references: [ref], metadata: null, clientId: null, keyId: null });
      const ids = [(await file(1)).report.id, (await file(-1)).report.id, (await file(1)).report.id];
      await store.putReport({ scenario: 'other', score: 1, feedback: null, references: [], metadata: null, clientId: null, keyId: null });
      const read = reportReader(store);
      const first = await read('env', null, 2);
      expect(first.items.map((r) => [r.id, r.score, r.references])).toEqual([[ids[0], 1, [ref]], [ids[1], -1, [ref]]]);
      expect(typeof first.items[0]!.createdAt).toBe('number');
      expect(first.next).not.toBeNull();
      const last = await read('env', first.next, 2);
      expect([last.items.map((r) => r.id), last.next]).toEqual([[ids[2]], null]);
      const later = (await file(1)).report.id;
      expect((await read('env', first.next, 2)).items.map((r) => r.id)).toEqual([ids[2], later]);
    } finally {
      await store.close();
    }
  });

  it('feeds the controller over a real store: two reported episodes of a group train once, with their (group, step) advantages', async () => {
    dir = mkdtempSync(join(tmpdir(), 'reef-outcomes-'));
    const store = SqliteStore.open(join(dir, 'r.db'));
    try {
      // Two rollouts of one task, each three model calls: the t-th call's request holds t assistant messages.
      const ids: Record<string, string> = {};
      let seed = 10;
      for (const ep of ['a', 'b']) {
        for (let t = 0; t < 3; t++) {
          const messages: unknown[] = [{ role: 'user', content: 'make notes.txt' }];
          for (let i = 0; i < t; i++) messages.push({ role: 'assistant', content: null }, { role: 'tool', content: 'ok' });
          const r = { ...sampleRecord(seed++, { scenario: 'env' }), tags: { group: 'task-1' }, weightVersion: null, request: { messages, tools: null, params: {} } };
          ids[`${ep}${t}`] = (await store.append(r)).id;
        }
      }
      // The judge's rows for the first two steps of each (the third is the final answer: no next state).
      const process: Record<string, number> = { a0: 1, a1: 1, b0: 1, b1: -1 };
      for (const k of ['a0', 'b0', 'a1', 'b1']) {
        await store.appendJudgedTurn({ turnRecordId: ids[k]!, nextStateRecordId: ids[k]!, scenario: 'env', sessionKey: k[0]!, decision: 'anchor', reward: process[k]!, teacherCandidates: [null], judgment: {} });
      }
      for (const [ep, score] of [['a', 1], ['b', -1]] as const) {
        await store.putReport({ scenario: 'env', score, feedback: null, references: [0, 1, 2].map((t) => ids[`${ep}${t}`]!), metadata: null, clientId: null, keyId: null });
      }
      const w = world(dir);
      const trained: Task[][] = [];
      const step = w.ports.trainer.step;
      const ports = {
        ...w.ports,
        readJudged: async (from: number, limit: number) =>
          (await store.readJudgedTurns(from, limit)).map((t) => ({ offset: t.offset, scenario: t.scenario, turnRecordId: t.turnRecordId, decision: t.decision, reward: t.reward, hints: [], counters: [] })),
        getRecord: (id: string) => store.get(id),
        commit: (next: number, s: unknown, rows: Parameters<typeof store.commitConsumer>[4]) => store.commitConsumer('tc', next, 'tc/state', s, rows),
        readReports: reportReader(store),
        trainer: { ...w.ports.trainer, step: async (batchId: string, tasks: Task[]) => (trained.push(tasks), step(batchId, tasks)) },
      };
      const o = { ...opts(dir), batchSize: 4, steps: { outcomeCoef: 1, prmCoef: 1, discount: 1, groupSize: 2, groupTimeoutMs: 600_000 } };
      // Only the first judged row: the group is not complete.
      const one = { ...ports, readJudged: (from: number) => ports.readJudged(from, 1) };
      await new TrainerController(one, o, 0, null).tick(1);
      expect(trained).toEqual([]);
      // A restart from the store's state, as the controller would come up after a crash.
      const resumed = new TrainerController(ports, o, await store.getOffset('tc'), (await store.getState('tc/state')) as SavedControllerState);
      await resumed.tick();
      expect(trained).toHaveLength(1);
      const got = Object.fromEntries(trained[0]!.map((t) => [t.taskId, t.reward]));
      expect(got[ids.a0!]).toBeCloseTo(1 / (1 + STD_EPS), 12);
      expect(got[ids.b0!]).toBeCloseTo(-1 / (1 + STD_EPS), 12);
      expect(got[ids.a1!]).toBeCloseTo(2 / (2 + STD_EPS), 12);
      expect(got[ids.b1!]).toBeCloseTo(-2 / (2 + STD_EPS), 12);
      await resumed.tick();
      expect(trained).toHaveLength(1);
      expect(resumed.counters).toMatchObject({ reports: 2, step_batches: 1 });
    } finally {
      await store.close();
    }
  });
});
