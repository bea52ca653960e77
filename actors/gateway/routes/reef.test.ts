import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { ERRORS, type ErrorCode } from '../../runtime/errors.js';
import { ConcurrencyLimiter, type Principal } from '../auth.js';
import { sampleRecord } from '../store/fixtures.js';
import { logprobFromJson } from '../store/json-numbers.js';
import type { AgentRecord, RecordStore } from '../store/types.js';
import { checkReport, MAX_REFERENCES, recordJson, registerReefRoutes } from './reef.js';

describe('checkReport', () => {
  it('takes up to MAX_REFERENCES distinct references, finds a duplicate anywhere among them, and refuses more', () => {
    const references = Array.from({ length: MAX_REFERENCES }, (_, i) => `01M8NV70M0MR8ZXYQMS9${String(i).padStart(6, '0')}`);
    expect(checkReport({ score: 1, references })).toBeNull();
    const twice = [...references.slice(0, -1), references[1_234]!];
    expect(checkReport({ score: 1, references: twice })).toEqual(['references', `reference ${references[1_234]} appears twice`]);
    // Each reference is a lookup inside the report's write transaction: a body of millions held
    // the store's write lock (and the event loop) for seconds.
    expect(checkReport({ score: 1, references: [...references, '01M8NV70M0MR8ZXYQMS9ZZZZZZ'] })).toEqual(['references', `references may name at most ${MAX_REFERENCES} receipts, got ${MAX_REFERENCES + 1}`]);
  });
});

describe('recordJson', () => {
  it('keeps a token without a logprob (NaN) apart from a masked candidate (-Infinity), as reef export does; JSON wrote both as null', () => {
    const record = {
      ...sampleRecord(1, { outputTokens: 2, topK: 2 }), id: '01ARZ3NDEKTSV4RRFFQ69G5FAV', offset: 1,
      logprobs: Float32Array.from([Number.NaN, -0.5]),
      topkLogprobs: Float32Array.from([-0.25, Number.NEGATIVE_INFINITY, Number.NaN, -1]),
    } as AgentRecord;
    const body = JSON.parse(JSON.stringify(recordJson(record, null))) as { logprobs: unknown[]; topk: { logprobs: unknown[] }[] };
    expect(body.logprobs.map(logprobFromJson)).toEqual([Number.NaN, -0.5]);
    expect(body.topk.flatMap((row) => row.logprobs.map(logprobFromJson))).toEqual([-0.25, Number.NEGATIVE_INFINITY, Number.NaN, -1]);
  });
});

describe('POST /reef/scenarios/{s}/releases/rollback', () => {
  const open: Principal = { id: 'open', scenarios: null, limiter: new ConcurrencyLimiter(8) };
  async function app() {
    const asked: Array<string | null> = [];
    const keys: string[] = [];
    const a = Fastify();
    registerReefRoutes(a, {
      store: {} as RecordStore,
      defaultScenario: 'default',
      status: () => ({}),
      // What index.ts does with the body.
      rollback: async (_s, body, keyId) => {
        keys.push(keyId);
        const id = body && typeof body === 'object' && 'release_id' in body ? (body as { release_id: string | null }).release_id : null;
        asked.push(id);
        return { id: 'rollback-1', rollbackOf: id };
      },
    }, () => open);
    await a.ready();
    return { a, asked, keys };
  }

  it('refuses a body it does not understand instead of rolling back to the previous release (every scenario\'s weights)', async () => {
    const { a, asked, keys } = await app();
    for (const payload of [{ releaseId: 'r3' }, { release: 'r3' }, { release_id: 'r3', force: true }, { release_id: 3 }, ['r3'], 'r3']) {
      const res = await a.inject({ method: 'POST', url: '/reef/scenarios/default/releases/rollback', payload: JSON.stringify(payload), headers: { 'content-type': 'application/json' } });
      expect(res.statusCode, JSON.stringify(payload)).toBe(400);
      expect(res.json().error.code).toBe('REEF_ERR_INVALID_ARGUMENT');
    }
    expect(asked).toEqual([]);
    for (const payload of [{ release_id: 'r3' }, { release_id: 'base' }, { release_id: null }, {}]) {
      const res = await a.inject({ method: 'POST', url: '/reef/scenarios/default/releases/rollback', payload: JSON.stringify(payload), headers: { 'content-type': 'application/json' } });
      expect(res.statusCode, JSON.stringify(payload)).toBe(200);
    }
    // The route alone reads no body as "the previous release"; the gateway's server answers such a
    // request 415 before it gets here (browser-guard.test.ts).
    expect((await a.inject({ method: 'POST', url: '/reef/scenarios/default/releases/rollback' })).statusCode).toBe(200);
    expect(asked).toEqual(['r3', 'base', null, null, null]);
    // Who asked goes with it, for the gateway's log.
    expect(keys).toEqual(Array(5).fill('open'));
    await a.close();
  });
});

describe('POST /reef/scenarios/{s}/releases/rollback without training', () => {
  it('is a 409 whose code and type say conflict, not a retryable service_unavailable that no retry will change', async () => {
    const a = Fastify();
    registerReefRoutes(a, { store: {} as RecordStore, defaultScenario: 'default', status: () => ({}) }, () => ({ id: 'open', scenarios: null, limiter: new ConcurrencyLimiter(8) }));
    const res = await a.inject({ method: 'POST', url: '/reef/scenarios/default/releases/rollback', payload: '{}', headers: { 'content-type': 'application/json' } });
    expect(res.statusCode).toBe(409);
    expect(res.headers['retry-after']).toBeUndefined();
    const { code, type } = res.json().error;
    expect([code, type]).toEqual(['REEF_ERR_CONFLICT', 'conflict_error']);
    expect(ERRORS[code as ErrorCode].retryable).toBe(false);
    await a.close();
  });
});
