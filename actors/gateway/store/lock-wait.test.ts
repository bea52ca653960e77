import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { recordDiff, sampleRecord } from './fixtures.js';
import { GroupCommitter } from './group-commit.js';
import { newId } from './ids.js';
import { SqliteStore } from './sqlite-store.js';

/**
 * The gateway's store waits for another process's write lock (the judge or the trainer-controller
 * committing) on a timer, never in SQLite's busy handler on its event loop (security review M1).
 * The other process is a second connection holding BEGIN IMMEDIATE on the same file.
 */

let dir: string;
let path: string;
let holder: Database.Database | null = null;
const stores: SqliteStore[] = [];
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-lock-'));
  path = join(dir, 'records.sqlite');
});
afterEach(async () => {
  if (holder?.inTransaction) holder.exec('ROLLBACK');
  holder?.close();
  holder = null;
  for (const s of stores.splice(0)) await s.close();
  rmSync(dir, { recursive: true, force: true });
});

function open(options: Parameters<typeof SqliteStore.open>[1] = {}): SqliteStore {
  const s = SqliteStore.open(path, { lockWait: 'async', ...options });
  stores.push(s);
  return s;
}

/** Another process's commit in progress: it holds the write lock until `holder.exec('COMMIT')`. */
function takeLock(): Database.Database {
  holder = new Database(path);
  holder.exec('BEGIN IMMEDIATE');
  return holder;
}

const tick = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

function track<T>(p: Promise<T>): { settled: () => boolean; promise: Promise<T> } {
  let done = false;
  const promise = p.finally(() => (done = true));
  return { settled: () => done, promise };
}

describe("lockWait 'async'", () => {
  it('an append waits for the lock while the event loop keeps running, then commits with a receipt get() reads back', async () => {
    // The budget is long enough that a blocking wait (the old busy_timeout) would still hold the
    // loop when the timer below is due, and short enough that such a failure is quick.
    const store = open({ busyTimeoutMs: 3000 });
    await store.append(sampleRecord(0));
    const lock = takeLock();
    const append = track(store.append(sampleRecord(1)));
    await tick(20);
    expect(append.settled()).toBe(false);
    expect(store.stats().lockBusy).toBeGreaterThan(0);
    lock.exec('COMMIT');
    const receipt = await append.promise;
    expect(receipt.offset).toBe(2);
    expect(recordDiff((await store.get(receipt.id))!, sampleRecord(1))).toEqual([]);
    expect(store.stats()).toMatchObject({ records: 2, failedAppends: 0, pending: 0 });
  });

  it('appends that come while one waits queue behind it: one commit, offsets in the order they came, none twice', async () => {
    const store = open();
    const lock = takeLock();
    const first = store.append(sampleRecord(1));
    await tick(5);
    const rest = [2, 3, 4].map((i) => store.append(sampleRecord(i)));
    await tick(5);
    lock.exec('ROLLBACK');
    const receipts = await Promise.all([first, ...rest]);
    expect(receipts.map((r) => r.offset)).toEqual([1, 2, 3, 4]);
    expect(store.stats()).toMatchObject({ commits: 1, records: 4 });
    const reader = new Database(path, { readonly: true });
    expect(reader.prepare('SELECT COUNT(*) AS n FROM records').get()).toEqual({ n: 4 });
    reader.close();
  });

  it('past the budget the append fails with retryable REEF_ERR_STORE_BUSY naming what waited and for how long, and nothing is stored', async () => {
    const store = open({ busyTimeoutMs: 40, lockWaitSetting: 'reef.limits.store_lock_wait_ms' });
    await store.append(sampleRecord(0));
    const lock = takeLock();
    const record = { ...sampleRecord(1), id: newId() };
    const results = await Promise.allSettled([store.append(record), store.append(sampleRecord(2))]);
    for (const r of results) {
      expect(r).toMatchObject({ status: 'rejected', reason: { code: 'REEF_ERR_STORE_BUSY', retryable: true, status: 503 } });
    }
    const message = (results[0] as PromiseRejectedResult).reason.message as string;
    expect(message).toMatch(new RegExp(`the append of record ${record.id} waited \\d+ ms \\(reef\\.limits\\.store_lock_wait_ms\\) for its write lock`));
    expect(message).toContain(path);
    lock.exec('ROLLBACK');
    expect(await store.get(record.id)).toBeNull();
    expect(await store.headOffset()).toBe(1);
    expect(store.stats()).toMatchObject({ failedAppends: 2, pending: 0 });
    // The lock gone, the same record goes in once.
    expect((await store.append(record)).offset).toBe(2);
  });

  it('stage answers null at once while the lock is held, and the append then writes the whole record itself', async () => {
    const store = open();
    const lock = takeLock();
    const rec = sampleRecord(3, { promptTokens: 9000 });
    const body = new TextEncoder().encode(JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(70_000) }] }));
    expect(store.stage({ request: { chatBody: body }, promptIds: rec.promptIds })).toBeNull();
    const append = store.append({ ...rec, request: { chatBody: body }, staged: null });
    await tick(5);
    lock.exec('COMMIT');
    const got = (await store.get((await append).id))!;
    expect(Array.from(got.promptIds)).toEqual(Array.from(rec.promptIds));
    expect(got.request.messages).toEqual([{ role: 'user', content: 'x'.repeat(70_000) }]);
  });

  it("the gateway's other writes (reports, scenarios, state) wait off the loop too, and fail the same way past the budget", async () => {
    const store = open({ busyTimeoutMs: 3000 });
    let lock = takeLock();
    const writes = track(Promise.all([
      store.createScenario('lockwait', null),
      store.putReport({ scenario: 'default', score: 1, feedback: null, references: [], metadata: null, clientId: 'r1', keyId: null }),
      store.putState('k', { v: 1 }),
    ]));
    await tick(20);
    expect(writes.settled()).toBe(false);
    lock.exec('COMMIT');
    const [scenario, report] = await writes.promise;
    expect(scenario.name).toBe('lockwait');
    expect(report.created).toBe(true);
    expect(await store.getState('k')).toEqual({ v: 1 });
    lock.close();

    const quick = open({ busyTimeoutMs: 30 });
    lock = takeLock();
    await expect(quick.putState('k', { v: 2 })).rejects.toMatchObject({ code: 'REEF_ERR_STORE_BUSY', message: expect.stringContaining('state k waited') });
    await expect(quick.createScenario('other', null)).rejects.toMatchObject({ code: 'REEF_ERR_STORE_BUSY' });
    lock.exec('ROLLBACK');
    expect(await quick.getState('k')).toEqual({ v: 1 });
    expect(await quick.getScenario('other')).toBeNull();
  });

  it("retention's deletes wait for the lock off the loop too", async () => {
    const store = open({ busyTimeoutMs: 3000 });
    await store.putReport({ scenario: 'default', score: 1, feedback: null, references: [], metadata: null, clientId: null, keyId: null });
    const lock = takeLock();
    const run = track(store.retain({ maxAgeMs: 0 }, { now: () => Date.now() + 60_000 }));
    await tick(20);
    expect(run.settled()).toBe(false);
    lock.exec('COMMIT');
    expect(await run.promise).toMatchObject({ reports: 1 });
  });

  it('close() waits for an append that waits for the lock, which then commits', async () => {
    const store = SqliteStore.open(path, { lockWait: 'async' });
    const lock = takeLock();
    const append = store.append(sampleRecord(1));
    const closed = track(store.close());
    await tick(10);
    expect(closed.settled()).toBe(false);
    lock.exec('COMMIT');
    await closed.promise;
    expect((await append).offset).toBe(1);
  });
});

