import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { recordDiff, sampleRecord } from './fixtures.js';
import { logicalBytes, scheduleRetention } from './retention.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewRecord } from './types.js';

const DAY = 86_400_000;
const NOW = 1_800_000_000_000;

let dir: string;
let store: SqliteStore;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-retention-'));
  store = SqliteStore.open(join(dir, 'r.db'));
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

const db = () => (store as unknown as { db: Database.Database }).db;
const chunkCount = () => (db().prepare('SELECT COUNT(*) AS n FROM chunks').get() as { n: number }).n;

/** A record with a ~20 KB system prompt (chunked) finished `ageDays` before NOW. */
function rec(seed: number, system: string, ageDays: number): NewRecord {
  const finishedAt = NOW - ageDays * DAY;
  return {
    ...sampleRecord(seed, { promptTokens: 5000 }),
    startedAt: finishedAt - 250,
    finishedAt,
    request: { messages: [{ role: 'system', content: system }, { role: 'user', content: `q${seed}` }], tools: null, params: {} },
  };
}

describe('retention', () => {
  it('deletes old records with their judgments and judged turns, collects the chunks only they referenced, and keeps what a consumer may still read', async () => {
    const alone = 'A system prompt no other record has. '.repeat(600);
    const shared = 'A system prompt two records share. '.repeat(600);
    const inputs = {
      old: rec(1, alone, 40),
      oldShared: rec(2, shared, 40),
      fresh: rec(3, shared, 1),
      inJudgeState: rec(4, 'Waiting for its next state. '.repeat(600), 40),
      forTrainer: rec(5, 'Judged, not yet batched. '.repeat(600), 40),
      unread: rec(6, 'Not read by the judge yet. '.repeat(600), 40),
    };
    const ids: Record<string, string> = {};
    for (const [name, r] of Object.entries(inputs)) ids[name] = (await store.append(r)).id;

    await store.putJudgment(ids.old!, { votes: [1] });
    const judged = { nextStateRecordId: ids.fresh!, scenario: 'default', sessionKey: 'tag:a', decision: 'anchor' as const, reward: 1, teacherCandidates: [null], judgment: {} };
    await store.appendJudgedTurn({ ...judged, turnRecordId: ids.old! }); // judged seq 1, consumed
    await store.appendJudgedTurn({ ...judged, turnRecordId: ids.forTrainer! }); // judged seq 2, not yet
    // The judge has read up to `unread` (exclusive), and still holds one turn in an open session.
    await store.commitConsumer('judge', (await store.get(ids.unread!))!.offset, 'judge.state', { correlator: { sessions: [{ last: ids.inJudgeState }] }, pending: [] });
    await store.commitConsumer('trainer-controller', 2, 'trainer.state', { pending: [] });
    const before = chunkCount();

    const result = await store.retain({ maxAgeMs: 30 * DAY }, { now: () => NOW, batch: 2 });
    expect(result.records).toBe(2);
    for (const gone of ['old', 'oldShared']) expect(await store.get(ids[gone]!)).toBeNull();
    for (const kept of ['fresh', 'inJudgeState', 'forTrainer', 'unread']) {
      expect(recordDiff((await store.get(ids[kept]!))!, inputs[kept as keyof typeof inputs]), kept).toEqual([]);
    }
    expect(await store.getJudgment(ids.old!)).toBeNull();
    expect((await store.readJudgedTurns(0, 10)).map((t) => t.turnRecordId)).toEqual([ids.forTrainer]);

    // `old`'s chunks went (its prompt ids and its own system prompt); the shared prompt's stayed for `fresh`.
    expect(result.chunks).toBeGreaterThan(0);
    expect(chunkCount()).toBe(before - result.chunks);
    const referenced = db().prepare('SELECT COUNT(*) AS n FROM chunks WHERE instr((SELECT group_concat(hex(request_chunks) || hex(prompt_chunks)) FROM records), hex(hash)) = 0').get() as { n: number };
    expect(referenced.n).toBe(0);
    expect(db().pragma('foreign_key_check')).toEqual([]);

    // A second run finds nothing more to do.
    expect(await store.retain({ maxAgeMs: 30 * DAY }, { now: () => NOW })).toMatchObject({ records: 0, reports: 0, chunks: 0, size: null });
  });

  it('collects unreferenced chunks, and a writer whose memo knew a collected chunk stores it again', async () => {
    const prompt = 'The same long prompt every turn. '.repeat(600);
    // Staged, never appended: its chunks are in the file and no record names them.
    const orphan = rec(7, 'An engine that refused the request. '.repeat(600), 0);
    expect(store.stage({ request: orphan.request, promptIds: orphan.promptIds })).not.toBeNull();
    const first = await store.append(rec(8, prompt, 0));
    const withFirst = chunkCount();
    // No record is old: only the orphan's chunks go.
    const result = await store.retain({ maxAgeMs: 30 * DAY }, { now: () => NOW });
    expect(result.records).toBe(0);
    expect(result.chunks).toBeGreaterThan(0);
    expect(chunkCount()).toBe(withFirst - result.chunks);
    expect((await store.get(first.id))!.request.messages).toHaveLength(2);

    // The next turn shares its prompt with one whose record is now deleted: the chunks the memo
    // remembers were collected, and must be written again, not referenced as they were.
    const victim = await store.append(rec(9, 'Shared by a record about to go. '.repeat(600), 40));
    await store.commitConsumer('judge', victim.offset + 1, 'judge.state', {});
    expect((await store.retain({ maxAgeMs: 30 * DAY }, { now: () => NOW })).records).toBe(1);
    const again = rec(10, 'Shared by a record about to go. '.repeat(600), 0);
    const { id } = await store.append(again);
    expect(recordDiff((await store.get(id))!, again)).toEqual([]);
  });

  describe('by size', () => {
    /** Twelve records of ~20 KB each, every one with a system prompt of its own, finished now. */
    async function fill(): Promise<string[]> {
      const ids: string[] = [];
      for (let i = 0; i < 12; i++) ids.push((await store.append(rec(100 + i, `System prompt number ${i}. `.repeat(700), 0))).id);
      return ids;
    }
    const offsetOf = async (id: string) => (await store.get(id))!.offset;

    it('deletes the oldest consumed records, and then their chunks, until the store is under the bound; unconsumed ones stay', async () => {
      const ids = await fill();
      const full = logicalBytes(db());
      // The judge has read the first nine and still holds the third; the trainer has not batched
      // the judged turn of the fourth; the last three are unread.
      await store.commitConsumer('judge', await offsetOf(ids[9]!), 'judge.state', { correlator: { sessions: [{ last: ids[2] }] } });
      const judged = { nextStateRecordId: ids[4]!, scenario: 'default', sessionKey: 'tag:a', decision: 'anchor' as const, reward: 1, teacherCandidates: [null], judgment: {} };
      await store.appendJudgedTurn({ ...judged, turnRecordId: ids[3]! });
      const bound = Math.floor(full * 0.7);

      const r = await store.retain({ maxBytes: bound });
      expect(r.size).toMatchObject({ before: expect.any(Number), bound, over: null });
      expect(r.size!.after).toBeLessThanOrEqual(bound);
      expect(logicalBytes(db())).toBe(r.size!.after);
      expect(r.records).toBeGreaterThan(0);
      expect(r.chunks).toBeGreaterThan(0);
      const left = new Set<string>();
      for (const id of ids) if ((await store.get(id)) !== null) left.add(id);
      // The oldest went first, skipping what a consumer may still read; no age bound is needed.
      const gone = ids.filter((id) => !left.has(id));
      expect(gone).toEqual(ids.slice(0, 9).filter((id) => id !== ids[2] && id !== ids[3] && id !== ids[4]).slice(0, gone.length));
      // Not every consumed record: only as many as the bound needed.
      expect(gone.length).toBeLessThan(6);
      for (const kept of [ids[2], ids[3], ids[4], ids[9], ids[10], ids[11]]) expect(left.has(kept!)).toBe(true);
      // The pages freed went back to the file system (a new file has incremental auto-vacuum).
      expect(db().pragma('auto_vacuum', { simple: true })).toBe(2);
      expect(r.vacuumed).toBeGreaterThan(0);
      expect(db().pragma('freelist_count', { simple: true })).toBe(0);
      // Under the bound: the next run deletes nothing.
      expect(await store.retain({ maxBytes: bound })).toMatchObject({ records: 0, chunks: 0, size: { over: null } });
    });

    it('stops over the bound, saying so, when only records a consumer may still read are left', async () => {
      const ids = await fill();
      await store.commitConsumer('judge', await offsetOf(ids[2]!), 'judge.state', {});
      const r = await store.retain({ maxBytes: 64 * 1024 });
      expect(r.records).toBe(2);
      expect(r.size).toMatchObject({ over: 'unconsumed' });
      expect(r.size!.after).toBeGreaterThan(64 * 1024);
      for (const id of ids.slice(2)) expect(await store.get(id)).not.toBeNull();
    });

    it('in a file made without incremental auto-vacuum, leaves the freed pages for later writes', async () => {
      await store.close();
      const path = join(dir, 'old.db');
      const old = new Database(path);
      old.pragma('auto_vacuum = NONE');
      old.exec('CREATE TABLE t (x)'); // the setting sticks once a table exists
      old.close();
      store = SqliteStore.open(path);
      expect(db().pragma('auto_vacuum', { simple: true })).toBe(0);
      const ids = await fill();
      await store.commitConsumer('judge', await offsetOf(ids[11]!) + 1, 'judge.state', {});
      const r = await store.retain({ maxBytes: Math.floor(logicalBytes(db()) / 2) });
      expect(r.size!.over).toBeNull();
      expect(r.vacuumed).toBe(0);
      expect(db().pragma('freelist_count', { simple: true })).toBeGreaterThan(0);
    });
  });

  it('the scheduled run says, naming the setting, when the store stays over the size bound because the consumers have not caught up', async () => {
    vi.useFakeTimers();
    try {
      const lines: string[] = [];
      const size = { before: 300 * 1048576, after: 200 * 1048576, bound: 100 * 1048576, over: 'unconsumed' as const };
      const stop = scheduleRetention({ retain: async () => ({ records: 7, reports: 0, responses: 0, chunks: 3, size, vacuumed: 12 }) }, { maxBytes: size.bound }, 1000, (l) => lines.push(l));
      await vi.advanceTimersByTimeAsync(1000);
      stop();
      expect(lines[0]).toBe('retention: deleted 7 record(s), 0 report(s) and 3 unreferenced chunk(s); gave 12 free page(s) back to the file system');
      expect(lines[1]).toMatch(/holds 200\.0 MiB, over reef\.retention\.max_size_mb \(100\.0 MiB\).*not consumed yet/);
    } finally {
      vi.useRealTimers();
    }
  });

  it('deletes a stored response in its record\'s transaction, and one whose record a consumer still holds by its own age', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await store.append(rec(10 + i, `prompt ${i}`, i < 3 ? 40 : 1))).id);
    const response = (id: string, ageDays: number) => ({ id, keyId: 'k1', scenario: 'default', previousId: null, session: `resp_${id}`, createdAt: NOW - ageDays * DAY, conversation: [{ role: 'user', content: 'q' }], inputItems: [], response: { id: `resp_${id}` } });
    // ids[2]: old, but the judge has not read it; ids[3]: fresh, its response written long ago
    // (a clock that moved back) goes by its own age too.
    for (const [i, id] of ids.entries()) await store.putResponse(response(id, 40));
    await store.commitConsumer('judge', (await store.get(ids[2]!))!.offset, 'judge.state', { pending: [] });
    const orphans = () => db().prepare('SELECT COUNT(*) AS n FROM responses r LEFT JOIN records c ON c.id = r.id WHERE c.id IS NULL').get() as { n: number };
    const seen: number[] = [];
    // After every committed write, as a kill there would leave the file: no response outlives its record.
    const result = await store.retain({ maxAgeMs: 30 * DAY }, { now: () => NOW, batch: 1, onCommit: (what) => what === 'records' && seen.push(orphans().n) });
    expect(seen).toEqual([0, 0]);
    expect(result).toMatchObject({ records: 2, responses: 2 });
    expect(await store.getResponse(ids[0]!, 'k1')).toBeNull();
    expect(await store.getResponse(ids[1]!, 'k1')).toBeNull();
    expect(await store.get(ids[2]!)).not.toBeNull();
    expect(await store.getResponse(ids[2]!, 'k1')).toBeNull();
    expect(await store.getResponse(ids[3]!, 'k1')).toBeNull();
    expect(await store.get(ids[3]!)).not.toBeNull();
  });

  it('keeps a fresh stored response, and answers it to the key that made it only', async () => {
    const id = (await store.append(rec(20, 'p', 1))).id;
    await store.putResponse({ id, keyId: 'k1', scenario: 'default', previousId: null, session: null, createdAt: NOW - DAY, conversation: [{ role: 'user', content: 'q' }], inputItems: [{ type: 'message', role: 'user', content: 'q' }], response: { id: `resp_${id}` } });
    expect(await store.retain({ maxAgeMs: 30 * DAY }, { now: () => NOW })).toMatchObject({ records: 0, responses: 0 });
    expect((await store.getResponse(id, 'k1'))?.conversation).toEqual([{ role: 'user', content: 'q' }]);
    expect(await store.getResponse(id, 'k2')).toBeNull();
    expect(await store.deleteResponse(id, 'k2')).toBe(false);
    expect(await store.deleteResponse(id, 'k1')).toBe(true);
    expect(await store.getResponse(id, 'k1')).toBeNull();
  });
});
