import { mkdirSync } from 'node:fs';
import { basename, join } from 'node:path';
import { ReefError } from '../runtime/errors.js';
import type { AgentRecord } from '../gateway/store/types.js';
import type { ControllerPorts, ControllerState, JudgedTurnRow, Release, StepResult } from './controller.js';
import { releaseKey, releaseNumber } from './releases.js';

/** The trainer-controller tests' world: fakes of the judged-turn log, the store, the trainer and the engine. */

export function rec(id: string, weightVersion: string | null = null): AgentRecord {
  return {
    id, offset: 1, scenario: 's', keyId: null, tags: {}, status: 'ok', startedAt: 0, finishedAt: 1,
    request: { messages: [{ role: 'user', content: 'hi' }], tools: null, params: {} }, topK: 1, finishReason: 'stop',
    usage: { promptTokens: 1, completionTokens: 1 }, weightVersion, engine: 'hf', latencyMs: 1, error: null, response: null,
    promptIds: Int32Array.from([1]), outputIds: Int32Array.from([2]), logprobs: Float32Array.from([-1]),
    topkIds: Int32Array.from([2]), topkLogprobs: Float32Array.from([-1]),
  };
}

/** In-memory world: a judged-turn log, records, a durable commit slot and a trainer that counts steps. */
export function world(dir: string) {
  const log: JudgedTurnRow[] = [];
  const records = new Map<string, AgentRecord>();
  const durable = { offset: 0, state: null as ControllerState | null, rows: new Map<string, unknown>() };
  const trained = new Map<string, StepResult & { from: string }>();
  /** Each trained version's parent: the trainer's ledger answers a batch whose weights the group holds or descends from. */
  const parentOf = new Map<string, string>();
  const descends = (v: string, from: string): boolean => {
    for (let at: string | undefined = v; at !== undefined; at = parentOf.get(at)) if (at === from) return true;
    return false;
  };
  const stepsRun: string[] = [];
  /** `batch@weights`: the weights the group held when it really trained each batch. */
  const trainedOn: string[] = [];
  const published: string[] = [];
  const publishedKinds: string[] = [];
  /** What the rollout engine serves: the last weights published into it (`default` when started from the base). */
  let served: string | null = 'default';
  let engineDown = false;
  let version = 0;
  let failNext = 0;
  let pushFails = 0;
  let restartFails = 0;
  let loadFails = 0;
  /** What the group holds, as `restart:`/`load:` name it; `base` after a bare start. */
  let holds = 'base';
  /** A rank died: every call but a restart fails, as the shim answers after a dead rank. */
  let broken = false;
  const failing = new Map<string, () => Error>();
  const held = new Map<string, { entered: () => void; release: Promise<void> }>();
  /** Trainer calls in order: `restart:<checkpoint|base>`, `load:<checkpoint>`, `step:<batch>`. */
  const calls: string[] = [];
  const rankDied = () => new ReefError('REEF_ERR_TRAINER_RANK', { rank: 1, reason: 'died' });
  const ports: ControllerPorts = {
    readJudged: async (offset, limit) => log.filter((r) => r.offset >= offset).slice(0, limit),
    getRecord: async (id) => records.get(id) ?? null,
    commit: async (offset, state, rows) => {
      durable.offset = offset;
      durable.state = JSON.parse(JSON.stringify(state));
      for (const [k, v] of rows.put) durable.rows.set(k, JSON.parse(JSON.stringify(v)));
      for (const k of rows.delete) durable.rows.delete(k);
    },
    getRelease: async (id) => {
      const n = releaseNumber(id);
      return n === null ? null : ((durable.rows.get(releaseKey(n)) as Release | undefined) ?? null);
    },
    renderTeacher: async () => Int32Array.from([9]),
    trainer: {
      // Like the wiring: trainer-start (base weights), then trainer-load of the checkpoint, which may fail.
      restart: async (path) => {
        calls.push(`restart:${path === null ? 'base' : basename(path)}`);
        holds = 'base';
        broken = false;
        if (restartFails > 0) {
          restartFails--;
          throw rankDied();
        }
        if (path !== null) holds = basename(path);
      },
      load: async (path) => {
        calls.push(`load:${basename(path)}`);
        if (broken) throw rankDied();
        if (loadFails > 0) {
          loadFails--;
          throw rankDied();
        }
        holds = basename(path);
      },
      step: async (batchId) => {
        calls.push(`step:${batchId}`);
        if (failNext > 0) {
          failNext--;
          throw new ReefError('REEF_ERR_SHIM', { reason: 'rank 1 died' }, { message: 'rank 1 died' });
        }
        const done = trained.get(batchId);
        if (done && (done.from === holds || descends(holds, done.weightVersion))) {
          const { from: _from, ...result } = done;
          return { ...result, trained: false };
        }
        if (broken) throw rankDied();
        const fail = failing.get(batchId);
        if (fail) throw fail();
        const h = held.get(batchId);
        if (h) {
          h.entered();
          await h.release;
        }
        stepsRun.push(batchId);
        trainedOn.push(`${batchId}@${holds}`);
        const weightVersion = `v${++version}`;
        parentOf.set(weightVersion, holds);
        const from = holds;
        holds = weightVersion;
        const checkpointPath = join(dir, weightVersion);
        mkdirSync(checkpointPath, { recursive: true });
        const result = { batchId, weightVersion, checkpointPath, metrics: { loss: 0.5 }, stepMs: 1, trained: true };
        trained.set(batchId, { ...result, from });
        return result;
      },
    },
    // Like the wiring with weight_sync: distributed: releases are pushed, rollbacks loaded from disk,
    // and a push that fails falls back to disk.
    publish: async (_path, v, kind) => {
      published.push(v);
      publishedKinds.push(kind);
      served = v;
      if (kind !== 'release') return { sync: 'disk', fallback: null };
      if (pushFails > 0) {
        pushFails--;
        return { sync: 'disk', fallback: 'engine refused' };
      }
      return { sync: 'distributed', fallback: null };
    },
    servedVersion: async () => {
      if (engineDown) throw new Error('connect ECONNREFUSED');
      return served;
    },
    correlation: async () => ({ bound: log.length }),
    log: () => {},
  };
  const add = (id: string, reward: number, decision: JudgedTurnRow['decision'] = 'anchor', wv: string | null = null) => {
    records.set(id, rec(id, wv));
    log.push({ offset: log.length + 1, scenario: 's', turnRecordId: id, decision, reward, hints: [], counters: [`eval:${reward}`] });
  };
  /** Holds `batchId`'s step inside the trainer until `release()`; `entered` resolves once it is there. */
  const hold = (batchId: string) => {
    let entered!: () => void;
    let release!: () => void;
    const inside = new Promise<void>((r) => (entered = r));
    held.set(batchId, { entered, release: new Promise<void>((r) => (release = r)) });
    return { entered: inside, release };
  };
  return {
    ports, log, records, add, durable, stepsRun, trainedOn, published, calls, hold,
    get holds() {
      return holds;
    },
    publishedKinds,
    /** The engine restarts from the layout, with the base weights. */
    restartEngine: () => (served = 'default'),
    setEngineDown: (down: boolean) => (engineDown = down),
    setServed: (v: string | null) => (served = v),
    failNext: (n: number) => (failNext = n),
    pushFails: (n: number) => (pushFails = n),
    restartFails: (n: number) => (restartFails = n),
    loadFails: (n: number) => (loadFails = n),
    breakGroup: () => (broken = true),
    /** Every step of `batchId` fails with `err()` (the trainer's ledger still answers one it has). */
    failBatch: (batchId: string, err: () => Error) => failing.set(batchId, err),
  };
}

export const opts = (dir: string) => ({ batchSize: 2, maxStaleness: 1, recordFile: join(dir, 'prm.jsonl'), keepCheckpoints: 2, baseModelPath: join(dir, 'base'), maxAttempts: 3, engineCheckMs: 0 });
