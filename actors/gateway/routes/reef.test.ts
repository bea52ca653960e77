import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { ERRORS, type ErrorCode } from '../../runtime/errors.js';
import { ConcurrencyLimiter, type Principal } from '../auth.js';
import type { RecordStore } from '../store/types.js';
import { checkReport, registerReefRoutes } from './reef.js';

describe('checkReport', () => {
  it('finds a duplicate reference in one pass (regression: a quadratic search held the event loop for seconds on a long list)', () => {
    const references = Array.from({ length: 50_000 }, (_, i) => `01M8NV70M0MR8ZXYQMS9${String(i).padStart(6, '0')}`);
    const t0 = performance.now();
    expect(checkReport({ score: 1, references })).toBeNull();
    // Quadratic, this took seconds; linear, a few milliseconds. The bound leaves room for a busy machine.
    expect(performance.now() - t0).toBeLessThan(1000);
    references.push(references[12_345]!);
    expect(checkReport({ score: 1, references })).toEqual(['references', `reference ${references[12_345]} appears twice`]);
  });
});

describe('POST /reef/scenarios/{s}/releases/rollback', () => {
  const open: Principal = { id: 'open', scenarios: null, limiter: new ConcurrencyLimiter(8) };
  async function app() {
    const asked: Array<string | null> = [];
    const a = Fastify();
    registerReefRoutes(a, {
      store: {} as RecordStore,
      defaultScenario: 'default',
      status: () => ({}),
      // What index.ts does with the body.
      rollback: async (_s, body) => {
        const id = body && typeof body === 'object' && 'release_id' in body ? (body as { release_id: string | null }).release_id : null;
        asked.push(id);
        return { id: 'rollback-1', rollbackOf: id };
      },
    }, () => open);
    await a.ready();
    return { a, asked };
  }

  it('refuses a body it does not understand instead of rolling back to the previous release (every scenario\'s weights)', async () => {
    const { a, asked } = await app();
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
    expect((await a.inject({ method: 'POST', url: '/reef/scenarios/default/releases/rollback' })).statusCode).toBe(200);
    expect(asked).toEqual(['r3', 'base', null, null, null]);
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
