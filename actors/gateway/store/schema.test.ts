import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { SCHEMA_VERSION } from './schema.js';
import { SqliteStore } from './sqlite-store.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-store-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const pragma = (path: string, name: string) => {
  const db = new Database(path, { readonly: true });
  try {
    return db.pragma(name, { simple: true });
  } finally {
    db.close();
  }
};

describe('schema and settings', () => {
  it('migrates a new file to the current version, and reopening leaves it there', async () => {
    const path = join(dir, 'r.db');
    await SqliteStore.open(path).close();
    expect(pragma(path, 'user_version')).toBe(SCHEMA_VERSION);
    await SqliteStore.open(path).close();
    expect(pragma(path, 'user_version')).toBe(SCHEMA_VERSION);
    expect(pragma(path, 'journal_mode')).toBe('wal');
  });

  it('refuses a file written by a newer schema', () => {
    const path = join(dir, 'r.db');
    const db = new Database(path);
    db.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
    db.close();
    expect(() => SqliteStore.open(path)).toThrow(expect.objectContaining({ code: 'REEF_ERR_STORE' }));
  });

  it('maps durability to the synchronous level (FULL = 2 for power, NORMAL = 1 for process)', async () => {
    for (const [durability, level] of [['power', 2], ['process', 1]] as const) {
      const store = SqliteStore.open(join(dir, `${durability}.db`), { durability });
      const db = (store as unknown as { db: Database.Database }).db;
      expect(db.pragma('synchronous', { simple: true })).toBe(level);
      await store.close();
    }
  });
});
