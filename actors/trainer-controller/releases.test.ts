import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SqliteStore } from '../gateway/store/sqlite-store.js';
import { releasesOf } from '../gateway/index.js';
import { readPipelineCounters } from '../gateway/pipeline-status.js';
import { TrainerController, type ControllerOptions, type ControllerState, type ControllerStateV1, type Release, type SavedControllerState } from './controller.js';
import { opts, world } from './fixtures.js';
import { CONSUMER, STATE_KEY } from './messages.js';
import { readRelease, readReleases, RELEASE_PREFIX, releaseKey } from './releases.js';

let dir: string;
let store: SqliteStore;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'tc-rel-'));
  store = SqliteStore.open(join(dir, 'records.sqlite'));
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

type World = ReturnType<typeof world>;
interface Write {
  stateChars: number;
  put: string[];
  deleted: number;
}

/** The world's controller committing to a real store, as index.ts wires it; each commit's state size and rows. */
function onStore(w: World): Write[] {
  const writes: Write[] = [];
  w.ports.commit = async (offset, state, rows) => {
    writes.push({ stateChars: JSON.stringify(state).length, put: rows.put.map(([k]) => k), deleted: rows.delete.length });
    await store.commitConsumer(CONSUMER, offset, STATE_KEY, state, rows);
  };
  w.ports.getRelease = (id) => readRelease(store, id);
  return writes;
}

/** A controller started as index.ts starts one: from the store's offset and state. */
async function resume(w: World, o: ControllerOptions): Promise<TrainerController> {
  return new TrainerController(w.ports, o, await store.getOffset(CONSUMER), (await store.getState(STATE_KEY)) as SavedControllerState | null);
}

/** Trains `n` batches, one per tick, each of two turns sampled from the release current when they were judged. */
async function train(w: World, c: TrainerController, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    for (let k = 0; k < 2; k++) w.add(`t${w.log.length}`, 1, 'anchor', c.currentVersion);
    await c.tick();
  }
}

const ids = (from: number, to: number): string[] => Array.from({ length: to - from + 1 }, (_, i) => `release-${from + i}`);
const lines = (): string[] => readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n');

