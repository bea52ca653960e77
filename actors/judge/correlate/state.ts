import { type Session, sessionMapKey } from './sessions.js';
import type { CorrelationCounters } from './types.js';

/**
 * The correlator's resumable state, as plain JSON: the judge saves it with its record offset in
 * one transaction (`commitConsumer`) and resumes from both after a crash. Hashes are 53-bit
 * integers, exact in JSON. The hash memo is a cache and is not saved.
 */
export const STATE_VERSION = 1;

/** One session as a tuple, to keep a 4096-session state near half a megabyte. */
export type SavedSession = [
  key: string,
  scenario: string,
  tagged: 0 | 1,
  turnId: string,
  n: number,
  full: number,
  ext: number,
  root: number,
  altId: string | null,
  altExt: number,
  candId: string | null,
  candN: number,
  candExt: number,
  candConv: number,
  repeat: 0 | 1,
  lastAt: number,
  seq: number,
  // Added later, without a version bump: a state saved before resumes with `conv` = `root` and
  // `sysVaries` off (a session whose system prompt varies learns it again, at the cost of a turn).
  conv?: number,
  sysVaries?: 0 | 1,
  // Added with record key ids: a state saved before holds sessions of records without one (null).
  keyId?: string | null,
];

/**
 * The correlator without its sessions: the judge saves this in its state and each session as a
 * row of its own (`Correlator.changes`), so that a commit writes the sessions its records touched,
 * not all of them.
 */
export type CorrelatorHead = Omit<CorrelatorState, 'sessions'>;

export interface CorrelatorState {
  version: typeof STATE_VERSION;
  clock: number;
  seq: number;
  counters: CorrelationCounters;
  warned: { untagged: boolean; evictions: boolean; unboundAt: number | null };
  /** Least recently active first (the order is the eviction order). */
  sessions: SavedSession[];
}

export function saveSession(s: Session): SavedSession {
  return [s.key, s.scenario, s.tagged ? 1 : 0, s.turnId, s.n, s.full, s.ext, s.root, s.altId, s.altExt, s.candId, s.candN, s.candExt, s.candConv, s.repeat ? 1 : 0, s.lastAt, s.seq, s.conv, s.sysVaries ? 1 : 0, s.keyId];
}

export function restoreSession(t: SavedSession): Session {
  const [key, scenario, tagged, turnId, n, full, ext, root, altId, altExt, candId, candN, candExt, candConv, repeat, lastAt, seq, conv, sysVaries, keyId = null] = t;
  return {
    mapKey: sessionMapKey(scenario, keyId, key),
    key, scenario, keyId, tagged: tagged === 1, turnId, n, full, ext, root, conv: conv ?? root, sysVaries: sysVaries === 1, altId, altExt, candId, candN, candExt, candConv,
    repeat: repeat === 1, lastAt, seq,
  };
}
