import Database from 'better-sqlite3';
import { ReefError } from '../../runtime/errors.js';
import { Checkpointer } from './checkpointer.js';
import { type Chunk, ChunkMemo, unchunk } from './chunks.js';
import { GroupCommitter, type GroupCommitOptions } from './group-commit.js';
import { newId } from './ids.js';
import { JudgedTurnTable } from './judged-turns.js';
import { type LockWait, lockBusyError, withWriteLock } from './lock-wait.js';
import { ReportTable } from './reports.js';
import { ResponseTable, type ResponseStore, type StoredResponse } from './responses.js';
import { type RetentionOptions, type RetentionPolicy, type RetentionResult, runRetention } from './retention.js';
import {
  FULL_COLUMNS, INSERT_CHUNK_SQL, INSERT_RECORD_SQL, SUMMARY_COLUMNS, checkScenarioName, chunkPayloads, invalid, jsonText, stagedChunks, toRecord, toRow, toSummary,
  type FullRowShape, type RecordRow, type SummaryRowShape,
} from './rows.js';
import { checkSchema, migrate } from './schema.js';
import { DELETION_PREFIX, type DeletionCounts, type DeletionTarget, deleteRows, scrub, secureDeleting, targetIds, truncateWal, zeroCounts } from './deletion.js';
import { NO_ROWS, type StateRows } from './types.js';
import type {
  AgentRecord, JudgedPoint, JudgedTurn, JudgedTurnView, ListOptions, NewJudgedTurn, NewRecord, NewReport, Page, Receipt, RecordStore, RecordSummary, Report, Scenario, StagedPayloads, StoreStats,
} from './types.js';

export interface SqliteStoreOptions extends Partial<Omit<GroupCommitOptions, 'lockWait'>> {
  /**
   * What a receipt survives (`reef.durability`; every process that opens the store passes it).
   * - `'power'`: WAL + `synchronous=FULL`. The WAL is fsynced at every commit, so a receipt
   *   survives power loss and an OS crash too. Group commit pays one fsync per batch, not per record.
   * - `'process'`: WAL + `synchronous=NORMAL`. A commit is in the WAL file (the OS page cache) when
   *   it returns, so it survives kill -9 of any process, but an OS crash or power loss can take back
   *   the commits since the WAL was last synced (the background checkpoint syncs it every
   *   `checkpointIntervalMs`), receipts already sent among them.
   * The default is `'power'`: a receipt is a promise that the record is kept, and NORMAL breaks it
   * on the one failure the agent's own machine cannot rule out.
   * @default 'power'
   */
  durability?: 'process' | 'power';
  /**
   * `'background'` checkpoints the WAL from a worker thread (see checkpointer.ts); `'inline'`
   * leaves it to SQLite's automatic checkpoint inside commits. @default 'background'
   */
  checkpoint?: 'background' | 'inline';
  /** How often the background checkpoint runs. @default 200 */
  checkpointIntervalMs?: number;
  /**
   * How long a write waits for another process's write lock (the judge and the trainer-controller
   * commit to the same file); past it the write fails, nothing of it written: REEF_ERR_STORE_BUSY
   * with `lockWait: 'async'`, REEF_ERR_STORE (SQLITE_BUSY) with `'block'`. Opening the store waits
   * this long either way. @default 5000
   */
  busyTimeoutMs?: number;
  /**
   * Where a write waits for that lock (lock-wait.ts). `'block'`: in SQLite's busy handler, on the
   * calling thread, so the caller's event loop stops for the wait; the judge and the
   * trainer-controller serve no client, and their commits mark an in-memory snapshot saved after
   * the await, which is safe only if no other handler runs in between. `'async'`: on a timer,
   * retried with backoff while the event loop keeps running; every stream of the gateway, which
   * opens its store so, would otherwise stop for as long as another process commits. @default 'block'
   */
  lockWait?: 'block' | 'async';
  /** With `lockWait: 'async'`: the pause after the first busy try, doubling to `maxMs`. @default {firstMs: 1, maxMs: 50} */
  lockBackoff?: { firstMs: number; maxMs: number };
  /** What sets `busyTimeoutMs`, named in REEF_ERR_STORE_BUSY's message. @default 'busyTimeoutMs' */
  lockWaitSetting?: string;
  /**
   * Open an existing store for reading only (`reef export`): no schema upgrade, no checkpoints, and
   * a file the user may not write (a copied or mounted backup) still opens. A store whose schema is
   * not this build's is refused with what to do, since reading it could misread its columns.
   */
  readonly?: boolean;
  /** Characters of requests and responses that end a page of `list` (tests set it small). @default PAGE_BYTES */
  pageBytes?: number;
}

const MAX_PAGE = 1000;
/**
 * A page of summaries ends once its requests and responses reach this many characters (after at
 * least one record), whatever the limit: a summary carries the whole request, ~0.5 MB for an
 * OpenClaw turn, and 1,000 of those are past the longest string V8 can make of the JSON reply.
 * Clients follow `next` as ever.
 */