describe('releases as rows', () => {
  it('a commit writes the row of the release it records and a state of the newest releases only, however long the history', async () => {
    const w = world(dir);
    const writes = onStore(w);
    const o = { ...opts(dir), recentReleases: 8 };
    const c = new TrainerController(w.ports, o, 0, null);
    await train(w, c, 10);
    const early = JSON.stringify(await store.getState(STATE_KEY)).length;
    writes.length = 0;
    await train(w, c, 60);
    expect(c.releaseCount).toBe(70);
    // One row per release, written once, by the commit that records it; nothing else.
    expect(writes.every((x) => x.put.length <= 1 && x.deleted === 0)).toBe(true);
    expect(writes.flatMap((x) => x.put)).toEqual(Array.from({ length: 60 }, (_, i) => releaseKey(i + 11)));
    // Seven times the history, the same state: the window, a few digits longer.
    const late = JSON.stringify(await store.getState(STATE_KEY)).length;
    expect(late).toBeLessThan(early * 1.1);
    expect(Math.max(...writes.map((x) => x.stateChars))).toBeLessThan(early * 1.1);
    expect(c.recentReleases.map((r) => r.id)).toEqual(ids(63, 70));

    // Every release stays listed, in order, and the status reads the count and the current one.
    const all = await readReleases(store);
    expect(all.map((r) => [r.id, r.weightVersion, r.batchIds])).toEqual(Array.from({ length: 70 }, (_, i) => [`release-${i + 1}`, `v${i + 1}`, [`s:openclawrl:${i + 1}`]]));
    expect(releasesOf(all, 's').map((r) => r.id)).toEqual(ids(1, 70).reverse());
    expect((await readPipelineCounters(store)).training).toMatchObject({ releases: 70, weightVersion: 'v70' });

    // A release older than the state keeps is rolled back to from its row. Its checkpoint was
    // pruned by retention: put back, as an operator may have kept a copy.
    mkdirSync(all[2]!.checkpointPath);
    const back = await c.rollback('release-3', 'aaaa0001');
    expect(back).toMatchObject({ id: 'release-71', weightVersion: 'v3', parent: 'v70', rollbackOf: 'release-3', keyId: 'aaaa0001', checkpointPath: all[2]!.checkpointPath });
    expect(await readRelease(store, 'release-71')).toEqual(back);
    await expect(c.rollback('release-999')).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    await expect(c.rollback('release-03')).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
  });

  it('a crash between commits loses no recorded release, numbers none twice and trains no batch twice', async () => {
    const w = world(dir);
    onStore(w);
    const o = { ...opts(dir), recentReleases: 4 };
    const c1 = new TrainerController(w.ports, o, 0, null);
    await train(w, c1, 6);
    // The next release is stepped and published, and the process dies in the commit that records it.
    for (let k = 0; k < 2; k++) w.add(`t${w.log.length}`, 1, 'anchor', c1.currentVersion);
    const commit = w.ports.commit;
    w.ports.commit = async (offset, state, rows) => {
      if (rows.put.length > 0) throw new Error('controller killed');
      await commit(offset, state, rows);
    };
    await expect(c1.tick()).rejects.toThrow('controller killed');
    w.ports.commit = commit;
    expect((await readReleases(store)).map((r) => r.id)).toEqual(ids(1, 6));

    const c2 = await resume(w, o);
    expect([c2.releaseCount, c2.currentVersion]).toEqual([6, 'v6']);
    await c2.tick();
    const all = await readReleases(store);
    expect(all.map((r) => [r.id, r.weightVersion, r.batchIds[0]])).toEqual(Array.from({ length: 7 }, (_, i) => [`release-${i + 1}`, `v${i + 1}`, `s:openclawrl:${i + 1}`]));
    // Batch 7 was trained before the crash; the trainer's ledger answered it again.
    expect(w.stepsRun).toEqual(Array.from({ length: 7 }, (_, i) => `s:openclawrl:${i + 1}`));
    expect(lines()).toHaveLength(7);
    // A third start finds the same: nothing left to redo.
    const c3 = await resume(w, o);
    await c3.tick();
    expect([c3.releaseCount, w.stepsRun.length, lines().length]).toEqual([7, 7, 7]);
  });

  it('reads a state that holds every release inside it (version 1), and its first commit moves them into rows', async () => {
    // A history of 20 releases, saved as the controller saved it before releases had rows.
    const w = world(dir);
    await train(w, new TrainerController(w.ports, opts(dir), 0, null), 20);
    const rows = [...w.durable.rows].sort(([a], [b]) => a.localeCompare(b)).map(([, r]) => r as Release);
    const { version: _v, recentReleases: _r, releaseCount: _n, ...rest } = w.durable.state!;
    const v1: ControllerStateV1 = { ...rest, releases: rows };
    await store.commitConsumer(CONSUMER, w.durable.offset, STATE_KEY, v1);
    // Its readers, before the controller has committed anything.
    expect((await readReleases(store)).map((r) => r.id)).toEqual(ids(1, 20));
    expect((await readPipelineCounters(store)).training).toMatchObject({ releases: 20, weightVersion: 'v20' });

    const writes = onStore(w);
    const o = { ...opts(dir), recentReleases: 4 };
    const c = await resume(w, o);
    expect([c.releaseCount, c.currentVersion, c.lastCheckpoint]).toEqual([20, 'v20', rows[19]!.checkpointPath]);
    expect(c.recentReleases.map((r) => r.id)).toEqual(ids(17, 20));
    await train(w, c, 1);
    // The first commit wrote the twenty rows, the release after them its own.
    expect(writes.map((x) => x.put.length)).toEqual([20, 1]);
    const saved = (await store.getState(STATE_KEY)) as ControllerState & { releases?: unknown };
    expect(saved).toMatchObject({ version: 2, releaseCount: 21, run: v1.run });
    expect(saved.releases).toBeUndefined();
    expect(saved.recentReleases.map((r) => r.id)).toEqual(ids(18, 21));
    const all = await readReleases(store);
    expect(all.slice(0, 20)).toEqual(rows);
    expect(all[20]).toMatchObject({ id: 'release-21', weightVersion: 'v21', parent: 'v20' });
    expect(await store.statesWithPrefix(RELEASE_PREFIX)).toHaveLength(21);
    expect((await readPipelineCounters(store)).training).toMatchObject({ releases: 21, weightVersion: 'v21' });

    // A restarted controller rolls back to a release the migration moved into its row.
    mkdirSync(rows[1]!.checkpointPath);
    const again = await resume(w, o);
    expect(await again.rollback('release-2')).toMatchObject({ id: 'release-22', weightVersion: 'v2', rollbackOf: 'release-2' });
  });

  it('a release row written before releases kept the asking key reads back with keyId null', async () => {
    const { keyId: _k, ...before } = { id: 'release-1', weightVersion: 'v1', parent: null, batchIds: [], metrics: {}, createdAt: 1, checkpointPath: '/x', rollbackOf: 'base', sync: 'disk', keyId: null };
    await store.commitConsumer(CONSUMER, 0, STATE_KEY, { version: 2 }, { put: [[releaseKey(1), before]], delete: [] });
    expect(await readReleases(store)).toEqual([{ ...before, keyId: null }]);
    expect(await readRelease(store, 'release-1')).toEqual({ ...before, keyId: null });
  });

  it('a release that leaves the state has its checkpoint pruned first, rollbacks in a row included', async () => {
    mkdirSync(join(dir, 'base'));
    const w = world(dir);
    onStore(w);
    // The smallest window keepCheckpoints (2) allows: 3.
    const o = { ...opts(dir), recentReleases: 1 };
    const c = new TrainerController(w.ports, o, 0, null);
    await train(w, c, 3);
    // Each rollback pushes a release out of the newest two, then out of the state: v2, then v3's release.
    await c.rollback('base');
    await c.rollback('release-3');
    await train(w, c, 1);
    expect(c.recentReleases.map((r) => r.id)).toEqual(ids(4, 6));
    const onDisk = readdirSync(dir).filter((n) => /^v\d+$/.test(n)).sort();
    expect(onDisk).toEqual(c.recentReleases.slice(-2).map((r) => basename(r.checkpointPath)).filter((n) => n !== 'base').sort());
    expect(existsSync(join(dir, 'base'))).toBe(true);
  });
});
