import { mkdtempSync, readFileSync, mkdirSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ReefError } from '../runtime/errors.js';
import type { AgentRecord } from '../gateway/store/types.js';
import { TrainerController, type ControllerPorts, type ControllerState, type JudgedTurnRow, type StepResult } from './controller.js';

function rec(id: string, weightVersion: string | null = null): AgentRecord {
  return {
    id, offset: 1, scenario: 's', tags: {}, status: 'ok', startedAt: 0, finishedAt: 1,
    request: { messages: [{ role: 'user', content: 'hi' }], tools: null, params: {} }, topK: 1, finishReason: 'stop',
    usage: { promptTokens: 1, completionTokens: 1 }, weightVersion, engine: 'hf', latencyMs: 1, error: null, response: null,
    promptIds: Int32Array.from([1]), outputIds: Int32Array.from([2]), logprobs: Float32Array.from([-1]),
    topkIds: Int32Array.from([2]), topkLogprobs: Float32Array.from([-1]),
  };
}

/** In-memory world: a judged-turn log, records, a durable commit slot and a trainer that counts steps. */
function world(dir: string) {
  const log: JudgedTurnRow[] = [];
  const records = new Map<string, AgentRecord>();
  const durable = { offset: 0, state: null as ControllerState | null };
  const trained = new Map<string, StepResult>();
  const stepsRun: string[] = [];
  const published: string[] = [];
  let version = 0;
  let failNext = 0;
  let pushFails = 0;
  /** Trainer calls in order: `restart:<checkpoint|base>`, `load:<checkpoint>`, `step:<batch>`. */
  const calls: string[] = [];
  const ports: ControllerPorts = {
    readJudged: async (offset, limit) => log.filter((r) => r.offset >= offset).slice(0, limit),
    getRecord: async (id) => records.get(id) ?? null,
    commit: async (offset, state) => {
      durable.offset = offset;
      durable.state = JSON.parse(JSON.stringify(state));
    },
    renderTeacher: async () => Int32Array.from([9]),
    trainer: {
      restart: async (path) => void calls.push(`restart:${path === null ? 'base' : basename(path)}`),
      load: async (path) => void calls.push(`load:${basename(path)}`),
      step: async (batchId) => {
        calls.push(`step:${batchId}`);
        if (failNext > 0) {
          failNext--;
          throw new ReefError('REEF_ERR_SHIM', { reason: 'rank 1 died' }, { message: 'rank 1 died' });
        }
        const done = trained.get(batchId);
        if (done) return { ...done, trained: false };
        stepsRun.push(batchId);
        const weightVersion = `v${++version}`;
        const checkpointPath = join(dir, weightVersion);
        mkdirSync(checkpointPath, { recursive: true });
        const result = { batchId, weightVersion, checkpointPath, metrics: { loss: 0.5 }, stepMs: 1, trained: true };
        trained.set(batchId, result);
        return result;
      },
    },
    // Like the wiring with weight_sync: distributed: releases are pushed, rollbacks loaded from disk,
    // and a push that fails falls back to disk.
    publish: async (_path, v, kind) => {
      published.push(v);
      if (kind === 'rollback') return { sync: 'disk', fallback: null };
      if (pushFails > 0) {
        pushFails--;
        return { sync: 'disk', fallback: 'engine refused' };
      }
      return { sync: 'distributed', fallback: null };
    },
    correlation: async () => ({ bound: log.length }),
    log: () => {},
  };
  const add = (id: string, reward: number, decision: JudgedTurnRow['decision'] = 'anchor', wv: string | null = null) => {
    records.set(id, rec(id, wv));
    log.push({ offset: log.length + 1, scenario: 's', turnRecordId: id, decision, reward, hints: [], counters: [`eval:${reward}`] });
  };
  return { ports, log, add, durable, stepsRun, published, calls, failNext: (n: number) => (failNext = n), pushFails: (n: number) => (pushFails = n) };
}

const opts = (dir: string) => ({ batchSize: 2, maxStaleness: 1, recordFile: join(dir, 'prm.jsonl'), keepCheckpoints: 2, baseModelPath: join(dir, 'base'), maxAttempts: 3 });

