import type Database from 'better-sqlite3';
import { collectChunks, vacuum } from './retention.js';

/**
 * Deletion on request (`DELETE /reef/scenarios/{s}/sessions/{tag}`, `DELETE /reef/scenarios/{s}/records`):
 * a session's records, or all of a scenario's, go with everything that holds their text: their
 * judgments, their judged turns (hints quote the conversation), their stored responses, the
 * reports that reference them, the judge's pending rows of their turns, and then the chunks no
 * record references any more (retention.ts `collectChunks`).
 *
 * Bytes, not only rows: every connection the store opens runs with `secure_delete = FAST`
 * (sqlite-store.ts), so a deleted or rewritten row's cell is zeroed in its page; this deletion's
 * own transactions run with `secure_delete = ON`, which zeroes the overflow pages it frees too;
 * the free pages are then given back to the file system (incremental vacuum, where the file has
 * it) and the WAL is checkpointed and truncated, so no copy of a deleted page stays in it.
 *
 * Crash safety: the ids to delete are written first, as an intent row (`deletion/<job>` in kv,
 * record ids only, no text), and the intent is removed last. Each step is idempotent (a delete of
 * what is already gone deletes nothing), so a deletion stopped at any point is finished by running
 * it again: the gateway resumes every intent it finds at start, and a client's retry does too.
 */

export const DELETION_PREFIX = 'deletion/';
/** The judge's pending turn rows (judge/handler.ts PENDING_PREFIX), repeated here: the gateway does not import the judge. */
const JUDGE_PENDING_PREFIX = 'judge/pending/';

export interface DeletionTarget {
  scenario: string;
  /** The session tag (`x-reef-tag-session`); null: every record of the scenario. */
  session: string | null;
}

export interface DeletionCounts {
  records: number;
  judgments: number;
  judgedTurns: number;
  responses: number;
  reports: number;
  pendingJudgments: number;
  chunks: number;
  /** Free pages given back to the file system. */
  vacuumed: number;
  /** Whether the WAL was checkpointed and truncated (false: a reader held it; it is truncated by the next deletion or checkpoint). */
  walTruncated: boolean;
}

export const zeroCounts = (): DeletionCounts => ({ records: 0, judgments: 0, judgedTurns: 0, responses: 0, reports: 0, pendingJudgments: 0, chunks: 0, vacuumed: 0, walTruncated: false });

/** The ids of the records a target names, oldest first. */
export function targetIds(db: Database.Database, t: DeletionTarget): string[] {
  if (t.session === null) return db.prepare<[string], string>('SELECT id FROM records WHERE scenario = ? ORDER BY seq').pluck().all(t.scenario);
  return db.prepare<[string, string], string>("SELECT id FROM records WHERE scenario = ? AND json_extract(tags, '$.session') = ? ORDER BY seq").pluck().all(t.scenario, t.session);
}

/** Pages one incremental-vacuum step frees (as retention.ts). */
/** Tries of the WAL truncation, 50 ms apart, before the answer says it is not truncated yet. */
const WAL_TRIES = 100;
/** Rows per delete transaction: the gateway's own commits wait for one batch at most. */
const BATCH = 64;

/**
 * Deletes the rows of `ids` (records of `scenario`) and what holds their text, in transactions of
 * BATCH records. Safe to run again on the same ids.
 */
