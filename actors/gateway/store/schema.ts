import type Database from 'better-sqlite3';
import { ReefError } from '../../runtime/errors.js';

/**
 * Schema migrations, applied in order on open. `PRAGMA user_version` holds how many have run.
 * Append new steps; never edit a released one.
 *
 * Records keep their small columns first and the large ones (JSON, token blobs) last: SQLite
 * reads a row's leading columns without walking the overflow pages of the blobs behind them,
 * so listings and summaries stay cheap.
 */
const MIGRATIONS: readonly string[] = [
  `
  CREATE TABLE scenarios (
    name TEXT PRIMARY KEY,
    created_at INTEGER NOT NULL,
    description TEXT
  ) STRICT;

  -- AUTOINCREMENT: an offset is never reused, even for the newest row after a delete.
  CREATE TABLE records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    scenario TEXT NOT NULL REFERENCES scenarios(name),
    status TEXT NOT NULL CHECK (status IN ('ok', 'aborted', 'failed')),
    started_at INTEGER NOT NULL,
    finished_at INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    engine TEXT NOT NULL,
    weight_version TEXT,
    finish_reason TEXT,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    top_k INTEGER NOT NULL,
    error TEXT,
    tags TEXT NOT NULL,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    prompt_ids BLOB NOT NULL,
    output_ids BLOB NOT NULL,
    logprobs BLOB NOT NULL,
    topk_ids BLOB NOT NULL,
    topk_logprobs BLOB NOT NULL
  ) STRICT;
  CREATE INDEX records_by_scenario ON records(scenario, seq);

  CREATE TABLE reports (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    scenario TEXT NOT NULL REFERENCES scenarios(name),
    client_id TEXT,
    score REAL NOT NULL,
    feedback TEXT NOT NULL,
    refs TEXT NOT NULL,
    metadata TEXT NOT NULL,
    created_at INTEGER NOT NULL
  ) STRICT;
  CREATE UNIQUE INDEX reports_by_client ON reports(scenario, client_id) WHERE client_id IS NOT NULL;
  CREATE INDEX reports_by_scenario ON reports(scenario, seq);

  CREATE TABLE judgments (
    record_id TEXT PRIMARY KEY REFERENCES records(id),
    judgment TEXT NOT NULL,
    updated_at INTEGER NOT NULL
  ) STRICT;

  CREATE TABLE consumer_offsets (
    consumer TEXT PRIMARY KEY,
    next_offset INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
  ) STRICT;

  CREATE TABLE kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at INTEGER NOT NULL
  ) STRICT;
  `,
  // 2: the judge's output log. One row per finished turn, judged exactly once (the UNIQUE turn id
  // makes a second completion of the same turn a no-op); the trainer reads it by offset (seq).
  `
  CREATE TABLE judged_turns (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_record_id TEXT NOT NULL UNIQUE REFERENCES records(id),
    next_state_record_id TEXT NOT NULL,
    scenario TEXT NOT NULL,
    session_key TEXT NOT NULL,
    decision TEXT NOT NULL CHECK (decision IN ('hint', 'anchor', 'dropped')),
    reward REAL NOT NULL,
    teacher_candidates TEXT NOT NULL,
    created_at INTEGER NOT NULL
  ) STRICT;
  `,
  // 3: shared prefixes stored once (chunks.ts). A record whose request or prompt ids were cut into
  // chunks lists the chunk digests here and keeps only the tail in request / prompt_ids; NULL means
  // the column holds the whole payload, as every record written before this step does.
  `
  CREATE TABLE chunks (
    hash BLOB PRIMARY KEY,
    data BLOB NOT NULL
  ) STRICT, WITHOUT ROWID;
  ALTER TABLE records ADD COLUMN request_chunks BLOB;
  ALTER TABLE records ADD COLUMN prompt_chunks BLOB;
  `,
  // 4: what the request column holds: 0 the JSON of {messages, tools, params} (every record
  // written before this step), 1 the client's chat-completion body as received (types.ts ChatBody).
  `
  ALTER TABLE records ADD COLUMN request_form INTEGER NOT NULL DEFAULT 0 CHECK (request_form IN (0, 1));
  `,
  // 5: chunk addresses are whole SHA-256 digests (chunks.ts REF_BYTES). Rows written before keep
  // their 16-byte references, and the chunks those name keep their 16-byte keys, so no row or
  // chunk is rewritten; a reader checks each chunk against as many digest bytes as its row says.
  `
  ALTER TABLE records ADD COLUMN chunk_ref_bytes INTEGER NOT NULL DEFAULT 16 CHECK (chunk_ref_bytes IN (16, 32));
  `,
  // 6: garbage collection of chunks (retention.ts). The generation goes up in every transaction
  // that deletes chunks; a writer that knows a chunk as stored only as of an older generation
  // inserts it again instead of trusting its memo.
  `
  CREATE TABLE chunk_gc (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation INTEGER NOT NULL
  ) STRICT;
  INSERT INTO chunk_gc (id, generation) VALUES (1, 0);
  `,
  // 7: which API key made the record (auth.ts Principal.id: a digest prefix, or 'open' on a keyless
  // gateway). NULL for records written before this step: who made them was never known.
  `
  ALTER TABLE records ADD COLUMN key_id TEXT;
  `,
  // 8: which API key filed the report, as step 7 for records: the audit of who rated what. NULL for
  // reports filed before this step.
  `
  ALTER TABLE reports ADD COLUMN key_id TEXT;
  `,
  // 9: a scenario's judged turns, newest first, for the live page (GET /reef/scenarios/{s}/judged):
  // without it every page of them scanned the whole log.
  `
  CREATE INDEX IF NOT EXISTS judged_turns_by_scenario ON judged_turns(scenario, seq);
  `,
  // 10: responses stored by /v1/responses (store.ts ResponseTable), so that a client continues a
  // conversation by previous_response_id. The id is the id of the record that answered it (the
  // API's id is resp_<id>); retention deletes the row with that record. The conversation is the
  // chat messages (instructions left out) that the next turn extends, the reply last.
  `
  CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    scenario TEXT NOT NULL,
    previous_id TEXT,
    session TEXT,
    created_at INTEGER NOT NULL,
    conversation TEXT NOT NULL,
    input_items TEXT NOT NULL,
    response TEXT NOT NULL
  ) STRICT;
  CREATE INDEX responses_by_age ON responses(created_at);
  `,
  // 11 (IF NOT EXISTS: a test rebuilds older files by dropping what later steps add, not this): lineage (deletion.ts, GET /reef/scenarios/{s}/lineage): which turns each batch was formed
  // from, written by the trainer-controller before the batch trains; the release that trained a
  // batch names it in its batchIds. Ids only, no text, so it outlives the records (retention and
  // deletion leave it): what a release was trained on stays answerable after the data is gone.
  `
  CREATE TABLE IF NOT EXISTS batch_turns (
    batch_id TEXT NOT NULL,
    scenario TEXT NOT NULL,
    turn_record_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (batch_id, turn_record_id)
  ) STRICT, WITHOUT ROWID;
  CREATE INDEX IF NOT EXISTS batch_turns_by_turn ON batch_turns(turn_record_id);
  `,
];

