import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-store-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 500 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
  if (!cond()) throw new Error(`gave up waiting for ${what}`);
}

describe('background checkpoints', () => {
  it('copy committed frames into the database from the worker, and close() cleans up', async () => {
    const path = join(dir, 'r.db');
    const store = SqliteStore.open(path, { checkpointIntervalMs: 10 });
    await Promise.all(Array.from({ length: 40 }, (_, i) => store.append(sampleRecord(i, { outputTokens: 256 }))));
    await until(() => store.stats().checkpoints > 0, 'a background checkpoint');
    expect(store.stats().checkpointErrors).toBe(0);
    await store.close();
    expect(existsSync(`${path}-wal`)).toBe(false); // the last connection checkpointed and removed it
    const again = SqliteStore.open(path, { checkpoint: 'inline' });
    expect(await again.headOffset()).toBe(40);
    await again.close();
  });

  it('count only checkpoints that copied something: an idle WAL already copied counted one every tick', async () => {
    // Created and closed first, so that the WAL holds the one commit below and nothing else: the
    // first checkpoint the worker reports then copied all there is.
    await SqliteStore.open(join(dir, 'r.db')).close();
    const store = SqliteStore.open(join(dir, 'r.db'), { checkpointIntervalMs: 5 });
    await store.append(sampleRecord(1, { outputTokens: 256 }));
    await until(() => store.stats().checkpoints > 0, 'a background checkpoint');
    const settled = store.stats().checkpoints;
    // Forty ticks with nothing committed.
    await new Promise((r) => setTimeout(r, 200));
    expect(store.stats().checkpoints).toBe(settled);
    await store.append(sampleRecord(99, { outputTokens: 256 }));
    await until(() => store.stats().checkpoints > settled, 'a checkpoint of the new commit');
    await store.close();
  });

  it('are not started in inline mode', async () => {
    const store = SqliteStore.open(join(dir, 'r.db'), { checkpoint: 'inline', checkpointIntervalMs: 10 });
    await store.append(sampleRecord(1));
    await new Promise((r) => setTimeout(r, 50));
    expect(store.stats().checkpoints).toBe(0);
    await store.close();
  });
});
