import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import type { Release } from '../../actors/trainer-controller/controller.js';
import { STATE_KEY as TRAINER_STATE } from '../../actors/trainer-controller/messages.js';
import { readReleases } from '../../actors/trainer-controller/releases.js';

/**
 * The soak's invariants (docs/benchmarks.md "kill -9 soak"), read from a stopped stack's files:
 * the client's receipt log, the store, the controller's state, the trainer's ledger and the
 * `prm_record_file`. Every reader here only reads: the checker runs on a copy in its tests.
 */

export interface SoakFiles {
  dataDir: string;
  /** The client's fsynced receipt log: one JSON object with `id` per line. */
  receiptLog: string;
  /** The recipe's `prm_record_file`, whose lines say which turns each batch trained. */
  recordFile: string;
}

export interface SoakCounts {
  receipts: number;
  /** Records in the store (its head offset: every record the gateway committed, receipts or not). */
  records: number;
  judged: number;
  judgedDropped: number;
  /** Turns in released batches. */
  trainedTurns: number;
  batches: number;
  releases: number;
  ledgerEntries: number;
  /** `v<n>` directories on disk (the newest `keep_checkpoints` releases'). */
  checkpoints: number;
  /** The controller's counters of turns it read and did not train, and of batches given up on. */
  stale: number;
  untrainable: number;
  deadLetters: number;
}

export interface SoakCheck {
  counts: SoakCounts;
  /** One sentence per broken invariant; empty when all hold. */
  violations: string[];
}

interface LedgerEntry {
  weightVersion?: string;
  checkpointPath?: string;
}

interface RecordLine {
  batch_id: string;
  run?: string;
  turns?: string[];
  trained?: boolean;
}

/** Lines of a JSONL file; a torn last line (a crash mid-append) is not a line. */
function jsonLines<T>(path: string): T[] {
  if (!existsSync(path)) return [];
  const out: T[] = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (line.trim() === '') continue;
    try {
      out.push(JSON.parse(line) as T);
    } catch {
      // only a crash leaves a partial line, and only at the end
    }
  }
  return out;
}

const MAX_LISTED = 5;

/** Adds one violation naming at most a few of the offenders, with their count. */
function report(violations: string[], what: string, offenders: readonly string[]): void {
  if (offenders.length === 0) return;
  const shown = offenders.slice(0, MAX_LISTED).join(', ');
  violations.push(`${what}: ${offenders.length} (${shown}${offenders.length > MAX_LISTED ? ', …' : ''})`);
}

/** How many batches the trainer's ledger keeps, the newest (`LEDGER_KEEP`, python_shim/reef_shim/trainer/checkpoint.py). */
export const LEDGER_KEEP = 1024;

/**
 * Released batches (in release order) that the ledger should hold and does not. Only the newest
 * LEDGER_KEEP can be asked of it: the trainer drops older entries by design, and a 30-minute soak
 * released 1,155 batches, so its oldest 131 were reported missing though nothing was lost.
 */
export function releasesMissingLedger(releasedBatches: readonly string[], ledger: Record<string, unknown>): string[] {
  return releasedBatches.slice(-LEDGER_KEEP).filter((b) => !(b in ledger));
}

