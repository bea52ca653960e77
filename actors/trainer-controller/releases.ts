import type { RecordStore } from '../gateway/store/types.js';
import type { Release } from './controller.js';
import { STATE_KEY } from './messages.js';

/**
 * Releases are rows of their own in the store's kv table, one per release, written once by the
 * commit that records it: the state held every release and was rewritten whole on every commit,
 * so a long run's commits grew with its history. The state keeps the newest few the controller
 * works with (`recentReleases`); whoever lists them all reads these rows.
 */
export const RELEASE_PREFIX = 'trainer-controller:release/';

/** The row of release number `n` (its id is `release-<n>`), zero-padded so that key order is release order. */
export function releaseKey(n: number): string {
  return RELEASE_PREFIX + String(n).padStart(12, '0');
}

/** The release number an id names, or null for an id no release has (`release-07` is not `release-7`). */
export function releaseNumber(id: string): number | null {
  const m = /^release-([1-9]\d{0,11})$/.exec(id);
  return m === null ? null : Number(m[1]);
}

type Reader = Pick<RecordStore, 'getState' | 'statesWithPrefix'>;

/**
 * Every release, oldest first. A state saved before releases had rows (no `version`) still holds
 * them all inside; the controller's first commit after it moves them into rows.
 */
export async function readReleases(store: Reader): Promise<Release[]> {
  const state = (await store.getState(STATE_KEY)) as { version?: number; releases?: Release[] } | null;
  if (state === null) return [];
  const all = state.version === undefined ? (state.releases ?? []) : (await store.statesWithPrefix(RELEASE_PREFIX)).map(([, r]) => r as Release);
  return all.map(withKeyId);
}

/** One release by id from its row, or null when there is none. */
export async function readRelease(store: Pick<RecordStore, 'getState'>, id: string): Promise<Release | null> {
  const n = releaseNumber(id);
  const r = n === null ? null : ((await store.getState(releaseKey(n))) as Release | null);
  return r === null ? null : withKeyId(r);
}

/** Releases written before they kept the asking key have no `keyId`: who asked is not known. */
function withKeyId(r: Release): Release {
  return r.keyId === undefined ? { ...r, keyId: null } : r;
}