export const PAGE_BYTES = 32 * 1024 * 1024;
const WAL_SAFETY_PAGES = 16_384;
/** A WAL file is truncated back to this size when SQLite restarts it. */
const WAL_SIZE_LIMIT = 64 * 1024 * 1024;

function parseCursor(after: string | null | undefined): number | null {
  if (after === undefined || after === null) return null;
  if (!/^\d{1,15}$/.test(after)) throw invalid(`cursor ${JSON.stringify(after)} is not one this store returned`);
  return Number(after);
}

function pageLimit(limit: number | undefined): number {
  if (limit === undefined) return 50;
  if (!Number.isSafeInteger(limit) || limit < 1) throw invalid('limit must be a positive integer');
  return Math.min(limit, MAX_PAGE);
}

function pageOrder(order: unknown): 'asc' | 'desc' {
  if (order === undefined || order === null) return 'asc';
  if (order !== 'asc' && order !== 'desc') throw invalid(`order must be asc or desc, got ${JSON.stringify(order)}`);
  return order;
}

function checkOffset(offset: unknown): number {
  if (!Number.isSafeInteger(offset) || (offset as number) < 0) throw invalid('offset must be a non-negative integer');
  return offset as number;
}

function checkKey(key: unknown, what: string): string {
  if (typeof key !== 'string' || key.length === 0) throw invalid(`${what} must be a non-empty string`);
  return key;
}

/**
 * Why a store did not open, naming the file and what to do: SQLite's own message ("file is not a
 * database", "database is locked") named neither, and `reef export` printed it as a stack trace.
 */
function openFailure(path: string, err: unknown, readonly: boolean, busyMs: number): unknown {
  if (err instanceof ReefError) return err;
  const code = String((err as { code?: unknown }).code ?? '');
  const message = (err as Error).message;
  let reason: string;
  if (code === 'SQLITE_NOTADB') {
    reason = `${path} is not a SQLite database (damaged, or another kind of file); restore it from a backup or move it aside`;
  } else if (code.startsWith('SQLITE_CORRUPT')) {
    reason = `${path} is damaged (${message}); restore it from a backup or move it aside`;
  } else if (code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED')) {
    reason = `${path} is locked by another process (waited ${busyMs} ms for it); stop whatever holds it (another Reef stack on the same data dir, an open sqlite3 shell) and try again`;
  } else if (readonly && code === 'SQLITE_READONLY_DIRECTORY') {
    // SQLite reads a WAL store through a -shm file it creates beside it, even read-only.
    reason = `cannot read ${path}: SQLite must create ${path}-shm beside it and its directory is not writable; copy the store to a writable directory first`;
  } else if (code.startsWith('SQLITE_') || /^Cannot open database\b/.test(message)) {
    // The second: better-sqlite3's own refusal, as of a file in a directory that does not exist.
    reason = `cannot open ${path}${readonly ? '' : ' for writing'}: ${message}`;
  } else {
    return err;
  }
  return new ReefError('REEF_ERR_STORE', { reason }, { cause: err });
}

function lockWaitOf(options: SqliteStoreOptions): LockWait {
  const budgetMs = options.busyTimeoutMs ?? 5000;
  if (!Number.isSafeInteger(budgetMs) || budgetMs < 0) throw invalid(`busyTimeoutMs must be a non-negative integer of milliseconds, got ${String(budgetMs)}`);
  const mode = options.lockWait ?? 'block';
  if (mode !== 'block' && mode !== 'async') throw invalid(`lockWait must be 'block' or 'async', got ${JSON.stringify(mode)}`);
  const { firstMs, maxMs } = options.lockBackoff ?? { firstMs: 1, maxMs: 50 };
  if (!(firstMs > 0) || !(maxMs >= firstMs)) throw invalid(`lockBackoff must have 0 < firstMs <= maxMs, got ${JSON.stringify(options.lockBackoff)}`);
  return { mode, budgetMs, setting: options.lockWaitSetting ?? 'busyTimeoutMs', firstMs, maxMs };
}

interface ScenarioRow {
  name: string;
  created_at: number;
  description: string | null;
}
const toScenario = (r: ScenarioRow): Scenario => ({ name: r.name, createdAt: r.created_at, description: r.description });

export class SqliteStore implements RecordStore, ResponseStore {
  private closed = false;
  private closing: Promise<void> | null = null;
  private retaining: Promise<RetentionResult> | null = null;
  private checkpointer: Checkpointer | null = null;
  private readonly committer: GroupCommitter<RecordRow>;
  private readonly chunkMemo = new ChunkMemo();
  private readonly reports: ReportTable;
  private readonly responses: ResponseTable;
  private readonly judged: JudgedTurnTable;
  private readonly sql;
  /** getStateFields' statements, by the number of paths. */
  private readonly fieldStatements = new Map<number, Database.Statement>();
  private readonly commitConsumerTx: (consumer: string, offset: number, key: string, value: string, puts: readonly [string, string][], deletes: readonly string[]) => void;
  private readonly putJudgmentTx: (recordId: string, judgment: string) => void;
  private readonly putBatchTurnsTx: (batchId: string, scenario: string, turns: readonly string[], now: number) => void;
  /** Inserts chunks; answers the GC generation they are known stored at. */
  private readonly insertChunksTx: (chunks: Chunk[]) => number;