describe('TrainerController', () => {
  it('batches judged turns, trains each batch once, releases it and writes one record line per batch', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    ['a', 'b', 'c', 'd', 'e'].forEach((id, i) => w.add(id, i % 2 ? -1 : 1));
    w.add('x', 0, 'dropped');
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1', 's:openclawrl:2']);
    expect(w.published).toEqual(['v1', 'v2']);
    expect(c.releases.map((r) => [r.weightVersion, r.parent, r.batchIds])).toEqual([['v1', null, ['s:openclawrl:1']], ['v2', 'v1', ['s:openclawrl:2']]]);
    const lines = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.batch_id, l.samples, l.rewards])).toEqual([['s:openclawrl:1', 2, { '1': 1, '-1': 1, '0': 0 }], ['s:openclawrl:2', 2, { '1': 1, '-1': 1, '0': 0 }]]);
    expect(w.durable.offset).toBe(7);
  });

  it('after a crash between a step and its commit, retrains nothing and releases the batch once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('b', 1);
    const c1 = new TrainerController(w.ports, opts(dir), 0, null);
    // Crash: the publish after the step throws, so the release is never committed.
    const publish = w.ports.publish;
    w.ports.publish = async () => {
      throw new Error('controller killed');
    };
    await expect(c1.tick()).rejects.toThrow('controller killed');
    w.ports.publish = publish;
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
    // The new controller starts the group afresh; the batch comes back from the trainer's ledger,
    // untrained by this group, so its checkpoint is loaded before it is published.
    expect(w.calls).toEqual(['restart:base', 'step:s:openclawrl:1', 'restart:base', 'step:s:openclawrl:1', 'load:v1']);
    expect(c2.releases.map((r) => r.batchIds[0])).toEqual(['s:openclawrl:1']);
    expect(readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n')).toHaveLength(1);
  });

  it('a restarted controller starts the trainer group from the last release, not from the base model', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    ['a', 'b', 'c', 'd'].forEach((id) => w.add(id, 1));
    const c1 = new TrainerController(w.ports, opts(dir), 0, null);
    await c1.tick();
    expect(c1.releases.map((r) => r.weightVersion)).toEqual(['v1', 'v2']);
    ['e', 'f'].forEach((id) => w.add(id, 1, 'anchor', 'v2'));
    w.calls.length = 0;
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.calls).toEqual(['restart:v2', 'step:s:openclawrl:3']);
    expect(c2.releases.at(-1)!.parent).toBe('v2');
  });

  it('restarts the trainer and retries the same batch when a rank dies', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('b', -1);
    w.failNext(2);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
    expect(c.counters.trainer_restarts).toBe(2);
  });

  it('drops turns generated more than max_staleness releases back', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(c.currentVersion).toBe('v2');
    w.add('old', 1, 'anchor', null);
    w.add('new', 1, 'anchor', 'v2');
    await c.tick();
    expect(c.counters.stale).toBe(1);
  });

  it('rolls back to the previous release and to the base model', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    mkdirSync(join(dir, 'base'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    const back = await c.rollback(null);
    expect([back.weightVersion, back.rollbackOf, back.parent, back.sync]).toEqual(['v1', 'release-1', 'v2', 'disk']);
    expect(w.published.at(-1)).toBe('v1');
    const base = await c.rollback('base');
    expect(base.weightVersion).toBe('base');
    await expect(c.rollback('release-99')).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
  });

  it('records which weight sync each release used and counts the fallbacks to disk', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd', 'e', 'f']) w.add(id, 1);
    w.pushFails(1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(c.releases.map((r) => [r.weightVersion, r.sync])).toEqual([['v1', 'disk'], ['v2', 'distributed'], ['v3', 'distributed']]);
    expect(c.counters).toMatchObject({ weight_sync_disk: 1, weight_sync_distributed: 2, weight_sync_fallbacks: 1 });
    expect(w.durable.state!.releases.map((r) => r.sync)).toEqual(['disk', 'distributed', 'distributed']);
  });

  it('keeps only the newest checkpoints on disk', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (let i = 0; i < 8; i++) w.add(`r${i}`, 1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(c.releases.map((r) => existsSync(r.checkpointPath))).toEqual([false, false, true, true]);
  });
});
