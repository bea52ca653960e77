import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GroupCommitter, HistogramCounter } from './group-commit.js';
import { recordDiff, sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-store-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

describe('group commit', () => {
  it('commits 100 concurrent appends in fewer transactions, all resolved and readable', async () => {
    const store = SqliteStore.open(join(dir, 'r.db'));
    const receipts = await Promise.all(Array.from({ length: 100 }, (_, i) => store.append(sampleRecord(i))));
    const stats = store.stats();
    expect(stats.records).toBe(100);
    expect(stats.commits).toBeLessThan(100);
    expect(stats.pending).toBe(0);
    expect(stats.batchSize.count).toBe(stats.commits);
    expect(stats.batchSize.sum).toBe(100);
    expect(stats.commitMs.count).toBe(stats.commits);
    expect(new Set(receipts.map((r) => r.offset)).size).toBe(100);
    for (const [i, r] of receipts.entries()) expect(recordDiff((await store.get(r.id))!, sampleRecord(i))).toEqual([]);
    await store.close();
  });

  it('resolves a receipt only once its transaction is visible to another connection', async () => {
    const path = join(dir, 'r.db');
    const store = SqliteStore.open(path);
    const reader = new Database(path, { readonly: true });
    const count = () => (reader.prepare('SELECT COUNT(*) AS n FROM records').get() as { n: number }).n;
    const pending = store.append(sampleRecord(1));
    expect(count()).toBe(0); // queued, not yet committed
    await pending;
    expect(count()).toBe(1);
    reader.close();
    await store.close();
  });

  it('commits at once when maxBatch appends are queued', async () => {
    const store = SqliteStore.open(join(dir, 'r.db'), { maxBatch: 10 });
    await Promise.all(Array.from({ length: 35 }, (_, i) => store.append(sampleRecord(i))));
    const { batchSize, commits } = store.stats();
    expect(commits).toBe(4);
    expect(batchSize.counts[batchSize.bounds.indexOf(8)]).toBe(1); // the 5-record tail
    await store.close();
  });

  it('commits a lone append at once when no company can come, and waits a turn when it can', async () => {
    let alone = true;
    const store = SqliteStore.open(join(dir, 'r.db'), { company: () => !alone });
    const reader = new Database(join(dir, 'r.db'), { readonly: true });
    const count = () => (reader.prepare('SELECT COUNT(*) AS n FROM records').get() as { n: number }).n;
    const first = store.append(sampleRecord(1));
    expect(count()).toBe(1); // committed before append returned
    await first;
    alone = false;
    const pending = [store.append(sampleRecord(2)), store.append(sampleRecord(3))];
    expect(count()).toBe(1); // both wait for the same turn
    await Promise.all(pending);
    expect(count()).toBe(3);
    expect(store.stats().commits).toBe(2);
    reader.close();
    await store.close();
  });

  it('close() commits what is still queued', async () => {
    const path = join(dir, 'r.db');
    const store = SqliteStore.open(path);
    const pending = Array.from({ length: 5 }, (_, i) => store.append(sampleRecord(i)));
    await store.close();
    const receipts = await Promise.all(pending);
    const again = SqliteStore.open(path);
    expect(await again.headOffset()).toBe(5);
    expect((await again.get(receipts[4]!.id))?.offset).toBe(5);
    await again.close();
  });

  it('retries a failed batch one by one so only the bad item is rejected', async () => {
    const batches: number[][] = [];
    const committer = new GroupCommitter<number>((items) => {
      batches.push(items);
      if (items.includes(13)) throw new Error('bad item');
      return items.map((x) => x * 10);
    }, { maxBatch: 100, maxDelayMs: 0 });
    const results = await Promise.allSettled([1, 13, 2].map((x) => committer.enqueue(x)));
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : 'rejected'))).toEqual([10, 'rejected', 20]);
    expect(batches).toEqual([[1, 13, 2], [1], [13], [2]]);
    expect(committer.snapshot()).toMatchObject({ commits: 2, records: 2, failedAppends: 1, pending: 0 });
  });

  it('fails a batch at once when another process holds the database locked: each retry alone failed the same way, after the whole busy timeout', async () => {
    const batches: number[][] = [];
    const locked = Object.assign(new Error('database is locked'), { code: 'SQLITE_BUSY' });
    const committer = new GroupCommitter<number>((items) => {
      batches.push(items);
      throw locked;
    }, { maxBatch: 100, maxDelayMs: 0 });
    const results = await Promise.allSettled([1, 2, 3].map((x) => committer.enqueue(x)));
    expect(results).toEqual([1, 2, 3].map(() => ({ status: 'rejected', reason: locked })));
    expect(batches).toEqual([[1, 2, 3]]);
    expect(committer.snapshot()).toMatchObject({ commits: 0, failedAppends: 3, pending: 0 });
  });

  it('a store another process holds locked refuses a batch of appends with REEF_ERR_STORE, and commits once the lock is gone', async () => {
    const path = join(dir, 'r.db');
    const store = SqliteStore.open(path, { busyTimeoutMs: 20 });
    await store.append(sampleRecord(0));
    const holder = new Database(path);
    holder.exec('BEGIN IMMEDIATE');
    const refused = await Promise.allSettled([1, 2, 3].map((i) => store.append(sampleRecord(i))));
    holder.exec('ROLLBACK');
    holder.close();
    for (const r of refused) expect(r).toMatchObject({ status: 'rejected', reason: { code: 'REEF_ERR_STORE', message: expect.stringMatching(/locked/) } });
    const again = await store.append(sampleRecord(4));
    expect(again.offset).toBe(2);
    await store.close();
  });

  it('waits up to maxDelayMs for company', async () => {
    const batches: number[][] = [];
    const committer = new GroupCommitter<number>((items) => (batches.push(items), items), { maxBatch: 100, maxDelayMs: 20 });
    const first = committer.enqueue(1);
    await new Promise((r) => setImmediate(r));
    const second = committer.enqueue(2);
    await Promise.all([first, second]);
    expect(batches).toEqual([[1, 2]]);
  });
});

describe('HistogramCounter', () => {
  it('reports cumulative Prometheus buckets', () => {
    const h = new HistogramCounter([1, 5, 10]);
    for (const v of [0.5, 1, 3, 7, 50]) h.observe(v);
    expect(h.snapshot()).toEqual({ bounds: [1, 5, 10], counts: [2, 3, 4], sum: 61.5, count: 5 });
  });
});
