import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CHUNK_BYTES, ChunkMemo, chunk, LEGACY_REF_BYTES, REF_BYTES, TAIL_CHUNK_MIN_BYTES, unchunk } from './chunks.js';
import { recordDiff, sampleRecord } from './fixtures.js';
import { newId } from './ids.js';
import { INSERT_RECORD_SQL, toRow } from './rows.js';
import { migrate } from './schema.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewRecord, RecordRequest } from './types.js';

describe('chunk', () => {
  it('keeps a payload of up to one chunk whole', () => {
    const small = Buffer.alloc(CHUNK_BYTES, 1);
    expect(chunk(small, { utf8: false })).toEqual({ refs: null, tail: small, chunks: [] });
  });

  it('cuts UTF-8 text only between characters, and puts it back byte for byte', () => {
    // Four-byte emoji and two-byte letters at every offset relative to the chunk boundaries.
    const text = Array.from({ length: 20_000 }, (_, i) => (i % 7 === 0 ? '👋' : i % 3 === 0 ? 'é' : 'a')).join('');
    const bytes = Buffer.from(text);
    const c = chunk(bytes, { utf8: true });
    expect(c.chunks.length).toBeGreaterThan(1);
    for (const part of [...c.chunks.map((x) => x.data), c.tail]) expect(Buffer.from(part.toString('utf8')).equals(part)).toBe(true);
    const byHash = new Map(c.chunks.map((x) => [x.hash.toString('hex'), x.data]));
    expect(unchunk(c.refs!, c.tail, (h) => byHash.get(h.toString('hex')), 'x').toString('utf8')).toBe(text);
  });

  it('cuts a run of bytes that is not UTF-8 where it stands (backing up through it looped for ever)', () => {
    // A lead byte 5 bytes before the boundary, then more continuation bytes than any character has.
    const odd = Buffer.concat([Buffer.alloc(CHUNK_BYTES - 5, 0x61), Buffer.from([0xe2]), Buffer.alloc(30, 0x80), Buffer.alloc(100, 0x61)]);
    const c = chunk(odd, { utf8: true });
    expect(c.chunks.map((x) => x.data.length)).toEqual([CHUNK_BYTES]);
    const byHash = new Map(c.chunks.map((x) => [x.hash.toString('hex'), x.data]));
    expect(unchunk(c.refs!, c.tail, (h) => byHash.get(h.toString('hex')), 'x').equals(odd)).toBe(true);
    const run = chunk(Buffer.alloc(3 * CHUNK_BYTES, 0x80), { utf8: true, whole: true });
    expect(run.chunks.map((x) => x.data.length)).toEqual([CHUNK_BYTES, CHUNK_BYTES, CHUNK_BYTES]);
  });

  it('cuts a grown payload at the same places, so the earlier full chunks are shared', () => {
    const turn1 = Buffer.from(Int32Array.from({ length: 5000 }, (_, i) => i * 31).buffer);
    const turn2 = Buffer.concat([turn1, Buffer.from(Int32Array.from({ length: 3000 }, (_, i) => i).buffer)]);
    const a = chunk(turn1, { utf8: false });
    const b = chunk(turn2, { utf8: false });
    expect(b.refs!.subarray(0, a.refs!.length).equals(a.refs!)).toBe(true);
    expect(a.refs!.length / REF_BYTES).toBe(Math.floor((5000 * 4 - 1) / CHUNK_BYTES));
  });
});

