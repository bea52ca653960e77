import type Database from 'better-sqlite3';
import { LEGACY_REF_BYTES, REF_BYTES } from './chunks.js';

/**
 * Retention (`reef.retention`): deletes records older than a maximum age with their judgments,
 * judged turns and stored responses (`/v1/responses`), old reports and stored responses, and then
 * the chunks no record references any more.
 *
 * What must hold whatever point a kill stops it at:
 * - No record the judge or the trainer-controller may still read is deleted. The judge reads
 *   records from its offset (consumer `judge`, a records rowid) and, by id, the turns its saved
 *   state holds (open sessions, pending judgments); the controller reads, by id, the turns of the
 *   judged turns from its offset (consumer `trainer-controller`, a judged_turns rowid) and any id
 *   its state holds. Each saves offset and state in one commit, and a record below the judge's
 *   offset that neither state names never comes back into either: they read new records by offset
 *   only. A missing offset keeps everything it would guard.
 * - A stored response goes with its record, in the record's transaction, so no response outlives
 *   the record it continues from; one whose record stays (a consumer still holds it) goes by its
 *   own age, as reports do: nothing reads stored responses by offset.
 * - No record points at a missing chunk. A record and its judgments go in one transaction; a chunk
 *   goes only in a transaction that first looks at every record committed since the scan that
 *   found it unreferenced, and that raises the chunk-GC generation, so a writer whose memo knew the
 *   chunk inserts it again (sqlite-store.ts writeBatch). A kill between the two phases leaves
 *   unreferenced chunks, which the next run collects.
 * Every write is a short IMMEDIATE transaction of at most `batch` rows, so the gateway's commits
 * wait for one batch at most, never for the whole run.
 *
 * The size bound (`maxBytes`) is on the store's logical size, the pages in use (page_count minus
 * the free list, times the page size): what the data takes, whether or not the file has given its
 * free pages back yet. Past it the oldest records a consumer is done with go, in order, with the
 * same guard and transactions as the age bound, then the chunks they alone referenced; the size is
 * measured again and, while still over, another round goes. Records a consumer may still read are
 * never taken for size: when only those are left, the run stops over the bound and says so
 * (`RetentionResult.size.over`, and the scheduler's log). Freed pages are given back to the file system by incremental
 * vacuum, a few at a time, where the file was created with auto_vacuum=INCREMENTAL (sqlite-store.ts
 * does for new files); in an older file they stay on the free list, which later writes reuse.
 */

export interface RetentionPolicy {
  /** Records (and reports) that finished longer ago than this are deleted; null: no age bound. @default null */
  maxAgeMs?: number | null;
  /** The logical size (bytes of pages in use) past which the oldest consumed records are deleted; null: no size bound. @default null */
  maxBytes?: number | null;
}

export interface RetentionOptions {
  /** Rows per write transaction. @default 64 */
  batch?: number;
  /** @default Date.now */
  now?: () => number;
  /** Awaited between transactions and scan pages, so the caller's event loop keeps running. */
  yield?: () => Promise<void>;
  /** Called after each committed write transaction (tests kill the process here). */
  onCommit?: (what: 'records' | 'reports' | 'responses' | 'chunks' | 'vacuum', n: number) => void;
  /**
   * Runs each write transaction; the store passes its lock wait (lock-wait.ts), so that a gateway
   * waits for another process's lock on a timer. @default runs it at once
   */
  write?: <T>(what: string, tx: () => T) => Promise<T>;
}

const runNow = async <T>(_what: string, tx: () => T): Promise<T> => tx();

export interface RetentionResult {
  /** Records deleted, by age and by size. */
  records: number;
  reports: number;
  /** Stored responses deleted by their own age (those deleted with their records are not counted apart). */
  responses: number;
  chunks: number;
  /**
   * With a size bound: the logical size before and after, and why it is still over, if it is:
   * `unconsumed`, only records a consumer may still read are left; `rounds`, the run took its
   * MAX_SIZE_ROUNDS and the next one goes on.
   */
  size: { before: number; after: number; bound: number; over: 'unconsumed' | 'rounds' | null } | null;
  /** Pages given back to the file system (0 where the file has no incremental auto-vacuum). */
  vacuumed: number;
}

/** Rounds of delete-then-collect a size run may take before it stops (each reads every record's chunk list). */
const MAX_SIZE_ROUNDS = 8;
/** Pages one incremental-vacuum transaction frees: 4 MiB at 4 KiB pages, so a commit waits for little. */
const VACUUM_STEP_PAGES = 1024;

const JUDGE = 'judge';
const CONTROLLER = 'trainer-controller';
/** A record id (ids.ts): 26 characters of Crockford base32. */
const ID_RE = /[0-9A-HJKMNP-TV-Z]{26}/g;

