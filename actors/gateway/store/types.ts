/**
 * The record store: what the gateway commits before a client gets its receipt, and what the judge
 * and trainer read back by offset. `RecordStore` is the interface; `SqliteStore` the embedded
 * implementation. Every method is async so that a networked store can implement the same surface.
 */

/** The request as the gateway received it (OpenAI chat-completions shape, JSON-serialisable). */
export interface RecordRequest {
  messages: unknown[];
  tools: unknown[] | null;
  /** Sampling and other request parameters (temperature, max_tokens, ...). */
  params: Record<string, unknown>;
}

export type RecordStatus = 'ok' | 'aborted' | 'failed';

export interface Usage {
  promptTokens: number;
  completionTokens: number;
}

/** Everything about one inference except its token payloads (what listings return). */
export interface RecordSummary {
  /** 26-char Crockford base32, sortable by creation time (see ids.ts). */
  id: string;
  /** Assigned by the store at commit; strictly increasing in commit order, starts at 1. */
  offset: number;
  scenario: string;
  /**
   * Which API key made it: the principal id (auth.ts; a digest prefix of the key, `open` on a
   * keyless gateway), never the key. null for records stored before key ids were.
   */
  keyId: string | null;
  tags: Record<string, string>;
  status: RecordStatus;
  /** ms since the epoch. */
  startedAt: number;
  finishedAt: number;
  request: RecordRequest;
  /** K of the recorded top-K (0 when none was recorded). */
  topK: number;
  finishReason: string | null;
  usage: Usage;
  weightVersion: string | null;
  engine: string;
  latencyMs: number;
  error: string | null;
  /** The assistant message as returned to the client, or null when none was. */
  response: unknown;
}

export interface AgentRecord extends RecordSummary {
  promptIds: Int32Array;
  outputIds: Int32Array;
  /** One per output token. */
  logprobs: Float32Array;
  /** outputIds.length × topK, row-major (token t's candidates at [t*K, (t+1)*K)). */
  topkIds: Int32Array;
  topkLogprobs: Float32Array;
}

/**
 * What `append` takes: a record without its offset; the id is generated when absent. `request`
 * may come already serialised as the JSON of a `RecordRequest`, text or UTF-8 bytes, or as the
 * client's own chat-completion body (`ChatBody`). The store takes ownership of the typed arrays:
 * it binds them without a copy, so the caller must not change them after `append`.
 */
export type NewRecord = Omit<AgentRecord, 'id' | 'offset' | 'request'> & {
  id?: string;
  request: RecordRequest | string | Uint8Array | ChatBody;
  /** What `SqliteStore.stage` returned for this record's request and prompt ids, if it was staged. */
  staged?: StagedPayloads | null;
};

/**
 * A record's request and prompt ids cut into chunks, the new chunks already written
 * (`SqliteStore.stage`). Opaque outside the store; it applies only to the very request bytes and
 * prompt-id array it was made from.
 */
export interface StagedPayloads {
  readonly __staged: true;
}

/**
 * The chat-completion body as the client sent it (UTF-8 JSON), already parsed and validated by the
 * gateway. The gateway stores these bytes as they came instead of serialising `{messages, tools,
 * params}` again: re-serialising an OpenClaw-sized transcript cost a tokenizer worker ~0.14 ms per
 * turn, and the body is the more faithful record anyway. Reads turn it back into a
 * `RecordRequest` (rows.ts `requestOfChatBody`).
 */
export interface ChatBody {
  chatBody: Uint8Array;
}

export interface Receipt {
  id: string;
  offset: number;
}

export interface ListOptions {
  scenario: string;
  /** Cursor from a previous page's `next`; absent for the first page. */
  after?: string | null;
  /** @default 50 (at most 1000) */
  limit?: number;
  /** @default 'asc' (oldest first) */
  order?: 'asc' | 'desc';
}

export interface Page<T> {
  items: T[];
  /** Pass as `after` to get the next page; null when this page is the last. */
  next: string | null;
}

export interface Scenario {
  name: string;
  createdAt: number;
  description: string | null;
}