describe('chunk with whole', () => {
  const ids = (n: number) => Buffer.from(Int32Array.from({ length: n }, (_, i) => i * 7 + 1).buffer);
  const restore = (c: ReturnType<typeof chunk>) => {
    const byHash = new Map(c.chunks.map((x) => [x.hash.toString('hex'), x.data]));
    return unchunk(c.refs!, c.tail, (h) => byHash.get(h.toString('hex')), 'x');
  };

  it('puts a tail of TAIL_CHUNK_MIN_BYTES or more into a last chunk of its own, and keeps a shorter one', () => {
    const long = ids(5000); // two full chunks and a 3,616-byte tail
    const c = chunk(long, { utf8: false, whole: true });
    expect(c.chunks.map((x) => [x.data.length, x.last ?? false])).toEqual([[CHUNK_BYTES, false], [CHUNK_BYTES, false], [5000 * 4 - 2 * CHUNK_BYTES, true]]);
    expect(c.tail.length).toBe(0);
    expect(restore(c).equals(long)).toBe(true);
    // The full chunks are those of the same payload cut without `whole`.
    expect(c.refs!.subarray(0, 2 * REF_BYTES).equals(chunk(long, { utf8: false }).refs!)).toBe(true);

    const shortTail = ids(2 * (CHUNK_BYTES / 4) + TAIL_CHUNK_MIN_BYTES / 4 - 1);
    const d = chunk(shortTail, { utf8: false, whole: true });
    expect(d.chunks).toHaveLength(2);
    expect(d.tail.length).toBe(TAIL_CHUNK_MIN_BYTES - 4);
    expect(restore(d).equals(shortTail)).toBe(true);

    // Below one chunk: the whole payload is the last chunk, or stays whole when short.
    const one = ids(TAIL_CHUNK_MIN_BYTES / 4);
    expect(chunk(one, { utf8: false, whole: true }).chunks.map((x) => x.last)).toEqual([true]);
    expect(chunk(ids(TAIL_CHUNK_MIN_BYTES / 4 - 1), { utf8: false, whole: true }).refs).toBeNull();
  });

  it('neither finds a last chunk in the memo nor keeps one there', () => {
    const memo = new ChunkMemo();
    const payload = ids(3000);
    const first = chunk(payload, { utf8: false, memo, whole: true });
    memo.remember(first.chunks);
    const again = chunk(payload, { utf8: false, memo, whole: true });
    expect(again.chunks.map((x) => [x.stored, x.last ?? false])).toEqual([[true, false], [false, true]]);
    expect(memo.find(first.chunks[1]!.data)).toBeNull();
  });
});