describe("lockWait 'block' (the judge, the trainer-controller)", () => {
  it('an append found busy past busy_timeout still fails with REEF_ERR_STORE, as before', async () => {
    const store = open({ lockWait: 'block', busyTimeoutMs: 20 });
    takeLock();
    await expect(store.append(sampleRecord(1))).rejects.toMatchObject({ code: 'REEF_ERR_STORE', message: expect.stringMatching(/locked/) });
  });

  it('rejects a lockWait or lockBackoff it does not know', () => {
    expect(() => SqliteStore.open(path, { lockWait: 'spin' as 'block' })).toThrow(/lockWait must be 'block' or 'async'/);
    expect(() => SqliteStore.open(path, { lockBackoff: { firstMs: 10, maxMs: 5 } })).toThrow(/lockBackoff/);
  });
});

describe('GroupCommitter with an async lock wait', () => {
  const busy = () => Object.assign(new Error('database is locked'), { code: 'SQLITE_BUSY' });
  const lockWait = { mode: 'async' as const, budgetMs: 5000, setting: 'test', firstMs: 1, maxMs: 4, busyError: (item: number) => new Error(`busy ${item}`) };

  it('a batch that finds the lock held is tried again whole, and each item is written once', async () => {
    let busyFor = 3;
    const written: number[] = [];
    const committer = new GroupCommitter<number>((items) => {
      if (busyFor-- > 0) throw busy();
      written.push(...items);
      return items.map((x) => x * 10);
    }, { maxBatch: 100, maxDelayMs: 0, lockWait });
    expect(await Promise.all([1, 2, 3].map((x) => committer.enqueue(x)))).toEqual([10, 20, 30]);
    expect(written).toEqual([1, 2, 3]);
    expect(committer.snapshot()).toMatchObject({ commits: 1, lockBusy: 3, failedAppends: 0 });
    await committer.idle();
  });

  it('the lock taken between two items of a split batch: the committed stay committed, the rest wait', async () => {
    const written: number[] = [];
    let calls = 0;
    const committer = new GroupCommitter<number>((items) => {
      calls++;
      if (items.length > 1) throw new Error('one bad item');
      if (calls === 3) throw busy(); // item 2's first try
      if (items[0] === 13) throw new Error('bad');
      written.push(items[0]!);
      return [items[0]!];
    }, { maxBatch: 100, maxDelayMs: 0, lockWait });
    const results = await Promise.allSettled([1, 2, 13, 3].map((x) => committer.enqueue(x)));
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : 'rejected'))).toEqual([1, 2, 'rejected', 3]);
    expect(written).toEqual([1, 2, 3]);
  });
});