export interface Report {
  /** Store-generated id (same format as record ids). */
  id: string;
  scenario: string;
  /** A finite number. */
  score: number;
  feedback: string | Record<string, unknown> | null;
  /** Record ids (receipts) of the same scenario. */
  references: string[];
  metadata: Record<string, unknown> | null;
  createdAt: number;
  /** The client's idempotency key, unique per scenario; null when the client gave none. */
  clientId: string | null;
  /**
   * Which API key filed it (as a record's `keyId`): a retry under the same client id answers the
   * stored report, so this stays the first filer's. null for reports stored before key ids were.
   */
  keyId: string | null;
}

export interface NewReport {
  scenario: string;
  score: number;
  feedback: string | Record<string, unknown> | null;
  references: string[];
  metadata: Record<string, unknown> | null;
  clientId: string | null;
  /** The principal id of the key filing it (auth.ts), or null when no key is known (tools, tests). */
  keyId: string | null;
}

/** Prometheus-style histogram: `counts[i]` = observations ≤ `bounds[i]` (cumulative); +Inf = `count`. */
export interface Histogram {
  bounds: number[];
  counts: number[];
  sum: number;
  count: number;
}

export interface StoreStats {
  /** Group-commit transactions that committed. */
  commits: number;
  /** Records committed. */
  records: number;
  /** Appends rejected (bad record, failed transaction). */
  failedAppends: number;
  /** Appends queued and not yet committed. */
  pending: number;
  /** Group-commit tries that found another process holding the write lock and waited to try again (`lockWait: 'async'`). */
  lockBusy: number;
  /** Records per committed transaction. */
  batchSize: Histogram;
  /** Wall time of each group-commit transaction, BEGIN to COMMIT returning, in ms. */
  commitMs: Histogram;
  /** Background WAL checkpoints that moved frames, and those that failed. */
  checkpoints: number;
  checkpointErrors: number;
}

/** How a judged turn trains (ARCHITECTURE §2 step 5). */
export type JudgeDecision = 'hint' | 'anchor' | 'dropped';

/** What the judge appends once per finished turn; the trainer reads these back by offset. */
export interface NewJudgedTurn {
  /** The record holding the judged assistant reply (its prompt and output ids are the training sample). */
  turnRecordId: string;
  /** The record whose newest message is the turn's next state. */
  nextStateRecordId: string;
  scenario: string;
  sessionKey: string;
  /** `dropped` turns are logged too (so every bound turn has exactly one row) but never trained. */
  decision: JudgeDecision;
  /** The majority score (1, -1; 0 only when dropped). */
  reward: number;
  /**
   * Teacher conditions for the distillation term: a hint appended to the last user message, or
   * null for the plain prompt. `hint` → the hints (shortest first); `anchor` → [null]; `dropped` → [].
   */
  teacherCandidates: (string | null)[];
  /** The full judgment (votes, raw PRM outputs, hints, decision); stored as the record's judgment. */
  judgment: unknown;
}

export interface JudgedTurn extends Omit<NewJudgedTurn, 'judgment'> {
  /** Position in the judged-turn log: starts at 1, strictly increasing in commit order. */
  offset: number;
  createdAt: number;
}

/**
 * A judged turn as the live page lists it (`listJudgedTurns`): the log's row with what the
 * judgment says of it, and the texts of the reply and of the next state that judged it.
 */
export interface JudgedTurnView extends JudgedTurn {
  /** The PRM's score votes and hint votes, as parsed (null: a reply without a valid verdict). */
  votes: { score: (number | null)[]; hint: (number | null)[] };
  /** The hints the judge accepted (its teachers), shortest first. */
  hints: string[];
  /** The message that judged the turn (the user's or a tool's next message); null when the judgment has none. */
  nextState: { role: string; content: string } | null;
  /** The assistant text the turn's record answered with; null when it had none (tool calls only) or the record is gone. */
  reply: string | null;
}

/** One judged turn as a point of a scenario's curves (`judgedSeries`). */
export interface JudgedPoint {
  offset: number;
  createdAt: number;
  decision: JudgeDecision;
  reward: number;
}

/** State keys a consumer's commit writes (`put`) and deletes besides its state. */
export interface StateRows {
  put: readonly [key: string, value: unknown][];
  delete: readonly string[];
}

export const NO_ROWS: StateRows = Object.freeze({ put: [], delete: [] });

