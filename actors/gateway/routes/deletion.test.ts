import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Fastify from 'fastify';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ReefError } from '../../runtime/errors.js';
import type { Release } from '../../trainer-controller/controller.js';
import { ConcurrencyLimiter, type Principal } from '../auth.js';
import { lineageOf } from '../lineage.js';
import { sampleRecord } from '../store/fixtures.js';
import { SqliteStore } from '../store/sqlite-store.js';
import { registerReefRoutes } from './reef.js';

const rel = (n: number, parent: string | null, batchIds: string[], rollbackOf: string | null = null, version = `v${n}`): Release => ({
  id: `release-${n}`, weightVersion: version, parent, batchIds, metrics: {}, createdAt: n, checkpointPath: `/ck/${version}`, rollbackOf, keyId: null, sync: 'disk',
});

describe('lineageOf', () => {
  // r1 trains b1 from the base; r2 trains b2 on top; r3 trains b3 on top of r2; r4 puts r1 back; r5 trains b5 on top of r1's weights.
  const chain = [rel(1, 'base', ['s:openclawrl:1']), rel(2, 'v1', ['s:openclawrl:2']), rel(3, 'v2', ['s:openclawrl:3']), rel(4, 'v3', [], 'release-1', 'v1'), rel(5, 'v1', ['s:openclawrl:4'])];

  it('a release built on weights that trained on the data holds it too, and the target is the newest release that never saw it', () => {
    const l = lineageOf(new Map([['T', ['s:openclawrl:2']]]), chain.slice(0, 3));
    expect(l).toEqual({ batches: [{ batchId: 's:openclawrl:2', turns: ['T'], release: 'release-2' }], tainted: ['release-2', 'release-3'], current: 'release-3', servingTrained: true, rollbackTo: 'release-1' });
  });

  it('after a rollback past the data, the serving weights are clean: nothing to roll back', () => {
    const l = lineageOf(new Map([['T', ['s:openclawrl:2']]]), chain);
    expect(l).toMatchObject({ tainted: ['release-2', 'release-3'], current: 'release-5', servingTrained: false, rollbackTo: null });
  });

  it('data in the first batch taints every release, rollbacks to it included: the target is the base model', () => {
    const l = lineageOf(new Map([['T', ['s:openclawrl:1']]]), chain);
    expect(l).toMatchObject({ tainted: ['release-1', 'release-2', 'release-3', 'release-4', 'release-5'], servingTrained: true, rollbackTo: 'base' });
  });

  it('after a rollback to the base, a release trained on the data goes back to the base: the weights served just before it', () => {
    const l = lineageOf(new Map([['T', ['s:openclawrl:3']]]), [rel(1, 'base', ['s:openclawrl:1']), rel(2, 'v1', ['s:openclawrl:2']), rel(3, 'v2', [], 'base', 'base'), rel(4, 'base', ['s:openclawrl:3'])]);
    expect(l).toMatchObject({ tainted: ['release-4'], servingTrained: true, rollbackTo: 'base' });
  });

  it('a batch formed but not trained has no release, and taints nothing', () => {
    const l = lineageOf(new Map([['T', ['s:openclawrl:9']], ['U', ['s:openclawrl:9']]]), chain);
    expect(l).toEqual({ batches: [{ batchId: 's:openclawrl:9', turns: ['T', 'U'], release: null }], tainted: [], current: 'release-5', servingTrained: false, rollbackTo: null });
  });
});

