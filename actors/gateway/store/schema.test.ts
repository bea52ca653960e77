import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sampleRecord } from './fixtures.js';
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

  it('brings a version-6 store (records without key ids) up to date: its records read back with keyId null, new ones keep theirs', async () => {
    const path = join(dir, 'r.db');
    const writer = SqliteStore.open(path);
    const old = await writer.append(sampleRecord(1, { keyId: null }));
    await writer.close();
    // The file as version 6 left it: no key_id column.
    const db = new Database(path);
    db.exec('ALTER TABLE records DROP COLUMN key_id');
    db.exec('ALTER TABLE reports DROP COLUMN key_id');
    db.exec('DROP TABLE responses');
    db.pragma('user_version = 6');
    db.close();

    const store = SqliteStore.open(path);
    try {
      expect(pragma(path, 'user_version')).toBe(SCHEMA_VERSION);
      expect((await store.get(old.id))!.keyId).toBeNull();
      const fresh = await store.append(sampleRecord(2, { keyId: 'ab12cd34' }));
      expect((await store.get(fresh.id))!.keyId).toBe('ab12cd34');
      expect((await store.list({ scenario: 'default' })).items.map((r) => r.keyId)).toEqual([null, 'ab12cd34']);
      expect((await store.readFrom(0, 10)).map((r) => r.keyId)).toEqual([null, 'ab12cd34']);
    } finally {
      await store.close();
    }
  });

  it('brings a version-7 store (reports without key ids) up to date: its reports read back with keyId null, new ones keep theirs', async () => {
    const path = join(dir, 'r.db');
    const writer = SqliteStore.open(path);
    const rec = await writer.append(sampleRecord(1));
    const report = { scenario: 'default', score: 1, feedback: null, references: [rec.id], metadata: null, clientId: null };
    const old = await writer.putReport({ ...report, keyId: null });
    await writer.close();
    const db = new Database(path);
    db.exec('ALTER TABLE reports DROP COLUMN key_id');
    db.exec('DROP TABLE responses');
    db.pragma('user_version = 7');
    db.close();

    const store = SqliteStore.open(path);
    try {
      expect(pragma(path, 'user_version')).toBe(SCHEMA_VERSION);
      expect((await store.getReport(old.report.id))!.keyId).toBeNull();
      const fresh = await store.putReport({ ...report, keyId: 'ab12cd34' });
      expect((await store.listReports({ scenario: 'default' })).items.map((r) => r.keyId)).toEqual([null, 'ab12cd34']);
      expect(fresh.report.keyId).toBe('ab12cd34');
      // Step 9 made the table /v1/responses stores in.
      await store.putResponse({ id: rec.id, keyId: 'ab12cd34', scenario: 'default', previousId: null, session: null, createdAt: 1, conversation: [], inputItems: [], response: {} });
      expect((await store.getResponse(rec.id, 'ab12cd34'))?.createdAt).toBe(1);
    } finally {
      await store.close();
    }
  });

  it('refuses a file written by a newer schema', () => {
    const path = join(dir, 'r.db');
    const db = new Database(path);
    db.pragma(`user_version = ${SCHEMA_VERSION + 1}`);
    db.close();
    expect(() => SqliteStore.open(path)).toThrow(expect.objectContaining({ code: 'REEF_ERR_STORE' }));
  });

  it('a read-only open reads a store a writer holds, and refuses an older or newer schema without changing the file', async () => {
    const path = join(dir, 'r.db');
    const writer = SqliteStore.open(path);
    await writer.append(sampleRecord(1));
    const reader = SqliteStore.open(path, { readonly: true });
    await writer.append(sampleRecord(2));
    expect((await reader.list({ scenario: 'default', limit: 10 })).items).toHaveLength(2);
    await expect(reader.append(sampleRecord(3))).rejects.toThrow(/readonly/);
    await reader.close();
    await writer.close();
    expect(() => SqliteStore.open(join(dir, 'missing.db'), { readonly: true })).toThrow();

    for (const version of [SCHEMA_VERSION - 1, SCHEMA_VERSION + 1]) {
      const db = new Database(path);
      db.pragma(`user_version = ${version}`);
      db.close();
      expect(() => SqliteStore.open(path, { readonly: true })).toThrow(version < SCHEMA_VERSION ? /older than this build's.*reef up/ : /newer than this build's/);
      // Left as it was: a reader does not upgrade a store under the gateway that owns it.
      expect(pragma(path, 'user_version')).toBe(version);
    }
  });

  it('refuses a damaged file, a file in a missing directory and a store another process holds locked with REEF_ERR_STORE naming the file (the bare message named none)', async () => {
    const damaged = join(dir, 'damaged.db');
    writeFileSync(damaged, 'not a database, '.repeat(256));
    for (const readonly of [false, true]) {
      expect(() => SqliteStore.open(damaged, { readonly })).toThrow(
        expect.objectContaining({ code: 'REEF_ERR_STORE', message: expect.stringContaining(`${damaged} is not a SQLite database`) }),
      );
    }

    const nowhere = join(dir, 'no-such-dir', 'r.db');
    for (const readonly of [false, true]) {
      expect(() => SqliteStore.open(nowhere, { readonly })).toThrow(
        expect.objectContaining({ code: 'REEF_ERR_STORE', message: expect.stringMatching(new RegExp(`cannot open ${nowhere}.*directory does not exist`)) }),
      );
    }

    const path = join(dir, 'r.db');
    const writer = SqliteStore.open(path);
    await writer.append(sampleRecord(1));
    await writer.close();
    const holder = new Database(path);
    holder.exec('BEGIN IMMEDIATE');
    try {
      expect(() => SqliteStore.open(path, { busyTimeoutMs: 50 })).toThrow(
        expect.objectContaining({ code: 'REEF_ERR_STORE', message: expect.stringContaining(`${path} is locked by another process`) }),
      );
    } finally {
      holder.exec('ROLLBACK');
      holder.close();
    }
    // Nothing was lost or changed by the refused opens.
    const again = SqliteStore.open(path);
    expect(await again.headOffset()).toBe(1);
    await again.close();
  });

  it('maps durability to the synchronous level (FULL = 2 for power and by default, NORMAL = 1 for process)', async () => {
    for (const [durability, level] of [['power', 2], ['process', 1], [undefined, 2]] as const) {
      const store = SqliteStore.open(join(dir, `${durability ?? 'default'}.db`), { durability });
      const db = (store as unknown as { db: Database.Database }).db;
      expect(db.pragma('synchronous', { simple: true })).toBe(level);
      await store.close();
    }
  });
});