const setImmediateYield = () => new Promise<void>((r) => setImmediate(r));

/** The store's logical size: the bytes of the pages in use, free-list pages left out. */
export function logicalBytes(db: Database.Database): number {
  const pages = db.pragma('page_count', { simple: true }) as number;
  const free = db.pragma('freelist_count', { simple: true }) as number;
  return (pages - free) * (db.pragma('page_size', { simple: true }) as number);
}

export async function runRetention(db: Database.Database, policy: RetentionPolicy, opts: RetentionOptions = {}): Promise<RetentionResult> {
  const batch = opts.batch ?? 64;
  const pause = opts.yield ?? setImmediateYield;
  const write = opts.write ?? runNow;
  const maxAgeMs = policy.maxAgeMs ?? null;
  const maxBytes = policy.maxBytes ?? null;
  const cutoff = maxAgeMs === null ? null : (opts.now ?? Date.now)() - maxAgeMs;
  const result: RetentionResult = { records: 0, reports: 0, responses: 0, chunks: 0, size: null, vacuumed: 0 };

  // Records.
  const offsetOf = db.prepare<[string], number>('SELECT next_offset FROM consumer_offsets WHERE consumer = ?').pluck();
  const kvValues = db.prepare<[], string>('SELECT value FROM kv').pluck();
  const unconsumedTurns = db.prepare<[number], { turn: string; next: string }>(
    'SELECT turn_record_id AS turn, next_state_record_id AS next FROM judged_turns WHERE seq >= ?');
  const oldRecords = db.prepare<[number, number, number, number], { seq: number; id: string }>(
    'SELECT seq, id FROM records WHERE seq > ? AND seq < ? AND finished_at < ? ORDER BY seq LIMIT ?');
  // A record's own bytes (octet_length reads a blob's length from its header, not its pages).
  const oldestRecords = db.prepare<[number, number, number], { seq: number; id: string; bytes: number; request_chunks: Buffer | null; prompt_chunks: Buffer | null; chunk_ref_bytes: number }>(
    `SELECT seq, id, request_chunks, prompt_chunks, chunk_ref_bytes, octet_length(request) + octet_length(response) + octet_length(prompt_ids) + octet_length(output_ids)
       + octet_length(logprobs) + octet_length(topk_ids) + octet_length(topk_logprobs)
       + coalesce(octet_length(request_chunks), 0) + coalesce(octet_length(prompt_chunks), 0) AS bytes
     FROM records WHERE seq > ? AND seq < ? ORDER BY seq LIMIT ?`);
  const chunkBytes = db.prepare<[Buffer], number>('SELECT octet_length(data) FROM chunks WHERE hash = ?').pluck();
  const delJudgment = db.prepare<[string]>('DELETE FROM judgments WHERE record_id = ?');
  const delJudged = db.prepare<[string]>('DELETE FROM judged_turns WHERE turn_record_id = ?');
  const delRecord = db.prepare<[number]>('DELETE FROM records WHERE seq = ?');
  const delResponse = db.prepare<[string]>('DELETE FROM responses WHERE id = ?');

  const guard = db.transaction(() => {
    const judgeOffset = offsetOf.get(JUDGE);
    const controllerOffset = offsetOf.get(CONTROLLER) ?? 0;
    const keep = new Set<string>();
    for (const v of kvValues.all()) for (const m of v.matchAll(ID_RE)) keep.add(m[0]);
    for (const t of unconsumedTurns.iterate(controllerOffset)) {
      keep.add(t.turn);
      keep.add(t.next);
    }
    return { below: judgeOffset ?? 0, keep };
  });
  const deleteRecords = db.transaction((rows: { seq: number; id: string }[]) => {
    for (const r of rows) {
      delJudgment.run(r.id);
      delJudged.run(r.id);
      delResponse.run(r.id);
      delRecord.run(r.seq);
    }
  });
  const remove = async (doomed: { seq: number; id: string }[]) => {
    await write('deletion of old records', () => deleteRecords.immediate(doomed));
    result.records += doomed.length;
    opts.onCommit?.('records', doomed.length);
    await pause();
  };

  if (cutoff !== null) {
    const { below, keep } = guard();
    for (let after = 0; ; ) {
      const page = oldRecords.all(after, below, cutoff, batch);
      if (page.length === 0) break;
      after = page[page.length - 1]!.seq;
      const doomed = page.filter((r) => !keep.has(r.id));
      if (doomed.length > 0) await remove(doomed);
      else await pause();
    }

    // Reports: nothing reads them by offset.
    const oldReports = db.prepare<[number, number], number>('SELECT seq FROM reports WHERE created_at < ? ORDER BY seq LIMIT ?').pluck();
    const delReport = db.prepare<[number]>('DELETE FROM reports WHERE seq = ?');
    const deleteReports = db.transaction((seqs: number[]) => {
      for (const s of seqs) delReport.run(s);
    });
    for (;;) {
      const seqs = oldReports.all(cutoff, batch);
      if (seqs.length === 0) break;
      await write('deletion of old reports', () => deleteReports.immediate(seqs));
      result.reports += seqs.length;
      opts.onCommit?.('reports', seqs.length);
      await pause();
    }

    const oldResponses = db.prepare<[number, number], string>('SELECT id FROM responses WHERE created_at < ? ORDER BY created_at LIMIT ?').pluck();
    const deleteResponses = db.transaction((ids: string[]) => {
      for (const id of ids) delResponse.run(id);
    });
    for (;;) {
      const ids = oldResponses.all(cutoff, batch);
      if (ids.length === 0) break;
      await write('deletion of old stored responses', () => deleteResponses.immediate(ids));
      result.responses += ids.length;
      opts.onCommit?.('responses', ids.length);
      await pause();
    }
  }

  result.chunks = await collectChunks(db, batch, pause, opts.onCommit, write);

  if (maxBytes !== null) {
    const before = logicalBytes(db);
    let size = before;
    let stuck = false;
    for (let round = 0; size > maxBytes && round < MAX_SIZE_ROUNDS; round++) {
      // Taken again each round: consumers only move on, so this keeps no less than the last one.
      const { below, keep } = guard();
      // A record is counted with its own bytes and those of each chunk it names that no record
      // taken before it in this round named: a chunk that a record left behind also names does not
      // go, so a round may take too few (the next round, measured, takes more), never too many.
      // Counting its own bytes alone took every record there was where shared prompts fill the
      // chunks, for a bound that needed a few.
      let owed = size - maxBytes;
      let deleted = 0;
      const counted = new Set<string>();
      for (let after = 0; owed > 0; ) {
        const page = oldestRecords.all(after, below, batch);
        if (page.length === 0) break;
        after = page[page.length - 1]!.seq;
        const doomed: { seq: number; id: string }[] = [];
        for (const r of page) {
          if (owed <= 0) break;
          if (keep.has(r.id)) continue;
          doomed.push({ seq: r.seq, id: r.id });
          owed -= r.bytes;
          const refs = new Set<string>();
          addRefs(refs, r);
          for (const h of refs) {
            if (counted.has(h)) continue;
            counted.add(h);
            owed -= chunkBytes.get(Buffer.from(h, 'latin1')) ?? 0;
          }
        }
        if (doomed.length > 0) {
          await remove(doomed);
          deleted += doomed.length;
        } else await pause();
      }
      if (deleted === 0) {
        stuck = true;
        break;
      }
      result.chunks += await collectChunks(db, batch, pause, opts.onCommit, write);
      size = logicalBytes(db);
    }
    result.size = { before, after: size, bound: maxBytes, over: size <= maxBytes ? null : stuck ? 'unconsumed' : 'rounds' };
  }

  result.vacuumed = await vacuum(db, pause, opts.onCommit, write);
  return result;
}