describe('deletion routes', () => {
  let dir: string;
  let store: SqliteStore;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'reef-deletion-routes-'));
    store = SqliteStore.open(join(dir, 'records.sqlite'));
  });
  afterEach(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const open: Principal = { id: 'open', scenarios: null, limiter: new ConcurrencyLimiter(8) };
  const scoped: Principal = { id: 'scoped', scenarios: new Set(['default']), limiter: new ConcurrencyLimiter(8) };

  async function app(opts: { releases?: Release[]; training?: boolean } = {}) {
    const rollbacks: unknown[] = [];
    const forgotten: string[][] = [];
    const a = Fastify();
    registerReefRoutes(a, {
      store,
      defaultScenario: 'default',
      status: () => ({}),
      ...(opts.training === false ? {} : { rollback: async (_s: string, body: unknown) => (rollbacks.push(body), { id: 'release-9' }) }),
      deletion: {
        deleteRecords: async (target) => {
          const c = await store.deleteRecords(target, async (ids) => void forgotten.push(ids));
          return { ...c, forgotten: { judge: 1, trainerController: 2 } };
        },
        recordIdsOf: (t) => store.recordIdsOf(t),
        batchesOf: (ids) => store.batchesOf(ids),
        releases: async () => opts.releases ?? [],
      },
    }, (req) => (req.headers['x-key'] === 'scoped' ? scoped : open));
    await a.ready();
    return { a, rollbacks, forgotten };
  }

  async function session(tag: string, scenario = 'default'): Promise<string[]> {
    const ids: string[] = [];
    for (let i = 0; i < 2; i++) ids.push((await store.append({ ...sampleRecord(i), scenario, tags: { session: tag } })).id);
    return ids;
  }

  it('deletes a session and answers counts with the lineage; again answers zeros', async () => {
    const ids = await session('alice');
    await session('bob');
    await store.putBatchTurns('default:openclawrl:1', 'default', [ids[0]!]);
    const { a, forgotten } = await app({ releases: [rel(1, 'base', ['default:openclawrl:1'])] });
    const lin = await a.inject({ method: 'GET', url: '/reef/scenarios/default/lineage?session=alice' });
    expect(lin.json()).toMatchObject({ records: 2, batches: [{ batch_id: 'default:openclawrl:1', turns: [ids[0]], release_id: 'release-1' }], releases: ['release-1'], serving_trained: true, rollback_to: 'base' });
    const res = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ session: 'alice', deleted: { records: 2, pending_judgments: 1, unbatched_tasks: 2, wal_truncated: true }, lineage: { releases: ['release-1'], rollback_to: 'base' }, rollback: null });
    expect(forgotten).toEqual([ids]);
    expect(await store.get(ids[0]!)).toBeNull();
    // By record id, the lineage outlives the record.
    expect((await a.inject({ method: 'GET', url: `/reef/scenarios/default/lineage?record=${ids[0]}` })).json()).toMatchObject({ releases: ['release-1'] });
    const again = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice' });
    expect(again.json().deleted).toMatchObject({ records: 0, chunks: 0 });
    await a.close();
  });

  it('with rollback=true rolls back to the last release before the data, only when the serving weights hold it', async () => {
    const ids = await session('alice');
    await store.putBatchTurns('default:openclawrl:2', 'default', [ids[1]!]);
    const { a, rollbacks } = await app({ releases: [rel(1, 'base', ['default:openclawrl:1']), rel(2, 'v1', ['default:openclawrl:2'])] });
    const res = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice?rollback=true' });
    expect(res.json()).toMatchObject({ lineage: { rollback_to: 'release-1' }, rollback: { id: 'release-9' } });
    expect(rollbacks).toEqual([{ release_id: 'release-1' }]);
    await session('bob');
    await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/bob?rollback=true' });
    expect(rollbacks).toHaveLength(1);
    await a.close();
  });

  it('a rollback that fails after the data is gone is reported with its target, not as a failed deletion', async () => {
    const ids = await session('alice');
    await store.putBatchTurns('default:openclawrl:1', 'default', [ids[0]!]);
    const a = Fastify();
    registerReefRoutes(a, {
      store, defaultScenario: 'default', status: () => ({}),
      rollback: async () => {
        throw new ReefError('REEF_ERR_NOT_FOUND', { what: 'checkpoint /ck/v0 (pruned by retention)' });
      },
      deletion: { deleteRecords: async (t) => ({ ...(await store.deleteRecords(t, async () => {})), forgotten: null }), recordIdsOf: (t) => store.recordIdsOf(t), batchesOf: (x) => store.batchesOf(x), releases: async () => [rel(1, 'base', ['default:openclawrl:1'])] },
    }, () => open);
    const res = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice?rollback=true' });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toMatchObject({ deleted: { records: 2 }, rollback: { release_id: 'base', error: { code: 'REEF_ERR_NOT_FOUND', retryable: false } } });
    await a.close();
  });

  it("keeps to the key's scenarios, refuses a rollback a scoped key may not order before deleting anything, and checks its input", async () => {
    const other = await session('alice', 'other');
    const mine = await session('alice');
    const { a } = await app();
    const hidden = await a.inject({ method: 'DELETE', url: '/reef/scenarios/other/sessions/alice', headers: { 'x-key': 'scoped' } });
    expect([hidden.statusCode, hidden.json().error.code]).toEqual([404, 'REEF_ERR_NOT_FOUND']);
    expect(await store.get(other[0]!)).not.toBeNull();
    const forbidden = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice?rollback=true', headers: { 'x-key': 'scoped' } });
    expect([forbidden.statusCode, forbidden.json().error.code]).toEqual([403, 'REEF_ERR_FORBIDDEN']);
    expect(await store.get(mine[0]!)).not.toBeNull();
    const bad = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice?rollback=yes' });
    expect([bad.statusCode, bad.json().error.param]).toEqual([400, 'rollback']);
    expect((await a.inject({ method: 'GET', url: '/reef/scenarios/default/lineage' })).statusCode).toBe(400);
    expect((await a.inject({ method: 'GET', url: '/reef/scenarios/default/lineage?session=a&record=b' })).statusCode).toBe(400);
    // A scoped key deletes in its own scenario.
    const ok = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/sessions/alice', headers: { 'x-key': 'scoped' } });
    expect(ok.json().deleted.records).toBe(2);
    await a.close();
  });

  it('a whole scenario; rollback=true without training is a 409 that deletes nothing', async () => {
    const ids = [...(await session('a')), ...(await session('b'))];
    const { a } = await app({ training: false });
    expect((await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/records?rollback=true' })).statusCode).toBe(409);
    expect(await store.get(ids[0]!)).not.toBeNull();
    const res = await a.inject({ method: 'DELETE', url: '/reef/scenarios/default/records' });
    expect(res.json()).toMatchObject({ session: null, deleted: { records: 4 } });
    await a.close();
  });
});