describe('SqliteStore with chunked payloads', () => {
  let dir: string;
  let store: SqliteStore;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'reef-chunks-'));
    store = SqliteStore.open(join(dir, 'r.db'));
  });
  afterEach(async () => {
    await store?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const system = 'You are a careful agent. Déjà vu — ✓ 👋 '.repeat(700); // ~28k characters, multi-byte
  const turn = (seed: number, messages: RecordRequest['messages'], promptTokens: number): NewRecord => ({
    ...sampleRecord(seed, { promptTokens }),
    request: { messages: [{ role: 'system', content: system }, ...messages], tools: null, params: { max_tokens: 8 } },
  });
  const db = () => (store as unknown as { db: Database.Database }).db;
  const chunkRows = () => (db().prepare('SELECT COUNT(*) AS n FROM chunks').get() as { n: number }).n;

  it('round-trips long records exactly, and a grown transcript stores only its new chunks', async () => {
    const first = turn(1, [{ role: 'user', content: 'first' }], 6000);
    const a = await store.append(first);
    const afterFirst = chunkRows();
    expect(afterFirst).toBeGreaterThan(3);
    // Turn 2 resends turn 1's transcript and extends it; its prompt ids begin with turn 1's.
    const second = turn(2, [{ role: 'user', content: 'first' }, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'second' }], 6500);
    second.promptIds.set(first.promptIds);
    const b = await store.append(second);
    expect(chunkRows() - afterFirst).toBeLessThanOrEqual(2);
    expect(recordDiff((await store.get(a.id))!, first)).toEqual([]);
    expect(recordDiff((await store.get(b.id))!, second)).toEqual([]);
    const listed = await store.list({ scenario: 'default' });
    expect(listed.items.map((r) => r.request)).toEqual([first.request, second.request]);
    expect((await store.readFrom(1, 10)).map((r) => r.promptIds.length)).toEqual([6000, 6500]);
  });

  it('stage writes a record\'s chunks ahead of it, and the append then writes only the row', async () => {
    const bodyWith = (pad: number) => new TextEncoder().encode(JSON.stringify({ messages: [{ role: 'system', content: system }, { role: 'user', content: `hi${' '.repeat(pad)}` }], max_tokens: 8 }));
    // A tail long enough to be staged as a chunk of its own.
    let pad = 0;
    while (chunk(Buffer.from(bodyWith(pad)), { utf8: true }).tail.length < 2 * TAIL_CHUNK_MIN_BYTES) pad += 512;
    const body = bodyWith(pad);
    const rec: NewRecord = { ...sampleRecord(4, { promptTokens: 7000 }), request: { chatBody: body } };
    const staged = store.stage({ request: { chatBody: body }, promptIds: rec.promptIds });
    expect(staged).not.toBeNull();
    // The chunks are in the file before the record is appended.
    const stagedRows = chunkRows();
    expect(stagedRows).toBeGreaterThan(5);
    const { id } = await store.append({ ...rec, staged });
    expect(chunkRows()).toBe(stagedRows);
    // The tails were staged too: the row holds chunk references, not payload.
    const row = db().prepare('SELECT length(CAST(request AS BLOB)) AS request, length(prompt_ids) AS ids FROM records WHERE id = ?').get(id);
    expect(row).toEqual({ request: 0, ids: 0 });
    const got = (await store.get(id))!;
    expect(Array.from(got.promptIds)).toEqual(Array.from(rec.promptIds));
    expect(got.request.messages).toHaveLength(2);
    // Staged payloads of other ids or another body are not used: the append cuts its own.
    const other = { ...sampleRecord(5, { promptTokens: 7000 }), request: { chatBody: body } };
    const mixed = await store.append({ ...other, staged });
    expect(Array.from((await store.get(mixed.id))!.promptIds)).toEqual(Array.from(other.promptIds));
    const body2 = new TextEncoder().encode(JSON.stringify({ messages: [{ role: 'user', content: 'different '.repeat(2000) }] }));
    const third = await store.append({ ...rec, id: undefined, request: { chatBody: body2 }, staged });
    expect((await store.get(third.id))!.request.messages).toEqual([{ role: 'user', content: 'different '.repeat(2000) }]);
  });

  it('stores a body with runs of bytes that are not UTF-8 across its cuts, staged or not, and reads it back as the gateway decoded it', async () => {
    // The gateway's decoder turns each stray byte into U+FFFD and serves the request; its record must commit.
    // The first cut falls inside a run of stray bytes that starts after a lead byte, so the tail and
    // a later chunk begin with them too.
    const head = Buffer.from('{"messages":[{"role":"user","content":"');
    const stray = Buffer.concat([Buffer.alloc(CHUNK_BYTES - 5 - head.length, 0x61), Buffer.from([0xe2]), Buffer.alloc(CHUNK_BYTES + 40, 0x80)]);
    const body = new Uint8Array(Buffer.concat([head, stray, Buffer.from('"}]}')]));
    const promptIds = new Int32Array(3 * CHUNK_BYTES);
    const staged = store.stage({ request: { chatBody: body }, promptIds });
    expect(staged).not.toBeNull();
    for (const s of [staged, null]) {
      const { id } = await store.append({ ...sampleRecord(6, { promptTokens: 0 }), promptIds, request: { chatBody: body }, staged: s });
      const got = (await store.get(id))!;
      expect(got.request.messages).toEqual([{ role: 'user', content: new TextDecoder().decode(stray) }]);
      expect(got.promptIds.length).toBe(promptIds.length);
    }
  });

  it('stage answers null, leaving the append to report, when there is nothing it can do', async () => {
    expect(store.stage({ request: { chatBody: new TextEncoder().encode('[1]') }, promptIds: new Int32Array(9000) })).toBeNull();
    await store.close();
    expect(store.stage({ request: { chatBody: new TextEncoder().encode('{}') }, promptIds: new Int32Array(9000) })).toBeNull();
    store = SqliteStore.open(join(dir, 'r.db'));
  });

  it('a record whose chunk has gone missing fails its read with REEF_ERR_STORE, not with wrong data', async () => {
    const r = await store.append(turn(3, [{ role: 'user', content: 'x' }], 5000));
    db().exec('DELETE FROM chunks WHERE hash = (SELECT hash FROM chunks LIMIT 1)');
    await expect(store.get(r.id)).rejects.toMatchObject({ code: 'REEF_ERR_STORE', message: expect.stringMatching(/not in the store/) });
  });

  it('a chunk whose bytes do not hash to its address fails the read with REEF_ERR_STORE naming it (a damaged page, or bytes planted under another\'s digest)', async () => {
    const victim = turn(7, [{ role: 'user', content: 'mine' }], 5000);
    const r = await store.append(victim);
    const refs = db().prepare('SELECT request_chunks AS refs, chunk_ref_bytes AS width FROM records WHERE id = ?').get(r.id) as { refs: Buffer; width: number };
    expect(refs.width).toBe(REF_BYTES);
    expect(refs.refs.length % 32).toBe(0);
    const target = refs.refs.subarray(0, REF_BYTES);
    // Same length, other content: what a first writer of a colliding address would have stored.
    db().prepare('UPDATE chunks SET data = ? WHERE hash = ?').run(Buffer.alloc(CHUNK_BYTES, 0x41), target);
    for (const read of [() => store.get(r.id), () => store.list({ scenario: 'default' }), () => store.readFrom(0, 10)]) {
      await expect(read()).rejects.toMatchObject({ code: 'REEF_ERR_STORE', message: expect.stringContaining(`chunk ${target.toString('hex')}, whose stored bytes do not hash to it`) });
    }
  });
});