/**
 * Gives free pages back to the file system, VACUUM_STEP_PAGES per transaction. Only a file created
 * with auto_vacuum=INCREMENTAL (2) can; in any other the free pages stay for later writes to reuse.
 */
export async function vacuum(db: Database.Database, pause: () => Promise<void>, onCommit: RetentionOptions['onCommit'], write: NonNullable<RetentionOptions['write']>): Promise<number> {
  if (db.pragma('auto_vacuum', { simple: true }) !== 2) return 0;
  let total = 0;
  for (;;) {
    const free = db.pragma('freelist_count', { simple: true }) as number;
    if (free === 0) break;
    await write('return of free pages', () => db.pragma(`incremental_vacuum(${Math.min(free, VACUUM_STEP_PAGES)})`));
    const n = free - (db.pragma('freelist_count', { simple: true }) as number);
    if (n <= 0) break;
    total += n;
    onCommit?.('vacuum', n);
    await pause();
  }
  return total;
}

/** Every digest a record's chunk lists name, as latin1 strings (compact set keys). */
function addRefs(into: Set<string>, row: { request_chunks: Buffer | null; prompt_chunks: Buffer | null; chunk_ref_bytes: number }): void {
  const width = row.chunk_ref_bytes === LEGACY_REF_BYTES ? LEGACY_REF_BYTES : REF_BYTES;
  for (const refs of [row.request_chunks, row.prompt_chunks]) {
    if (refs === null) continue;
    for (let o = 0; o + width <= refs.length; o += width) into.add(refs.toString('latin1', o, o + width));
  }
}

/**
 * Mark and sweep. The chunks to consider are those present before the scan starts; the scan
 * pages through the records up to the newest one then (no long read transaction, which would hold
 * back WAL checkpoints); each sweep transaction first adds the references of records committed
 * since, so a chunk a new record shares is never taken.
 */
