import { createHash } from 'node:crypto';
import type { CorrelatorHead, CorrelatorState, SavedSession, TurnFinished } from './correlate/index.js';

/** What the judge saves (handler.ts `commit`), and the versions of it that it still reads. */

/** Where the open sessions' rows are: one key per session (`sessionRowKey`). */
export const SESSION_PREFIX = 'judge/session/';

/**
 * A session's row key: a digest of its map key, which holds a client's session tag of any length
 * (and NULs), so that keys stay short. SHA-256 whole: sessions of other tenants must not share one.
 */
export function sessionRowKey(mapKey: string): string {
  return SESSION_PREFIX + createHash('sha256').update(mapKey).digest('base64url');
}

export type SavedPending = [ev: TurnFinished, leaseId: string | null, actorId: string | null];
/** Versions 2 and 3: a pending turn by id, its event in its own row. */
export type SavedLease = [turnRecordId: string, leaseId: string | null, actorId: string | null];

/**
 * Version 4: a pending turn's row, with its lease and its place in line (`seq`, ascending: the
 * order turns are handed out in). Versions 2 and 3 kept the row to the event alone and the order
 * and leases of all pending turns in the state, which every commit then wrote whole (up to 2,304
 * entries, ~160 KB); now a commit writes the rows of the turns whose lease or place changed.
 */
export interface PendingRow {
  turn: TurnFinished;
  seq: number;
  leaseId: string | null;
  actorId: string | null;
}

/**
 * Version 1 held every pending turn's event, next state and all, and was written whole on every
 * commit; version 2 still held every open session; version 3 still held every pending turn's id
 * and lease. All are read, and the first commit after writes their turns and sessions as rows.
 * Version 4 holds the head only: `nextSeq` is the place the next turn in line gets.
 */
export type SavedState =
  | { version: 1; correlator: CorrelatorState; pending: SavedPending[]; counters: JudgeCounters }
  | { version: 2; correlator: CorrelatorState; pending: SavedLease[]; counters: JudgeCounters }
  | { version: 3; correlator: CorrelatorHead; pending: SavedLease[]; counters: JudgeCounters }
  | { version: 4; correlator: CorrelatorHead; nextSeq: number; counters: JudgeCounters };

/** A saved session's activity sequence: the order the session table keeps them in. */
const SEQ = 16;

/** Session rows as `Correlator.fromJSON` takes them: least recently active first. */
export function byActivity(rows: readonly [key: string, session: unknown][]): SavedSession[] {
  return rows.map(([, t]) => t as SavedSession).sort((a, b) => a[SEQ] - b[SEQ]);
}

export interface JudgeCounters {
  votes_ok: number;
  votes_failed: number;
  votes_invalid: number;
  judged: number;
  dropped: number;
  redispatched: number;
  /** Leases given back unjudged: by a draining actor, or one whose PRM answered none of the turn's calls. */
  released: number;
  late_completions: number;
  /** Completions under a lease this turn was never given, or given to another actor: not counted. */
  refused_completions: number;
  duplicate_completions: number;
}

export const zeroCounters = (): JudgeCounters => ({ votes_ok: 0, votes_failed: 0, votes_invalid: 0, judged: 0, dropped: 0, redispatched: 0, released: 0, late_completions: 0, refused_completions: 0, duplicate_completions: 0 });