describe('a store written before chunk addresses were whole digests (schema step 4)', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'reef-chunks-old-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  /** Writes `rec` as a build at schema 4 did: 16-byte chunk keys and references, no chunk_ref_bytes column. */
  function writeOldStore(path: string, rec: NewRecord, id: string): void {
    const db = new Database(path);
    db.pragma('journal_mode = WAL');
    migrate(db, 4);
    const row = toRow(rec, id, null);
    const short = (h: Buffer) => h.subarray(0, LEGACY_REF_BYTES);
    const refs = (v: unknown) => (v === null ? null : Buffer.concat(Array.from({ length: (v as Buffer).length / REF_BYTES }, (_, i) => short((v as Buffer).subarray(i * REF_BYTES, (i + 1) * REF_BYTES)))));
    // Columns 21 and 22 of the row are its request and prompt chunk lists.
    // Its last value is the key id (schema step 7), which a schema-4 row has no column for.
    const values = row.values.slice(0, -1).map((v, i) => (i === 21 || i === 22 ? refs(v) : v));
    db.prepare('INSERT INTO scenarios (name, created_at, description) VALUES (?, 0, NULL)').run(rec.scenario);
    for (const c of row.chunks) db.prepare('INSERT OR IGNORE INTO chunks (hash, data) VALUES (?, ?)').run(short(c.hash), c.data);
    db.prepare(INSERT_RECORD_SQL.replace(', chunk_ref_bytes, key_id)', ')').replace(`, ${REF_BYTES}, ?)`, ')')).run(...values);
    db.close();
  }

  const system = 'An old system prompt, stored before step 5. '.repeat(800);
  const old = (seed: number): NewRecord => ({
    ...sampleRecord(seed, { promptTokens: 6000, keyId: null }),
    request: { messages: [{ role: 'system', content: system }, { role: 'user', content: `q${seed}` }], tools: null, params: {} },
  });

  it('upgrades it in place and reads its records exactly, checking each chunk against the 16 bytes it is addressed by', async () => {
    const path = join(dir, 'r.db');
    const rec = old(1);
    const oldId = newId();
    writeOldStore(path, rec, oldId);
    const store = SqliteStore.open(path);
    try {
      expect(recordDiff((await store.get(oldId))!, rec)).toEqual([]);
      // A new record of the same prefix is written under whole digests beside the old chunks.
      const fresh = old(2);
      fresh.promptIds.set(rec.promptIds);
      const { id } = await store.append(fresh);
      expect(recordDiff((await store.get(id))!, fresh)).toEqual([]);
      const db = (store as unknown as { db: Database.Database }).db;
      expect(db.prepare('SELECT chunk_ref_bytes AS w FROM records ORDER BY seq').all()).toEqual([{ w: LEGACY_REF_BYTES }, { w: REF_BYTES }]);
      expect(db.prepare('SELECT DISTINCT length(hash) AS n FROM chunks ORDER BY n').all()).toEqual([{ n: LEGACY_REF_BYTES }, { n: REF_BYTES }]);

      // An old chunk with other bytes is refused too, by the prefix it is addressed by.
      const oldRefs = (db.prepare('SELECT prompt_chunks AS refs FROM records WHERE id = ?').get(oldId) as { refs: Buffer }).refs;
      const target = oldRefs.subarray(0, LEGACY_REF_BYTES);
      db.prepare('UPDATE chunks SET data = ? WHERE hash = ?').run(Buffer.alloc(CHUNK_BYTES, 7), target);
      await expect(store.get(oldId)).rejects.toMatchObject({ code: 'REEF_ERR_STORE', message: expect.stringContaining(`chunk ${target.toString('hex')}, whose stored bytes do not hash to it`) });
      // The new record shares none of the old chunks, so it still reads.
      expect(recordDiff((await store.get(id))!, fresh)).toEqual([]);
    } finally {
      await store.close();
    }
  });
});