export async function collectChunks(db: Database.Database, batch: number, pause: () => Promise<void>, onCommit?: RetentionOptions['onCommit'], write: NonNullable<RetentionOptions['write']> = runNow): Promise<number> {
  const head = db.prepare<[], number | null>('SELECT MAX(seq) FROM records').pluck();
  const chunkPage = db.prepare<[Buffer, number], Buffer>('SELECT hash FROM chunks WHERE hash > ? ORDER BY hash LIMIT ?').pluck();
  const refPage = db.prepare<[number, number, number], { seq: number; request_chunks: Buffer | null; prompt_chunks: Buffer | null; chunk_ref_bytes: number }>(
    'SELECT seq, request_chunks, prompt_chunks, chunk_ref_bytes FROM records WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?');
  const delChunk = db.prepare<[Buffer]>('DELETE FROM chunks WHERE hash = ?');
  const bump = db.prepare('UPDATE chunk_gc SET generation = generation + 1 WHERE id = 1');

  let scanned = head.get() ?? 0;
  const candidates: Buffer[] = [];
  for (let after: Buffer = Buffer.alloc(0); ; ) {
    const page = chunkPage.all(after, 1024);
    if (page.length === 0) break;
    candidates.push(...page);
    after = page[page.length - 1]!;
    await pause();
  }
  if (candidates.length === 0) return 0;
  const referenced = new Set<string>();
  for (let after = 0; after < scanned; ) {
    const page = refPage.all(after, scanned, batch);
    if (page.length === 0) break;
    for (const row of page) addRefs(referenced, row);
    after = page[page.length - 1]!.seq;
    await pause();
  }

  const sweep = db.transaction((hashes: Buffer[]) => {
    // Records committed since the scan: few, and read inside the lock that keeps more from coming.
    const now = head.get() ?? 0;
    for (let after = scanned; after < now; ) {
      const page = refPage.all(after, now, 256);
      if (page.length === 0) break;
      for (const row of page) addRefs(referenced, row);
      after = page[page.length - 1]!.seq;
    }
    scanned = Math.max(scanned, now);
    let n = 0;
    for (const h of hashes) if (!referenced.has(h.toString('latin1'))) n += delChunk.run(h).changes;
    if (n > 0) bump.run();
    return n;
  });
  let deleted = 0;
  for (let i = 0; i < candidates.length; i += batch) {
    const slice = candidates.slice(i, i + batch).filter((h) => !referenced.has(h.toString('latin1')));
    if (slice.length === 0) continue;
    // A try that found the lock held ran none of the sweep: its references and `scanned` are as before.
    const n = await write('sweep of unreferenced chunks', () => sweep.immediate(slice));
    deleted += n;
    if (n > 0) onCommit?.('chunks', n);
    await pause();
  }
  return deleted;
}

const mib = (bytes: number): string => (bytes / 1048576).toFixed(1);

/**
 * Runs `store.retain(policy)` soon after start and then every `intervalMs`, logging what each run
 * deleted; a failed run is logged and the next one tries again. Answers a stop function.
 */
export function scheduleRetention(
  store: { retain(policy: RetentionPolicy): Promise<RetentionResult> },
  policy: RetentionPolicy,
  intervalMs: number,
  log: (line: string) => void,
): () => void {
  let stopped = false;
  const run = async () => {
    try {
      const r = await store.retain(policy);
      if (r.records + r.reports + r.responses + r.chunks > 0) log(`retention: deleted ${r.records} record(s), ${r.reports} report(s)${r.responses > 0 ? `, ${r.responses} stored response(s)` : ''} and ${r.chunks} unreferenced chunk(s)${r.vacuumed > 0 ? `; gave ${r.vacuumed} free page(s) back to the file system` : ''}`);
      // Said every run while it holds: the bound is not met, and only the consumers can change that.
      if (r.size?.over === 'unconsumed') {
        log(`retention: the record store holds ${mib(r.size.after)} MiB, over reef.retention.max_size_mb (${mib(r.size.bound)} MiB), and what is left is records the judge or the trainer-controller has not consumed yet (or still holds), which retention never deletes; it goes once they are consumed`);
      }
    } catch (err) {
      if (!stopped) log(`retention: ${(err as Error).message}; trying again in ${Math.round(intervalMs / 1000)} s`);
    }
  };
  // Not at once: a gateway that starts is busy loading its tokenizer and warming up.
  const first = setTimeout(() => void run(), Math.min(intervalMs, 60_000));
  const every = setInterval(() => void run(), intervalMs);
  first.unref();
  every.unref();
  return () => {
    stopped = true;
    clearTimeout(first);
    clearInterval(every);
  };
}