export interface RecordStore {
  /** Queue a record; resolves once the transaction holding it has committed (the receipt). */
  append(record: NewRecord): Promise<Receipt>;
  /** Append a record whose stream ended early (client gone, engine abort), with its reason. */
  markAborted(record: NewRecord, reason: string): Promise<Receipt>;
  /** Append a record whose generation failed, with the error text. */
  markFailed(record: NewRecord, error: string): Promise<Receipt>;

  get(id: string): Promise<AgentRecord | null>;
  list(options: ListOptions): Promise<Page<RecordSummary>>;
  /** Records with offset ≥ `offset`, in offset order. A consumer then commits `last.offset + 1`. */
  readFrom(offset: number, limit: number): Promise<AgentRecord[]>;
  /** The highest committed offset (0 when empty). */
  headOffset(): Promise<number>;

  /** The next offset `consumer` should read (0 for a new consumer: offsets start at 1). */
  getOffset(consumer: string): Promise<number>;
  setOffset(consumer: string, offset: number): Promise<void>;
  /**
   * Advance a consumer and save its resumable state in one transaction, with `rows`: other state
   * keys written and deleted in the same transaction, so a state whose parts come and go (the
   * judge's pending turns) writes only what changed instead of all of it.
   */
  commitConsumer(consumer: string, offset: number, stateKey: string, state: unknown, rows?: StateRows): Promise<void>;
  /** Every state key that starts with `prefix`, with its value, in key order. */
  statesWithPrefix(prefix: string): Promise<[string, unknown][]>;

  getState(key: string): Promise<unknown>;
  /** Parts of a stored value by JSON path (`$.a.b`), without reading the rest; null when the key has none. */
  getStateFields(key: string, paths: readonly string[]): Promise<{ updatedAt: number; values: unknown[] } | null>;
  /** When the key's value was last written (ms since the epoch), or null when it has none. */
  stateUpdatedAt(key: string): Promise<number | null>;
  putState(key: string, value: unknown): Promise<void>;
  deleteState(key: string): Promise<void>;

  putJudgment(recordId: string, judgment: unknown): Promise<void>;
  getJudgment(recordId: string): Promise<unknown>;

  /**
   * Stores the turn's judgment and appends it to the judged-turn log in one transaction. A turn
   * that is already in the log is left as it was (`created: false`, its first offset): a late or
   * repeated completion never judges a turn twice.
   */
  appendJudgedTurn(turn: NewJudgedTurn): Promise<{ offset: number; created: boolean }>;
  /** Judged turns with offset ≥ `offset`, in offset order (a consumer commits `last.offset + 1`). */
  readJudgedTurns(offset: number, limit: number): Promise<JudgedTurn[]>;
  /** The highest judged-turn offset (0 when none). */
  judgedHeadOffset(): Promise<number>;
  /** Which of these turn record ids are already in the judged-turn log. */
  judgedTurnIds(turnRecordIds: readonly string[]): Promise<Set<string>>;
  /** A scenario's judged turns with their votes, hints and texts, paged as records are (`after` is an offset). */
  listJudgedTurns(options: ListOptions): Promise<Page<JudgedTurnView>>;
  /** The newest `limit` judged turns of a scenario (at most 5000), oldest first: the points of its curves. */
  judgedSeries(scenario: string, limit: number): Promise<JudgedPoint[]>;
  /** The reply texts (as `JudgedTurnView.reply`) of the judged turns at these offsets; an offset the log lacks is left out. */
  judgedReplies(offsets: readonly number[]): Promise<Map<number, string | null>>;

  createScenario(name: string, description?: string | null): Promise<Scenario>;
  ensureScenario(name: string, description?: string | null): Promise<Scenario>;
  getScenario(name: string): Promise<Scenario | null>;
  listScenarios(): Promise<Scenario[]>;

  /** Idempotent by (scenario, clientId): same content returns the stored report, other content → 409. */
  putReport(report: NewReport): Promise<{ report: Report; created: boolean }>;
  getReport(id: string): Promise<Report | null>;
  listReports(options: ListOptions): Promise<Page<Report>>;

  stats(): StoreStats;
  /** Commits what is queued, then closes. Idempotent. */
  close(): Promise<void>;
}