export const SCHEMA_VERSION = MIGRATIONS.length;

/** For a read-only open: the database must be at SCHEMA_VERSION, which only a writer can bring it to. */
export function checkSchema(db: Database.Database): void {
  const current = db.pragma('user_version', { simple: true }) as number;
  if (current > SCHEMA_VERSION) {
    throw new ReefError('REEF_ERR_STORE', { reason: `${db.name} has schema version ${current}, newer than this build's ${SCHEMA_VERSION}` });
  }
  if (current < SCHEMA_VERSION) {
    throw new ReefError('REEF_ERR_STORE', {
      reason: `${db.name} has schema version ${current}, older than this build's ${SCHEMA_VERSION}; start the gateway (reef up) once with this build to upgrade it, then read it`,
    });
  }
}

/**
 * Brings the database to SCHEMA_VERSION; refuses a database written by a newer Reef. `to` stops
 * earlier, so tests can make a store as an older build wrote it.
 */
export function migrate(db: Database.Database, to: number = SCHEMA_VERSION): void {
  // IMMEDIATE: two processes opening a fresh file at once must not both run step 1.
  db.transaction(() => {
    const current = db.pragma('user_version', { simple: true }) as number;
    if (current > SCHEMA_VERSION) {
      throw new ReefError('REEF_ERR_STORE', {
        reason: `${db.name} has schema version ${current}, newer than this build's ${SCHEMA_VERSION}`,
      });
    }
    for (let v = current; v < to; v++) {
      db.exec(MIGRATIONS[v]!);
      db.pragma(`user_version = ${v + 1}`);
    }
  }).immediate();
}