  /** Opens (creating if needed) the store at `path` and brings its schema up to date. */
  static open(path: string, options: SqliteStoreOptions = {}): SqliteStore {
    const lock = lockWaitOf(options);
    const busyMs = lock.budgetMs;
    const commit: GroupCommitOptions<RecordRow> = {
      maxBatch: options.maxBatch ?? 256,
      maxDelayMs: options.maxDelayMs ?? 0,
      onCommit: options.onCommit ?? null,
      company: options.company ?? null,
      lockWait: lock.mode === 'async' ? { ...lock, busyError: (row, ms, cause) => lockBusyError(lock, path, `the append of record ${String(row.values[0])}`, ms, cause) } : null,
    };
    if (options.readonly === true) {
      let db: Database.Database | null = null;
      try {
        db = new Database(path, { readonly: true, fileMustExist: true });
        db.pragma(`busy_timeout = ${busyMs}`);
        checkSchema(db);
        return new SqliteStore(db, path, commit, null, options.pageBytes ?? PAGE_BYTES, lock);
      } catch (err) {
        db?.close();
        throw openFailure(path, err, true, busyMs);
      }
    }
    let db: Database.Database;
    try {
      db = new Database(path);
    } catch (err) {
      throw openFailure(path, err, false, busyMs);
    }
    const synchronous = options.durability === 'process' ? 'NORMAL' : 'FULL';
    const background = options.checkpoint !== 'inline' && path !== ':memory:' && path !== '';
    try {
      // Before the first table, the only time it takes: a file made now can give the pages
      // retention frees back to the file system (retention.ts). In an existing file it does
      // nothing until a VACUUM, which Reef never runs by itself.
      db.pragma('auto_vacuum = INCREMENTAL');
      db.pragma('journal_mode = WAL');
      db.pragma(`synchronous = ${synchronous}`);
      db.pragma('foreign_keys = ON');
      // A deleted or rewritten row's cell is zeroed in its page, at no extra I/O: deletion on request
      // (deletion.ts) must leave no byte of what it deleted, and the judge and the controller rewrite
      // rows that quote conversations on every commit.
      db.pragma('secure_delete = FAST');
      db.pragma(`busy_timeout = ${busyMs}`);
      // With background checkpoints the automatic one (64 MB of WAL) only catches a stalled worker.
      if (background) db.pragma(`wal_autocheckpoint = ${WAL_SAFETY_PAGES}`);
      db.pragma(`journal_size_limit = ${WAL_SIZE_LIMIT}`);
      migrate(db);
      // Opening may wait (nothing is served yet); from here on a busy write fails at once and
      // withWriteLock or the group committer waits for the lock on a timer.
      if (lock.mode === 'async') db.pragma('busy_timeout = 0');
      // Started with the first append: a store used only for offsets and state has no WAL to speak
      // of, and the worker costs tens of ms to start and stop.
      const interval = options.checkpointIntervalMs ?? 200;
      const checkpointer = background ? () => new Checkpointer(path, interval, synchronous) : null;
      return new SqliteStore(db, path, commit, checkpointer, options.pageBytes ?? PAGE_BYTES, lock);
    } catch (err) {
      db.close();
      throw openFailure(path, err, false, busyMs);
    }
  }

