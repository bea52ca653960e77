import type { LogFn } from '../../runtime/log.js';
import type { RecordSummary } from '../../gateway/store/types.js';

/** What correlation reads of a record (an `AgentRecord` or `RecordSummary` fits). */
export type CorrelationRecord = Pick<RecordSummary, 'id' | 'offset' | 'scenario' | 'keyId' | 'tags' | 'status' | 'finishedAt' | 'response'> & {
  request: { messages: unknown[] };
};

export interface CorrelatorConfig {
  /** A session with no request for this long is closed and its pending turn dropped. @default 900 */
  sessionTtlS: number;
  /**
   * Open sessions kept over every scenario and API key; above it, the least recently active of the
   * scenario and key holding the most is evicted (sessions.ts evictionVictim). @default 4096
   */
  maxOpenSessions: number;
  /**
   * Tag mode only: treat a request whose first message differs from its session's (its first
   * non-system message, once the session's system prompt was seen to change) as a side request
   * unless the next request of the session extends it (see correlator.ts). @default true
   */
  inferSide: boolean;
}

export const DEFAULT_CORRELATOR_CONFIG: Readonly<CorrelatorConfig> = Object.freeze({ sessionTtlS: 900, maxOpenSessions: 4096, inferSide: true });

export interface CorrelatorOptions extends Partial<CorrelatorConfig> {
  /** The time of a record in ms, for TTLs. @default record.finishedAt */
  now?: (record: CorrelationRecord) => number;
  /** Where warnings are logged (they are also returned as events). @default no logging */
  log?: LogFn;
  /** Characters of message text kept to avoid rehashing it (a cache, cleared whole when full). @default 16_000_000 */
  hashMemoChars?: number;
}

export interface CorrelationCounters {
  /** Records (status ok) with `tags.session`. */
  tagged: number;
  /** Records (status ok) without it. */
  untagged: number;
  /** Turns that got their next state (`turn-finished` events). */
  bound: number;
  /** Turns dropped without a next state: their session expired, was evicted, or went on without one. */
  dropped_unbound: number;
  /** Sessions evicted above `maxOpenSessions`. */
  evicted: number;
  /** Exact repeats of a session's last request. */
  retries: number;
  /** Side requests: tagged `turn-type: side`, or inferred (never trained). */
  side: number;
  /** Sessions the client ended (`session-done`); each one's last turn is dropped at once, having no next state. */
  ended: number;
}

export type WarningCode = 'untagged-traffic' | 'evictions' | 'unbound-turns';

export interface NextState {
  role: 'user' | 'tool';
  /** The message text (text parts joined; other content as canonical JSON); several messages as labelled blocks (see nextStateOf). */
  content: string;
}

/** How a session's key reads: `tag:<x-reef-tag-session>` or `chain:<id of the record that opened it>`. */
export type SessionKey = string;

export type CorrelationEvent =
  | { kind: 'turn-finished'; sessionKey: SessionKey; scenario: string; turnRecordId: string; nextStateRecordId: string; nextState: NextState }
  /** A request that starts a session. */
  | { kind: 'opened'; sessionKey: SessionKey; scenario: string; recordId: string }
  /** A request that continues a session: `extends` its last request, or (tag mode) `rewrite`s its history. */
  | { kind: 'continued'; sessionKey: SessionKey; scenario: string; recordId: string; how: 'extends' | 'rewrite' }
  | { kind: 'retry'; sessionKey: SessionKey; scenario: string; recordId: string; ofRecordId: string }
  | { kind: 'side'; sessionKey: SessionKey | null; scenario: string; recordId: string; reason: 'tagged' | 'inferred' }
  | { kind: 'turn-dropped'; sessionKey: SessionKey; scenario: string; turnRecordId: string; reason: 'expired' | 'evicted' | 'no-next-state' | 'rewrite' | 'session-done' }
  | { kind: 'session-closed'; sessionKey: SessionKey; scenario: string; reason: 'expired' | 'evicted' | 'done' }
  /** A record correlation does not read: not `ok`, or without messages. */
  | { kind: 'skipped'; recordId: string; scenario: string; reason: 'status' | 'no-messages' }
  | { kind: 'warning'; code: WarningCode; message: string; counters: CorrelationCounters };

export type TurnFinished = Extract<CorrelationEvent, { kind: 'turn-finished' }>;