export async function deleteRows(
  db: Database.Database,
  scenario: string,
  ids: readonly string[],
  write: <T>(what: string, tx: () => T) => Promise<T>,
  pause: () => Promise<void>,
): Promise<Omit<DeletionCounts, 'chunks' | 'vacuumed' | 'walTruncated'>> {
  const counts = { records: 0, judgments: 0, judgedTurns: 0, responses: 0, reports: 0, pendingJudgments: 0 };
  const delJudgment = db.prepare<[string]>('DELETE FROM judgments WHERE record_id = ?');
  const delJudged = db.prepare<[string, string]>('DELETE FROM judged_turns WHERE turn_record_id = ? OR next_state_record_id = ?');
  const delResponse = db.prepare<[string]>('DELETE FROM responses WHERE id = ?');
  const delPending = db.prepare<[string]>('DELETE FROM kv WHERE key = ?');
  const delRecord = db.prepare<[string, string]>('DELETE FROM records WHERE id = ? AND scenario = ?');
  // A report names the receipts it rates; one that rates a deleted record goes with it (its
  // feedback is the user's words about that conversation).
  const reportsOf = db.prepare<[string, string], number>('SELECT r.seq FROM reports r, json_each(r.refs) j WHERE r.scenario = ? AND j.value = ?').pluck();
  const delReport = db.prepare<[number]>('DELETE FROM reports WHERE seq = ?');
  const tx = db.transaction((slice: readonly string[]) => {
    for (const id of slice) {
      counts.judgments += delJudgment.run(id).changes;
      counts.judgedTurns += delJudged.run(id, id).changes;
      counts.responses += delResponse.run(id).changes;
      counts.pendingJudgments += delPending.run(JUDGE_PENDING_PREFIX + id).changes;
      for (const seq of reportsOf.all(scenario, id)) counts.reports += delReport.run(seq).changes;
      counts.records += delRecord.run(id, scenario).changes;
    }
  });
  for (let i = 0; i < ids.length; i += BATCH) {
    const slice = ids.slice(i, i + BATCH);
    await write('deletion of records on request', () => tx.immediate(slice));
    await pause();
  }
  return counts;
}

/**
 * After the rows: the chunks they alone referenced, the free pages, the WAL. Answers chunks
 * deleted, pages vacuumed and whether the WAL was truncated.
 */
export async function scrub(
  db: Database.Database,
  write: <T>(what: string, tx: () => T) => Promise<T>,
  pause: () => Promise<void>,
): Promise<Pick<DeletionCounts, 'chunks' | 'vacuumed' | 'walTruncated'>> {
  const chunks = await collectChunks(db, BATCH, pause, undefined, write);
  // A step at a time, as retention does, so a chat completion's commit waits for one step at most.
  const vacuumed = await vacuum(db, pause, undefined, write);
  // The judge and the controller read the store every 100 ms or so, and a reader's snapshot holds
  // the checkpoint back; the gateway's connection does not wait in SQLite's busy handler, so it tries again here.
  let walTruncated = truncateWal(db);
  for (let i = 0; !walTruncated && i < WAL_TRIES; i++) {
    await new Promise((r) => setTimeout(r, 50));
    walTruncated = truncateWal(db);
  }
  return { chunks, vacuumed, walTruncated };
}

/**
 * Copies the WAL into the database and truncates it to zero bytes; false when another connection's
 * read kept the checkpoint from reaching the end (busy, or frames left), in which case the old
 * frames stay until a later checkpoint resets the WAL.
 */
export function truncateWal(db: Database.Database): boolean {
  if (db.pragma('journal_mode', { simple: true }) !== 'wal') return true;
  try {
    const [r] = db.pragma('wal_checkpoint(TRUNCATE)') as { busy: number; log: number; checkpointed: number }[];
    return r !== undefined && r.busy === 0 && r.log === 0;
  } catch (err) {
    // SQLITE_BUSY: another connection holds the lock the checkpoint needs; the caller tries again.
    if (String((err as { code?: unknown }).code ?? '').startsWith('SQLITE_BUSY')) return false;
    throw err;
  }
}

/** Runs `fn` with `secure_delete = ON` on this connection (freed overflow pages zeroed too), then puts FAST back. */
export async function secureDeleting<T>(db: Database.Database, fn: () => Promise<T>): Promise<T> {
  db.pragma('secure_delete = ON');
  try {
    return await fn();
  } finally {
    db.pragma('secure_delete = FAST');
  }
}
