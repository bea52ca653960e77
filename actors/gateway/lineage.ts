import type { Release } from '../trainer-controller/controller.js';

/**
 * Lineage: which batches and releases trained on some records, and which release the scenario
 * could go back to so that the weights served hold none of them.
 *
 * A release is *tainted* when it trained on one of the records' batches, when the weights it was
 * trained from (its parent version) were tainted, or, for a rollback, when the release it put back
 * was. The weights of an untainted release never saw the records. The rollback target is the newest
 * untainted release, in the order releases were served ('base' when none is), or for a rollback the
 * release it put back: the last weights served before that data.
 */

export interface LineageBatch {
  batchId: string;
  /** The records of the query that this batch was formed from. */
  turns: string[];
  /** The release that trained the batch; null while it has not trained (or never will: dead-lettered, set aside). */
  release: string | null;
}

export interface Lineage {
  batches: LineageBatch[];
  /** Releases whose weights hold the records: those that trained on them and every one built on those. */
  tainted: string[];
  /** The release serving now (the newest), or null when none exists yet. */
  current: string | null;
  /** Whether the weights served now were trained on the records. */
  servingTrained: boolean;
  /** Where a rollback would go: the newest untainted release, 'base', or null when the serving release is untainted (nothing to undo). */
  rollbackTo: string | null;
}

/** `batchesByTurn`: turn record id → batch ids (store `batchesOf`); `releases`: every release, oldest first. */
export function lineageOf(batchesByTurn: ReadonlyMap<string, readonly string[]>, releases: readonly Release[]): Lineage {
  const turnsOf = new Map<string, string[]>();
  for (const [turn, batches] of batchesByTurn) for (const b of batches) (turnsOf.get(b) ?? turnsOf.set(b, []).get(b)!).push(turn);
  const trainedBy = new Map<string, string>();
  for (const r of releases) for (const b of r.batchIds) if (!trainedBy.has(b)) trainedBy.set(b, r.id);

  const taintedIds = new Set<string>();
  // A weight version's taint: the version names the checkpoint, which a rollback serves again under the same version.
  const versionTainted = new Map<string, boolean>();
  for (const r of releases) {
    let t: boolean;
    if (r.rollbackOf !== null) t = r.rollbackOf !== 'base' && taintedIds.has(r.rollbackOf);
    else t = r.batchIds.some((b) => turnsOf.has(b)) || (r.parent !== null && versionTainted.get(r.parent) === true);
    if (t) taintedIds.add(r.id);
    // A rollback serves an existing version again: its taint is that version's, set when it was trained.
    if (r.rollbackOf === null) versionTainted.set(r.weightVersion, t);
  }
  const current = releases.length > 0 ? releases[releases.length - 1]! : null;
  const servingTrained = current !== null && taintedIds.has(current.id);
  let rollbackTo: string | null = null;
  if (servingTrained) {
    // The newest release that never saw the data, in the order they were served; for a rollback,
    // the release (or base) it put back, which is what the rollback route loads.
    const clean = [...releases].reverse().find((r) => !taintedIds.has(r.id));
    rollbackTo = clean === undefined ? 'base' : (clean.rollbackOf ?? clean.id);
  }
  return {
    batches: [...turnsOf].map(([batchId, turns]) => ({ batchId, turns, release: trainedBy.get(batchId) ?? null })),
    tainted: releases.filter((r) => taintedIds.has(r.id)).map((r) => r.id),
    current: current?.id ?? null,
    servingTrained,
    rollbackTo,
  };
}