  private constructor(
    private readonly db: Database.Database,
    readonly path: string,
    commitOptions: GroupCommitOptions<RecordRow>,
    private readonly startCheckpointer: (() => Checkpointer) | null,
    private readonly pageBytes: number,
    private readonly lock: LockWait,
  ) {
    const insertRecord = db.prepare(INSERT_RECORD_SQL);
    const insertChunk = db.prepare(INSERT_CHUNK_SQL);
    const ensureScenario = db.prepare('INSERT OR IGNORE INTO scenarios (name, created_at, description) VALUES (?, ?, ?)');
    // Scenarios are never deleted, so one this store has seen committed needs no statement again.
    const knownScenarios = new Set<string>();
    const gcGeneration = db.prepare<[], number>('SELECT generation FROM chunk_gc WHERE id = 1').pluck();
    const writeBatch = db.transaction((rows: RecordRow[]) => {
      const now = Date.now();
      // Read inside the write lock: no collection can delete a chunk between this read and the commit.
      const gen = gcGeneration.get() ?? 0;
      const offsets = rows.map((row) => {
        const scenario = row.values[1] as string;
        if (!knownScenarios.has(scenario)) ensureScenario.run(scenario, now, null);
        // OR IGNORE: a chunk already stored (another session's identical prefix) writes no page. One
        // known stored only before the last collection may be gone, so it is written again.
        for (const c of row.chunks) if (!c.stored || c.gen !== gen) insertChunk.run(c.hash, c.data);
        return Number(insertRecord.run(...row.values).lastInsertRowid);
      });
      return { offsets, gen };
    });
    // IMMEDIATE takes the write lock up front, so a batch never fails half-way on a lock upgrade.
    // Offsets are rowids handed out inside that lock, so offset order is commit order even with
    // several writing processes: a consumer that has read offset N never later meets a smaller one.
    this.committer = new GroupCommitter((rows) => {
      const { offsets, gen } = writeBatch.immediate(rows);
      // Only now are the chunks and scenarios certainly in the file; a rolled-back batch leaves the memos alone.
      for (const row of rows) {
        this.chunkMemo.remember(row.chunks, gen);
        knownScenarios.add(row.values[1] as string);
      }
      return offsets;
    }, commitOptions);
    const chunksTx = db.transaction((chunks: Chunk[]) => {
      for (const c of chunks) insertChunk.run(c.hash, c.data);
      return gcGeneration.get() ?? 0;
    });
    this.insertChunksTx = (chunks) => chunksTx.immediate(chunks);
    this.reports = new ReportTable(db);
    this.responses = new ResponseTable(db);
    this.judged = new JudgedTurnTable(db);
    this.sql = {
      ensureScenario,
      recordById: db.prepare<[string], FullRowShape>(`SELECT ${FULL_COLUMNS} FROM records WHERE id = ?`),
      recordExists: db.prepare<[string], { one: number }>('SELECT 1 AS one FROM records WHERE id = ?'),
      listAsc: db.prepare<[string, number, number], SummaryRowShape>(
        `SELECT ${SUMMARY_COLUMNS} FROM records WHERE scenario = ? AND seq > ? ORDER BY seq ASC LIMIT ?`),
      listDesc: db.prepare<[string, number, number], SummaryRowShape>(
        `SELECT ${SUMMARY_COLUMNS} FROM records WHERE scenario = ? AND seq < ? ORDER BY seq DESC LIMIT ?`),
      readFrom: db.prepare<[number, number], FullRowShape>(`SELECT ${FULL_COLUMNS} FROM records WHERE seq >= ? ORDER BY seq LIMIT ?`),
      head: db.prepare<[], { head: number | null }>('SELECT MAX(seq) AS head FROM records'),
      chunk: db.prepare<[Buffer], { data: Buffer }>('SELECT data FROM chunks WHERE hash = ?'),
      getOffset: db.prepare<[string], { next_offset: number }>('SELECT next_offset FROM consumer_offsets WHERE consumer = ?'),
      setOffset: db.prepare<[string, number, number]>(
        `INSERT INTO consumer_offsets (consumer, next_offset, updated_at) VALUES (?, ?, ?)
         ON CONFLICT (consumer) DO UPDATE SET next_offset = excluded.next_offset, updated_at = excluded.updated_at`),
      getState: db.prepare<[string], { value: string }>('SELECT value FROM kv WHERE key = ?'),
      stateUpdatedAt: db.prepare<[string], { updated_at: number }>('SELECT updated_at FROM kv WHERE key = ?'),
      putState: db.prepare<[string, string, number]>(
        `INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at`),
      deleteState: db.prepare<[string]>('DELETE FROM kv WHERE key = ?'),
      statesIn: db.prepare<[string, string], { key: string; value: string }>('SELECT key, value FROM kv WHERE key >= ? AND key < ? ORDER BY key'),
      getJudgment: db.prepare<[string], { judgment: string }>('SELECT judgment FROM judgments WHERE record_id = ?'),
      putJudgment: db.prepare<[string, string, number]>(
        `INSERT INTO judgments (record_id, judgment, updated_at) VALUES (?, ?, ?)
         ON CONFLICT (record_id) DO UPDATE SET judgment = excluded.judgment, updated_at = excluded.updated_at`),
      getScenario: db.prepare<[string], ScenarioRow>('SELECT * FROM scenarios WHERE name = ?'),
      listScenarios: db.prepare<[], ScenarioRow>('SELECT * FROM scenarios ORDER BY name'),
    };
    const sql = this.sql;
    const consumerTx = db.transaction((consumer: string, offset: number, key: string, value: string, puts: readonly [string, string][], deletes: readonly string[]) => {
      const now = Date.now();
      sql.setOffset.run(consumer, offset, now);
      sql.putState.run(key, value, now);
      for (const [k, v] of puts) sql.putState.run(k, v, now);
      for (const k of deletes) sql.deleteState.run(k);
    });
    this.commitConsumerTx = (c, o, k, v, p, d) => consumerTx.immediate(c, o, k, v, p, d);
    const judgmentTx = db.transaction((recordId: string, judgment: string) => {
      if (sql.recordExists.get(recordId) === undefined) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `record ${recordId}` });
      sql.putJudgment.run(recordId, judgment, Date.now());
    });
    this.putJudgmentTx = (r, j) => judgmentTx.immediate(r, j);
    if (!db.readonly) {
      const insertBatchTurn = db.prepare<[string, string, string, number]>('INSERT OR IGNORE INTO batch_turns (batch_id, scenario, turn_record_id, created_at) VALUES (?, ?, ?, ?)');
      const batchTx = db.transaction((batchId: string, scenario: string, turns: readonly string[], now: number) => {
        for (const t of turns) insertBatchTurn.run(batchId, scenario, t, now);
      });
      this.putBatchTurnsTx = (b, sc, t, n) => batchTx.immediate(b, sc, t, n);
    } else {
      this.putBatchTurnsTx = () => {
        throw new ReefError('REEF_ERR_STORE', { reason: 'the store is open read-only' });
      };
    }
  }

  private live(): void {
    if (this.closed) throw new ReefError('REEF_ERR_STORE_CLOSED', { path: this.path });
  }

  /** Runs one write (a transaction begun IMMEDIATE, or one statement), waiting for the lock as `lockWait` says. */
  private writing<T>(what: string, write: () => T): Promise<T> {
    return withWriteLock(this.lock, this.path, what, write);
  }

  /**
   * Cuts a record's request and prompt ids into chunks, their tails included (`chunk` with
   * `whole`), and writes the chunks not stored yet, ahead of the record itself; pass the answer as
   * the record's `staged`. The gateway calls this while the engine works on the request, so the
   * commit that gates the receipt writes a row of chunk references and the output. Chunks are
   * content-addressed and shared, so chunks whose record never comes (the engine refused the
   * request) are unreferenced rows, not an inconsistency. Null when there is nothing to gain or
   * staging failed, the write lock being held by another process among the reasons (with
   * `lockWait: 'async'` that fails at once rather than waiting on the event loop); the append then
   * does all the work itself and reports any error.
   */
  stage(payloads: { request: NewRecord['request']; promptIds: Int32Array }): StagedPayloads | null {
    if (this.closed) return null;
    try {
      const staged = chunkPayloads(payloads.request, payloads.promptIds, this.chunkMemo, true);
      const fresh = stagedChunks(staged).filter((c) => !c.stored);
      if (fresh.length > 0) {
        const gen = this.insertChunksTx(fresh);
        this.chunkMemo.remember(fresh, gen);
        for (const c of fresh) {
          c.stored = true;
          c.gen = gen;
        }
      }
      return staged;
    } catch {
      return null;
    }
  }

  async append(record: NewRecord): Promise<Receipt> {
    this.live();
    let row: RecordRow;
    const id = record.id ?? newId();
    try {
      row = toRow(record, id, this.chunkMemo);
    } catch (err) {
      this.committer.countRejected();
      throw err;
    }
    if (this.checkpointer === null && this.startCheckpointer !== null) this.checkpointer = this.startCheckpointer();
    try {
      return { id, offset: await this.committer.enqueue(row) };
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (code === 'SQLITE_CONSTRAINT_UNIQUE' || code === 'SQLITE_CONSTRAINT_PRIMARYKEY') {
        throw new ReefError('REEF_ERR_CONFLICT', { what: `record ${id}`, details: 'a record with this id is already stored' });
      }
      if (err instanceof ReefError) throw err;
      throw new ReefError('REEF_ERR_STORE', { reason: `append failed: ${(err as Error).message}` }, { cause: err });
    }
  }

  markAborted(record: NewRecord, reason: string): Promise<Receipt> {
    return this.append({ ...record, status: 'aborted', error: reason });
  }

  markFailed(record: NewRecord, error: string): Promise<Receipt> {
    return this.append({ ...record, status: 'failed', error });
  }

  async get(id: string): Promise<AgentRecord | null> {
    this.live();
    const row = this.sql.recordById.get(id);
    return row === undefined ? null : toRecord(this.expandRow(row));
  }

  /** Puts chunked payloads back into the row (see chunks.ts). */
  private expandRow<T extends SummaryRowShape & Partial<Pick<FullRowShape, 'prompt_ids' | 'prompt_chunks'>>>(row: T): T {
    const lookup = (hash: Buffer) => this.sql.chunk.get(hash)?.data;
    try {
      const width = row.chunk_ref_bytes;
      if (row.request_chunks !== null) row.request = unchunk(row.request_chunks, Buffer.from(row.request), lookup, `record ${row.id} request`, width).toString('utf8');
      if (row.prompt_chunks != null && row.prompt_ids !== undefined) row.prompt_ids = unchunk(row.prompt_chunks, row.prompt_ids, lookup, `record ${row.id} prompt ids`, width);
    } catch (err) {
      throw new ReefError('REEF_ERR_STORE', { reason: (err as Error).message }, { cause: err });
    }
    return row;
  }

  async list(options: ListOptions): Promise<Page<RecordSummary>> {
    this.live();
    const scenario = checkScenarioName(options.scenario);
    const limit = pageLimit(options.limit);
    const desc = pageOrder(options.order) === 'desc';
    const after = parseCursor(options.after) ?? (desc ? Number.MAX_SAFE_INTEGER : 0);
    const rows = (desc ? this.sql.listDesc : this.sql.listAsc).all(scenario, after, limit + 1);
    const items: RecordSummary[] = [];
    let bytes = 0;
    for (const row of rows.slice(0, limit)) {
      if (items.length > 0 && bytes >= this.pageBytes) break;
      const expanded = this.expandRow(row);
      bytes += expanded.request.length + expanded.response.length;
      items.push(toSummary(expanded));
    }
    return { items, next: rows.length > items.length ? String(items[items.length - 1]!.offset) : null };
  }

  async readFrom(offset: number, limit: number): Promise<AgentRecord[]> {
    this.live();
    return this.sql.readFrom.all(checkOffset(offset), pageLimit(limit)).map((r) => toRecord(this.expandRow(r)));
  }

  async headOffset(): Promise<number> {
    this.live();
    return this.sql.head.get()?.head ?? 0;
  }

  async getOffset(consumer: string): Promise<number> {
    this.live();
    return this.sql.getOffset.get(checkKey(consumer, 'consumer'))?.next_offset ?? 0;
  }

  async setOffset(consumer: string, offset: number): Promise<void> {
    this.live();
    const c = checkKey(consumer, 'consumer');
    const o = checkOffset(offset);
    await this.writing(`the offset of ${c}`, () => this.sql.setOffset.run(c, o, Date.now()));
  }

  async commitConsumer(consumer: string, offset: number, stateKey: string, state: unknown, rows: StateRows = NO_ROWS): Promise<void> {
    this.live();
    const puts = rows.put.map(([k, v]): [string, string] => [checkKey(k, 'state key'), jsonText(v, `state ${k}`)]);
    const deletes = rows.delete.map((k) => checkKey(k, 'state key'));
    const args = [checkKey(consumer, 'consumer'), checkOffset(offset), checkKey(stateKey, 'state key'), jsonText(state, 'state'), puts, deletes] as const;
    await this.writing(`the commit of consumer ${args[0]}`, () => this.commitConsumerTx(...args));
  }

  async statesWithPrefix(prefix: string): Promise<[string, unknown][]> {
    this.live();
    checkKey(prefix, 'state key prefix');
    // Keys compare as UTF-8 bytes: every key that starts with the prefix sorts below the prefix
    // with its last character one higher.
    const end = prefix.slice(0, -1) + String.fromCodePoint(prefix.codePointAt(prefix.length - 1)! + 1);
    return this.sql.statesIn.all(prefix, end).map((r) => [r.key, JSON.parse(r.value) as unknown]);
  }

  /** The stored value, or null when the key has none. */
  async getState(key: string): Promise<unknown> {
    this.live();
    const row = this.sql.getState.get(checkKey(key, 'state key'));
    return row === undefined ? null : (JSON.parse(row.value) as unknown);
  }

  /**
   * Parts of a stored value, by SQLite JSON path (`$.a.b`): each the part's JSON value, or null
   * where the path finds none; null when the key has none. SQLite picks them out of the stored
   * text, so a reader that wants a few counters of a large state (a judge state of version 2
   * held every open session) neither parses nor keeps the rest: ~3x less event-loop time on 650 KB.
   */
  async getStateFields(key: string, paths: readonly string[]): Promise<{ updatedAt: number; values: unknown[] } | null> {
    this.live();
    checkKey(key, 'state key');
    for (const p of paths) if (typeof p !== 'string' || !p.startsWith('$')) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `state path ${JSON.stringify(p)}: expected a SQLite JSON path starting with $` });
    let stmt = this.fieldStatements.get(paths.length);
    if (stmt === undefined) {
      const cols = paths.map((_, i) => `value -> ? AS f${i}`).join(', ');
      stmt = this.db.prepare(`SELECT updated_at${cols ? `, ${cols}` : ''} FROM kv WHERE key = ?`);
      this.fieldStatements.set(paths.length, stmt);
    }
    const row = stmt.get(...paths, key) as Record<string, unknown> | undefined;
    if (row === undefined) return null;
    return { updatedAt: row.updated_at as number, values: paths.map((_, i) => (row[`f${i}`] == null ? null : (JSON.parse(row[`f${i}`] as string) as unknown))) };
  }

  /** When the key's value was last written (ms since the epoch), or null when it has none. */
  async stateUpdatedAt(key: string): Promise<number | null> {
    this.live();
    return this.sql.stateUpdatedAt.get(checkKey(key, 'state key'))?.updated_at ?? null;
  }

  async putState(key: string, value: unknown): Promise<void> {
    this.live();
    const k = checkKey(key, 'state key');
    const text = jsonText(value, 'state');
    await this.writing(`state ${k}`, () => this.sql.putState.run(k, text, Date.now()));
  }

  async deleteState(key: string): Promise<void> {
    this.live();
    const k = checkKey(key, 'state key');
    await this.writing(`the deletion of state ${k}`, () => this.sql.deleteState.run(k));
  }

  /** Stores (or replaces) the judgment of a record; REEF_ERR_NOT_FOUND when there is no such record. */
  async putJudgment(recordId: string, judgment: unknown): Promise<void> {
    this.live();
    const id = checkKey(recordId, 'record id');
    const text = jsonText(judgment, 'judgment');
    await this.writing(`the judgment of record ${id}`, () => this.putJudgmentTx(id, text));
  }

  async getJudgment(recordId: string): Promise<unknown> {
    this.live();
    const row = this.sql.getJudgment.get(recordId);
    return row === undefined ? null : (JSON.parse(row.judgment) as unknown);
  }

  async appendJudgedTurn(turn: NewJudgedTurn): Promise<{ offset: number; created: boolean }> {
    this.live();
    return this.writing(`the judged turn of record ${String(turn?.turnRecordId)}`, () => this.judged.append(turn));
  }

  async readJudgedTurns(offset: number, limit: number): Promise<JudgedTurn[]> {
    this.live();
    return this.judged.read(checkOffset(offset), pageLimit(limit));
  }

  async judgedHeadOffset(): Promise<number> {
    this.live();
    return this.judged.head();
  }

  async judgedTurnIds(turnRecordIds: readonly string[]): Promise<Set<string>> {
    this.live();
    return this.judged.judgedIds(turnRecordIds);
  }

  async listJudgedTurns(options: ListOptions): Promise<Page<JudgedTurnView>> {
    this.live();
    const scenario = checkScenarioName(options.scenario);
    return this.judged.list(scenario, parseCursor(options.after), pageLimit(options.limit), pageOrder(options.order));
  }

  async judgedSeries(scenario: string, limit: number): Promise<JudgedPoint[]> {
    this.live();
    if (!Number.isSafeInteger(limit) || limit < 1) throw invalid('limit must be a positive integer');
    return this.judged.series(checkScenarioName(scenario), limit);
  }

  async judgedReplies(offsets: readonly number[]): Promise<Map<number, string | null>> {
    this.live();
    for (const o of offsets) checkOffset(o);
    return this.judged.replies(offsets);
  }

  /** Creates a scenario; REEF_ERR_CONFLICT when it exists (use ensureScenario to accept that). */
  async createScenario(name: string, description: string | null = null): Promise<Scenario> {
    this.live();
    checkScenarioName(name);
    if (description !== null && typeof description !== 'string') throw invalid('scenario description must be a string or null');
    if ((await this.writing(`the creation of scenario ${name}`, () => this.sql.ensureScenario.run(name, Date.now(), description))).changes === 0) {
      throw new ReefError('REEF_ERR_CONFLICT', { what: `scenario ${name}`, details: 'it already exists' });
    }
    return toScenario(this.sql.getScenario.get(name)!);
  }

  /** The scenario, created when missing (an existing one keeps its description). */
  async ensureScenario(name: string, description: string | null = null): Promise<Scenario> {
    this.live();
    checkScenarioName(name);
    await this.writing(`the creation of scenario ${name}`, () => this.sql.ensureScenario.run(name, Date.now(), description));
    return toScenario(this.sql.getScenario.get(name)!);
  }

  async getScenario(name: string): Promise<Scenario | null> {
    this.live();
    const row = this.sql.getScenario.get(name);
    return row === undefined ? null : toScenario(row);
  }

  async listScenarios(): Promise<Scenario[]> {
    this.live();
    return this.sql.listScenarios.all().map(toScenario);
  }

  async putReport(report: NewReport): Promise<{ report: Report; created: boolean }> {
    this.live();
    return this.writing(`report ${String(report?.clientId ?? '(no id)')} of scenario ${String(report?.scenario)}`, () => this.reports.put(report));
  }

  async getReport(id: string): Promise<Report | null> {
    this.live();
    return this.reports.get(id);
  }

  async listReports(options: ListOptions): Promise<Page<Report>> {
    this.live();
    const scenario = checkScenarioName(options.scenario);
    return this.reports.list(scenario, parseCursor(options.after), pageLimit(options.limit), pageOrder(options.order));
  }

  async putResponse(row: StoredResponse): Promise<void> {
    this.live();
    await this.writing(`stored response ${row.id}`, () => this.responses.put(row));
  }

  async getResponse(id: string, keyId: string): Promise<StoredResponse | null> {
    this.live();
    return this.responses.get(id, keyId);
  }

  async deleteResponse(id: string, keyId: string): Promise<boolean> {
    this.live();
    return this.writing(`the deletion of stored response ${id}`, () => this.responses.delete(id, keyId));
  }

  /**
   * Deletes a session's records (or a scenario's) and everything that holds their text
   * (deletion.ts). `forget` is called with the ids after their rows are gone, to have the judge and
   * the trainer-controller drop what they hold in memory; the rows are deleted again after it
   * (what an actor wrote meanwhile), then the chunks, free pages and WAL are scrubbed. The ids are
   * kept in an intent row from the start to the end, so a run stopped midway is finished by
   * `resumeDeletions` or by asking again. Answers the counts (summed over this run).
   */
  async deleteRecords(target: DeletionTarget, forget: (ids: string[]) => Promise<void>, jobId?: string): Promise<DeletionCounts & { ids: string[] }> {
    this.live();
    checkScenarioName(target.scenario);
    if (target.session !== null && (typeof target.session !== 'string' || target.session.length === 0)) throw invalid('session tag must be a non-empty string');
    const key = DELETION_PREFIX + (jobId ?? JSON.stringify([target.scenario, target.session]));
    const earlier = (await this.getState(key)) as { ids?: string[] } | null;
    // The ids an interrupted run found (their records may be gone already) and those there are now.
    const ids = [...new Set([...(earlier?.ids ?? []), ...targetIds(this.db, target)])];
    await this.putState(key, { scenario: target.scenario, session: target.session, ids, startedAt: Date.now() });
    const write = <T>(what: string, tx: () => T) => this.writing(what, tx);
    const pause = async () => {
      await new Promise<void>((r) => setImmediate(r));
      this.live();
    };
    const counts = zeroCounts();
    const add = (c: Partial<DeletionCounts>) => {
      const into = counts as unknown as Record<string, number>;
      for (const [k, v] of Object.entries(c)) if (typeof v === 'number') into[k] = (into[k] ?? 0) + v;
    };
    await secureDeleting(this.db, async () => {
      add(await deleteRows(this.db, target.scenario, ids, write, pause));
      await forget(ids);
      add(await deleteRows(this.db, target.scenario, ids, write, pause));
      const s = await scrub(this.db, write, pause);
      add(s);
      counts.walTruncated = s.walTruncated;
      // Last: a run stopped in the scrub leaves chunks only those records referenced, which a
      // resumed run collects. The intent row holds ids alone, so its removal writes no text to the WAL.
      await this.deleteState(key);
    });
    return { ...counts, ids };
  }

  /** Finishes every deletion an earlier run left (its intent row still there); answers how many. */
  async resumeDeletions(forget: (ids: string[]) => Promise<void>): Promise<number> {
    this.live();
    const left = await this.statesWithPrefix(DELETION_PREFIX);
    for (const [k, v] of left) {
      const t = v as { scenario: string; session: string | null };
      await this.deleteRecords({ scenario: t.scenario, session: t.session }, forget, k.slice(DELETION_PREFIX.length));
    }
    return left.length;
  }

  /** Checkpoints the WAL and truncates it (deletion.ts truncateWal); false when a reader kept it from the end. */
  truncateWal(): boolean {
    this.live();
    return truncateWal(this.db);
  }

  /** The ids of a session's records (or a scenario's, with `session` null), oldest first. */
  async recordIdsOf(target: DeletionTarget): Promise<string[]> {
    this.live();
    checkScenarioName(target.scenario);
    return targetIds(this.db, target);
  }

  /** Notes which turns a batch is formed from (lineage); idempotent. */
  async putBatchTurns(batchId: string, scenario: string, turnRecordIds: readonly string[]): Promise<void> {
    this.live();
    checkKey(batchId, 'batch id');
    const now = Date.now();
    await this.writing(`the lineage of batch ${batchId}`, () => this.putBatchTurnsTx(batchId, scenario, turnRecordIds, now));
  }

  /** The batches each of these turn record ids went into: turn id → batch ids (turns in none are left out). */
  async batchesOf(turnRecordIds: readonly string[]): Promise<Map<string, string[]>> {
    this.live();
    const out = new Map<string, string[]>();
    const q = this.db.prepare<[string], string>('SELECT batch_id FROM batch_turns WHERE turn_record_id = ? ORDER BY batch_id').pluck();
    for (const id of turnRecordIds) {
      const b = q.all(id);
      if (b.length > 0) out.set(id, b);
    }
    return out;
  }

  /**
   * Deletes what `policy` retires and the chunks left unreferenced (retention.ts), in short
   * transactions with a yield between them. One run at a time: a second call gets the first's answer.
   */
  retain(policy: RetentionPolicy, options: RetentionOptions = {}): Promise<RetentionResult> {
    this.live();
    this.retaining ??= runRetention(this.db, policy, { ...options, write: (what, tx) => this.writing(`retention's ${what}`, tx), yield: async () => {
      await (options.yield ?? (() => new Promise<void>((r) => setImmediate(r))))();
      this.live();
    } }).finally(() => (this.retaining = null));
    return this.retaining;
  }

  stats(): StoreStats {
    const cp = this.checkpointer?.stats;
    return { ...this.committer.snapshot(), checkpoints: cp?.checkpoints ?? 0, checkpointErrors: cp?.errors ?? 0 };
  }

  close(): Promise<void> {
    // Every caller gets the one close in progress: a second caller that got an early answer went on
    // (removed the directory, opened the file again) while the worker and the connection were still open.
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.closed = true;
    // A run in progress stops at its next yield (live() throws there); wait for it to let go of the connection.
    await this.retaining?.catch(() => {});
    this.committer.flush();
    // Appends waiting for another process's lock (lockWait 'async') commit or run out of budget first.
    await this.committer.idle();
    await this.checkpointer?.stop();
    this.db.close();
  }
}