export async function checkSoak(files: SoakFiles): Promise<SoakCheck> {
  const violations: string[] = [];
  const receipts = jsonLines<{ id: string }>(files.receiptLog).map((r) => r.id);
  const store = SqliteStore.open(join(files.dataDir, 'records.sqlite'), { readonly: true });
  try {
    // 1. A receipt the client holds names a record that survived every crash.
    const missing: string[] = [];
    for (const id of receipts) if ((await store.get(id)) === null) missing.push(id);
    report(violations, 'receipts the store does not have', missing);
    const records = await store.headOffset();

    // 2. At most one judged row per turn (the UNIQUE column holds it; a schema change must not lose it).
    const judgedBy = new Map<string, number>();
    const decisions = new Map<string, string>();
    let dropped = 0;
    for (let offset = 0; ; ) {
      const page = await store.readJudgedTurns(offset, 1000);
      if (page.length === 0) break;
      for (const t of page) {
        judgedBy.set(t.turnRecordId, (judgedBy.get(t.turnRecordId) ?? 0) + 1);
        decisions.set(t.turnRecordId, t.decision);
        if (t.decision === 'dropped') dropped++;
      }
      offset = page.at(-1)!.offset + 1; // read from an offset on, that offset included
    }
    const judgedRows = [...judgedBy.values()].reduce((a, b) => a + b, 0);
    report(violations, 'turns judged more than once', [...judgedBy].filter(([, n]) => n > 1).map(([id, n]) => `${id} ×${n}`));

    // 3. No turn trained twice: the released batches' turns, from their record lines, are disjoint.
    const state = (await store.getState(TRAINER_STATE)) as { run?: string; counters?: Record<string, number>; deadLetters?: unknown[] } | null;
    const releases: Release[] = await readReleases(store);
    const trainedReleases = releases.filter((r) => r.rollbackOf === null);
    const releasedBatches = trainedReleases.flatMap((r) => r.batchIds);
    report(violations, 'batches released more than once', releasedBatches.filter((b, i) => releasedBatches.indexOf(b) !== i));
    const lines = jsonLines<RecordLine>(files.recordFile).filter((l) => l.trained !== false && (state?.run === undefined || l.run === state.run));
    const lineOf = new Map<string, RecordLine>();
    const lineTwice: string[] = [];
    for (const l of lines) {
      if (lineOf.has(l.batch_id)) lineTwice.push(l.batch_id);
      lineOf.set(l.batch_id, l);
    }
    report(violations, 'batches with more than one record line', lineTwice);
    report(violations, 'released batches without a record line', releasedBatches.filter((b) => !lineOf.has(b)));
    report(violations, 'record lines of batches never released', [...lineOf.keys()].filter((b) => !releasedBatches.includes(b)));
    const trainedBy = new Map<string, string[]>();
    for (const l of lineOf.values()) for (const turn of l.turns ?? []) trainedBy.set(turn, [...(trainedBy.get(turn) ?? []), l.batch_id]);
    report(violations, 'turns trained by more than one batch', [...trainedBy].filter(([, b]) => b.length > 1).map(([t, b]) => `${t} in ${b.join(' and ')}`));
    report(violations, 'record lines without turn ids', [...lineOf.values()].filter((l) => !Array.isArray(l.turns)).map((l) => l.batch_id));
    // What trained was judged, and not dropped.
    report(violations, 'trained turns that were never judged, or dropped', [...trainedBy.keys()].filter((turn) => (decisions.get(turn) ?? 'dropped') === 'dropped'));

    // 4. Ledger entries and releases, one to one, by batch id and weight version.
    const ledgerPath = join(files.dataDir, 'checkpoints', 'reef_trainer_ledger.json');
    const ledger = existsSync(ledgerPath) ? ((JSON.parse(readFileSync(ledgerPath, 'utf8')) as { batches: Record<string, LedgerEntry> }).batches ?? {}) : {};
    const releaseOf = new Map(trainedReleases.flatMap((r) => r.batchIds.map((b) => [b, r] as const)));
    report(violations, 'ledger entries with no release', Object.keys(ledger).filter((b) => !releaseOf.has(b)));
    report(violations, 'releases with no ledger entry', releasesMissingLedger(releasedBatches, ledger));
    report(
      violations,
      'releases whose weights are not the ones the ledger trained',
      [...releaseOf].filter(([b, r]) => b in ledger && ledger[b]!.weightVersion !== r.weightVersion).map(([b, r]) => `${b}: release ${r.weightVersion}, ledger ${ledger[b]!.weightVersion}`),
    );

    // 5. The release the engine must come back with after a restart can be loaded.
    const current = releases.at(-1);
    if (current && current.weightVersion !== 'base' && !existsSync(join(current.checkpointPath, 'model.safetensors'))) {
      violations.push(`the current release ${current.id} (${current.weightVersion}) has no checkpoint at ${current.checkpointPath}`);
    }

    // 6. No orphan `v<n>`: a step saved by a trainer killed before its ledger entry is removed by
    // the next step, and after the drain every step has had its release.
    const checkpointDir = join(files.dataDir, 'checkpoints');
    // By name: every release's checkpoint is under this directory, and a copy of the files keeps the names.
    const released = new Set(releases.map((r) => basename(r.checkpointPath)));
    const versions = existsSync(checkpointDir) ? readdirSync(checkpointDir).filter((n) => /^v\d+$/.test(n)) : [];
    report(violations, 'checkpoints no release names', versions.filter((n) => !released.has(n)));

    const counters = state?.counters ?? {};
    return {
      counts: {
        receipts: receipts.length,
        records,
        judged: judgedRows,
        judgedDropped: dropped,
        trainedTurns: [...trainedBy.values()].reduce((a, b) => a + b.length, 0),
        batches: lineOf.size,
        releases: trainedReleases.length,
        ledgerEntries: Object.keys(ledger).length,
        checkpoints: versions.length,
        stale: counters.stale ?? 0,
        untrainable: counters.untrainable ?? 0,
        deadLetters: state?.deadLetters?.length ?? 0,
      },
      violations,
    };
  } finally {
    await store.close();
  }
}
