import { existsSync, readFileSync, appendFileSync, mkdirSync, rmSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { dirname } from 'node:path';
import { ReefError } from '../runtime/errors.js';
import type { AgentRecord, StateRows } from '../gateway/store/types.js';
import { isStale, recordToTask, releaseLineage, type Task, type TeacherRenderer } from '../../recipes/openclawrl/record2task.js';
import { Batcher, batchId, recordLine, type Batch, type BatcherState, type OutcomeReport, type TaskRef } from '../../recipes/openclawrl/task2batch.js';
import { DEFAULT_STEP_OPTIONS, groupOf, stepIndexOf, type StepRewardOptions } from '../../recipes/openclawrl/steps.js';
import { releaseKey } from './releases.js';

/**
 * The trainer-controller's logic, socket-free: judged turns → tasks → batches → training steps →
 * releases. Every stage advances by state persisted with the judged-turn offset in one
 * transaction, so a crash loses nothing and trains no batch twice (the trainer is also idempotent
 * by batch id, which covers a crash between a step and the commit that records it).
 */

/** One row of the judge's durable judged-turn log. */
export interface JudgedTurnRow {
  offset: number;
  scenario: string;
  turnRecordId: string;
  /** `hint`: accepted hints; `anchor`: score only; `dropped`: not trained. */
  decision: 'hint' | 'anchor' | 'dropped';
  reward: number;
  hints: string[];
  /** Counter names this turn adds to its batch's `judged` (next_state:user, eval:1, ...). */
  counters: string[];
}

export interface StepResult {
  batchId: string;
  weightVersion: string;
  checkpointPath: string;
  metrics: Record<string, number>;
  stepMs: number;
  trained: boolean;
}

export interface Release {
  id: string;
  weightVersion: string;
  parent: string | null;
  batchIds: string[];
  metrics: Record<string, number>;
  createdAt: number;
  checkpointPath: string;
  /** Set when this release put an earlier one back. */
  rollbackOf: string | null;
  /**
   * The API key (its principal id, auth.ts) that asked for this rollback: the weights are every
   * scenario's, so who changed them is kept with the change. null on a trained release, which no
   * key asks for, and on releases recorded before ids were kept.
   */
  keyId: string | null;
  /** How the weights reached the rollout engine (`disk` also after a failed distributed push). */
  sync: WeightSync;
}

/** `tensor`: the colocated push (`update_weights_from_tensor`). */
export type WeightSync = 'disk' | 'distributed' | 'tensor';

/** What `publish` did: the path that put the weights in, and why the distributed one was left, if it was. */
export interface Published {
  sync: WeightSync;
  /** The distributed push's error when it fell back to disk; null otherwise. */
  fallback: string | null;
}

export interface ControllerPorts {
  readJudged(offset: number, limit: number): Promise<JudgedTurnRow[]>;
  getRecord(id: string): Promise<AgentRecord | null>;
  /** Persists the next offset, the controller state and the rows of new releases atomically. */
  commit(offset: number, state: ControllerState, rows: StateRows): Promise<void>;
  /** A release by id from its row (releases.ts), for a rollback to one older than the state keeps; null when there is none. */
  getRelease(id: string): Promise<Release | null>;
  renderTeacher: TeacherRenderer;
  trainer: {
    /** (Re)starts the trainer group, loading `checkpointPath` when given. */
    restart(checkpointPath: string | null): Promise<void>;
    step(batchId: string, tasks: Task[]): Promise<StepResult>;
    load(checkpointPath: string): Promise<void>;
  };
  /**
   * Puts weights into the rollout engine, bracketed by the gateway's pause/resume. A `release`
   * (the trainer holds exactly these weights) may be pushed from the trainer; a `rollback`, or the
   * `restore` of the current release into an engine that lost it, is loaded from its checkpoint.
   */
  publish(checkpointPath: string, weightVersion: string, kind: 'release' | 'rollback' | 'restore'): Promise<Published>;
  /** The weight version the rollout engine serves now; throws when the engine cannot be asked. */
  servedVersion(): Promise<string | null>;
  /** Cumulative correlation counters for the record line. */
  correlation(): Promise<Record<string, number>>;
  /**
   * A page of a scenario's outcome reports (`POST /reef/report`), oldest first, after the cursor
   * (`RecordStore.listReports`). Absent: no outcome is ever read, and agent steps train on their
   * process reward once their group times out.
   */
  readReports?(scenario: string, after: string | null, limit: number): Promise<{ items: OutcomeReport[]; next: string | null }>;
  log(line: string): void;
  /** Notes which turns a batch id trains on (store `putBatchTurns`, for lineage); idempotent. Absent: no lineage is kept. */
  noteBatchTurns?(batchId: string, scenario: string, turnRecordIds: string[]): Promise<void>;
}

export interface ControllerOptions {
  batchSize: number;
  maxStaleness: number;
  /** JSONL file receiving one line per trained batch, or null. */
  recordFile: string | null;
  /** Checkpoints kept on disk (older ones are deleted; releases stay listed). @default 5 */
  keepCheckpoints: number;
  /**
   * Newest releases kept in the state, the rest in their rows only; raised to what checkpoint
   * retention and staleness need (`keepCheckpoints` + 1, `maxStaleness` + 2). @default 64
   */
  recentReleases?: number;
  /**
   * How often (ms) to check that the rollout engine serves the current release (`restoreEngine`).
   * @default 5000
   */
  engineCheckMs?: number;
  /** Base model directory: release 0, the target of a rollback to the start. */
  baseModelPath: string;
  /** Trainer failures tolerated per batch before giving up on this pass. @default 3 */
  maxAttempts: number;
  /**
   * false (`training.enabled: false`): every batch is formed, counted and written to the record
   * file (`trained: false`), and none is trained or released; the trainer is never started.
   * @default true
   */
  train?: boolean;
  /** Agent steps' reward combination and groups (`pipeline.task2batch.config`, stages.ts `stepRewardOptions`). @default DEFAULT_STEP_OPTIONS */
  steps?: StepRewardOptions;
  /** The clock group timeouts are read against (ms since the epoch). @default Date.now */
  now?: () => number;
}

/** Outcome reports read per scenario and tick. */
const REPORTS_PER_READ = 256;

/** A batch given up on for good: it is never trained, and it no longer holds back the ones after it. */
export interface DeadLetter {
  batch: Batch;
  /** The error's REEF_ERR_* code (callers match on it) and its message (for people). */
  code: string;
  message: string;
  /** Trainer steps it was given; 0 when its tasks could not even be built. */
  attempts: number;
  failedAt: number;
}

/**
 * Version 2. Each release is also a row of its own (releases.ts), written by the commit that
 * records it, so a commit writes the state and the one release that is new, never the history.
 */
export interface ControllerState {
  version: 2;
  batcher: BatcherState;
  /** Formed batches not yet released, in order. */
  pending: Batch[];
  /**
   * The newest releases, oldest first, at most the controller's window: what staleness, a
   * rollback to the previous release and checkpoint retention read.
   */
  recentReleases: Release[];
  /** Releases ever recorded: the next one is `release-<releaseCount + 1>`. */
  releaseCount: number;
  deadLetters: DeadLetter[];
  counters: Record<string, number>;
  /**
   * Names this history in the record file's lines: batch ids start again at 1 in a new data dir,
   * while the record file (relative to the config) may hold an earlier run's lines.
   */
  run: string;
  /** The record line of the last release, saved with it, so that a crash before the append is healed at the next start. */
  lastLine: Record<string, unknown> | null;
}

/**
 * Version 1 (no `version`): every release inside the state, which was rewritten whole on every
 * commit. Still read; the first commit after writes its releases as rows.
 */
export interface ControllerStateV1 {
  batcher: BatcherState;
  pending: Batch[];
  releases: Release[];
  /** Absent in states saved before dead letters existed. */
  deadLetters?: DeadLetter[];
  counters: Record<string, number>;
  /** Absent in states saved before runs were named: given one on load. */
  run?: string;
  lastLine?: Record<string, unknown> | null;
}

export type SavedControllerState = ControllerState | ControllerStateV1;

/** ControllerOptions.recentReleases' default. */
export const RECENT_RELEASES = 64;

/** Mean |ℓθ − ℓold| on the first batch above which the trainer and the engine disagree on the distribution. */
const FIRST_BATCH_LOGPROB_GAP = 0.02;

/** What the trainer answers for a batch it cannot take: the same answer every time it is sent. */
/**
 * New ids tried for one batch whose id the trainer's ledger holds with other tasks: one per batch
 * the ledger is ahead of the store by, which the ledger's own bound (LEDGER_KEEP) limits.
 */
const RENUMBER_LIMIT = 1024;
const PERMANENT = new Set(['REEF_ERR_INVALID_ARGUMENT', 'REEF_ERR_BAD_MESSAGE', 'REEF_ERR_UNKNOWN_MESSAGE']);

/** Whether a line of the record file is `line`'s (its run and batch id); a torn or foreign line is not. */
function sameLine(text: string, line: Record<string, unknown>): boolean {
  if (!text.includes(String(line.batch_id))) return false;
  try {
    const parsed = JSON.parse(text) as Record<string, unknown>;
    return parsed.run === line.run && parsed.batch_id === line.batch_id;
  } catch {
    return false;
  }
}

/**
 * Formed batches waiting to train past which no judged turn is read: while the trainer is down,
 * reading on grew `pending`, and the state rewritten with it on each commit, without bound. The
 * turns wait in the judged-turn log instead, which is durable already.
 */
export const MAX_PENDING_BATCHES = 16;

/**
 * Dead letters kept in the saved state, newest last; older ones stay in the log and in the
 * `dead_letters` count. Each holds its whole batch, and the state is rewritten on every commit.
 */
export const MAX_DEAD_LETTERS = 64;

/** The engine's floor for a logprob it gives no probability (−inf on the wire), as the trainer reads it. */
const LOGPROB_FLOOR = -10000;

/**
 * Why the trainer cannot take a turn's record as a task, or null: no output token, or a logprob the
 * engine did not give (recorded NaN) or gave as −inf, which no sampled token has. The trainer checks
 * the same (python_shim/reef_shim/trainer/tasks.py) and fails the whole batch for one such task.
 */
export function untrainable(rec: AgentRecord): string | null {
  if (rec.outputIds.length === 0) return 'no output token';
  const at = rec.logprobs.findIndex((lp) => !(lp > LOGPROB_FLOOR));
  return at < 0 ? null : `the engine gave output token ${at} no logprob (${rec.logprobs[at]})`;
}

export function emptyState(): ControllerState {
  return { version: 2, batcher: { lastN: {}, pending: {}, judged: {} }, pending: [], recentReleases: [], releaseCount: 0, deadLetters: [], counters: {}, run: randomUUID(), lastLine: null };
}

/** A saved state as version 2, with the releases whose rows it still lacks (all of a version 1's), by number. */
export function upgradeState(saved: SavedControllerState | null): { state: ControllerState; unsaved: [n: number, release: Release][] } {
  if (saved === null) return { state: emptyState(), unsaved: [] };
  if ('version' in saved && saved.version === 2) return { state: { ...saved, recentReleases: [...saved.recentReleases] }, unsaved: [] };
  const v1 = saved as ControllerStateV1;
  const state: ControllerState = {
    version: 2,
    batcher: v1.batcher,
    pending: v1.pending,
    recentReleases: [...v1.releases],
    releaseCount: v1.releases.length,
    deadLetters: v1.deadLetters ?? [],
    counters: v1.counters,
    run: v1.run ?? randomUUID(),
    lastLine: v1.lastLine ?? null,
  };
  // By position, as version 1 numbered them (`release-<length + 1>`).
  return { state, unsaved: v1.releases.map((r, i) => [i + 1, r]) };
}

export class TrainerController {
  private batcher: Batcher;
  private state: ControllerState;
  /** Releases whose rows the next commit writes: the new one, or every release of a version 1 state. */
  private readonly unsaved: [n: number, release: Release][];
  /** How many releases `recentReleases` holds at most. */
  private readonly window: number;
  /**
   * Whether the group holds what the last release holds, as far as this controller knows: true only
   * after a restart that succeeded, false after any failure on the way (a failed restart leaves
   * the base weights loaded; a failed step or rollback leaves them unknown).
   */
  private trainerReady = false;
  /**
   * Training and rollbacks take turns: the actor host runs a rollback while a tick is under way,
   * and a rollback between a step and its publish would leave the engine, the trainer and the
   * release lineage disagreeing on which weights are current.
   */
  private turn: Promise<unknown> = Promise.resolve();
  /** When `restoreEngine` last asked the engine (ms since the epoch); 0: not yet. */
  private engineCheckedAt = 0;
  private engineVersionless = false;

  constructor(private readonly ports: ControllerPorts, private readonly opts: ControllerOptions, private offset: number, saved: SavedControllerState | null) {
    ({ state: this.state, unsaved: this.unsaved } = upgradeState(saved));
    // Retention must see a release leave its newest `keepCheckpoints` while the state still holds
    // it, and the lineage a turn is checked against must reach `maxStaleness` steps back.
    this.window = Math.max(opts.recentReleases ?? RECENT_RELEASES, opts.keepCheckpoints + 1, opts.maxStaleness + 2);
    this.trimReleases();
    this.batcher = new Batcher(opts.batchSize, this.state.batcher, opts.steps ?? DEFAULT_STEP_OPTIONS);
    if (this.state.lastLine) this.writeRecordLine(this.state.lastLine);
    // A crash between a release's commit and its pruning left checkpoints that the next prune, once
    // that release has left the state, would no longer see.
    this.pruneCheckpoints();
  }

  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.turn.then(fn);
    this.turn = run.catch(() => {});
    return run;
  }

  get currentVersion(): string | null {
    return this.state.recentReleases.at(-1)?.weightVersion ?? null;
  }

  /** What the trainer group restarts from: the last release's checkpoint, or null for the base model. */
  get lastCheckpoint(): string | null {
    return this.state.recentReleases.at(-1)?.checkpointPath ?? null;
  }

  /** The newest releases, oldest first (every release: releases.ts `readReleases`). */
  get recentReleases(): readonly Release[] {
    return this.state.recentReleases;
  }

  /** Releases ever recorded, rollbacks included. */
  get releaseCount(): number {
    return this.state.releaseCount;
  }

  get counters(): Readonly<Record<string, number>> {
    return this.state.counters;
  }

  get deadLetters(): readonly DeadLetter[] {
    return this.state.deadLetters ?? [];
  }

  private bump(name: string, by = 1): void {
    this.state.counters[name] = (this.state.counters[name] ?? 0) + by;
  }

  /**
   * Reads new judged turns into batches (persisted), then trains and releases pending batches, one
   * at a time, so that a rollback asked meanwhile waits for one batch at most. Returns rows read.
   */
  async tick(limit = 256): Promise<number> {
    await this.exclusive(() => this.restoreEngine());
    const read = await this.exclusive(() => this.readTurns(limit));
    let more = true;
    while (more) {
      more = await this.exclusive(async () => {
        try {
          return await this.trainNext();
        } catch (err) {
          this.trainerReady = false;
          throw err;
        }
      });
    }
    return read;
  }

  /**
   * Puts the current release back into the rollout engine when the engine serves other weights.
   * An engine started from the layout comes up with the base weights: `reef up` on a data dir with
   * releases, or an engine restarted with its shim. The agent would then get the base model's
   * replies while every release stays listed as current, and each new turn, sampled from the base,
   * would be stale, so training would never resume.
   */
  private async restoreEngine(): Promise<void> {
    const now = Date.now();
    if (now - this.engineCheckedAt < (this.opts.engineCheckMs ?? 5000)) return;
    this.engineCheckedAt = now;
    const current = this.state.recentReleases.at(-1);
    if (!current) return;
    let served: string | null;
    try {
      served = await this.ports.servedVersion();
    } catch (err) {
      this.ports.log(`could not ask the rollout engine which weights it serves (${(err as Error).message}); asking again in a while`);
      return;
    }
    if (served === current.weightVersion) return;
    if (served === null) {
      // Such an engine would be reloaded at every check: say so once and leave it alone.
      if (!this.engineVersionless) this.ports.log('the rollout engine reports no weight version, so whether it serves the current release cannot be checked');
      this.engineVersionless = true;
      return;
    }
    this.ports.log(`the rollout engine serves ${served}, not the current release ${current.weightVersion}: loading ${current.checkpointPath} into it`);
    await this.ports.publish(current.checkpointPath, current.weightVersion, 'restore');
    this.bump('engine_restores');
    await this.persist();
  }

  private async readTurns(limit: number): Promise<number> {
    if (this.state.pending.length >= MAX_PENDING_BATCHES) return 0;
    const rows = await this.ports.readJudged(this.offset, limit);
    // Releases change only between reads (trainNext and rollback take turns with this).
    const lineage = releaseLineage(this.state.recentReleases);
    let read = 0;
    const now = (this.opts.now ?? Date.now)();
    for (const row of rows) {
      // Stopped where the cap is reached, mid-read too: the offset says where to go on from.
      if (this.state.pending.length >= MAX_PENDING_BATCHES) break;
      read++;
      this.batcher.count(row.scenario, row.counters);
      this.offset = row.offset + 1;
      // A dropped turn's record is read too: an agent step's counts toward its episode's report.
      const rec = await this.ports.getRecord(row.turnRecordId);
      const group = rec ? groupOf(rec.tags) : null;
      const skip = () => {
        if (group !== null) this.batcher.addStep(row.scenario, group, row.turnRecordId, null, now);
      };
      if (row.decision === 'dropped') {
        skip();
        continue;
      }
      if (!rec) {
        this.bump('missing_records');
        continue;
      }
      if (isStale(rec.weightVersion, lineage, this.opts.maxStaleness)) {
        this.bump('stale');
        skip();
        continue;
      }
      const why = untrainable(rec);
      if (why !== null) {
        // The trainer refuses such a task, and with it the whole batch: the other turns were dead-lettered too.
        this.bump('untrainable');
        this.ports.log(`turn ${row.turnRecordId} is not trained: ${why}`);
        skip();
        continue;
      }
      if (group !== null) {
        // Waits in its group for the episode's outcome and the parallel rollouts (task2batch.ts).
        this.batcher.addStep(row.scenario, group, row.turnRecordId, { process: row.reward, index: stepIndexOf(rec.request.messages), hints: row.hints }, now);
        continue;
      }
      const batch = this.batcher.add(row.scenario, { turnRecordId: row.turnRecordId, reward: row.reward, hints: row.hints });
      if (batch) this.state.pending.push(batch);
    }
    const outcomes = await this.readOutcomes(now);
    // Group and bucket counts go to the controller's counters too (the reef_training metrics).
    const tally: Record<string, number> = {};
    const flushed = this.batcher.flushGroups(now, tally);
    for (const [name, n] of Object.entries(tally)) this.bump(name, n);
    for (const batch of flushed) this.state.pending.push(batch);
    if (flushed.length > 0) this.bump('step_batches', flushed.length);
    if (read > 0 || outcomes > 0 || flushed.length > 0) await this.persist();
    return read;
  }

  /**
   * Reads the outcome reports of the scenarios that have agent steps into the batcher; their
   * cursors are saved with it, so a report is applied once across crashes. Returns reports read.
   */
  private async readOutcomes(now: number): Promise<number> {
    if (this.ports.readReports === undefined) return 0;
    let read = 0;
    for (const [scenario, at] of this.batcher.reportCursors()) {
      const page = await this.ports.readReports(scenario, at.cursor, REPORTS_PER_READ);
      const seen = new Set(at.seen);
      for (const r of page.items) {
        if (seen.has(r.id)) continue;
        read++;
        if (!Number.isFinite(r.score)) {
          this.bump('reports_invalid');
          continue;
        }
        // Filed before any group still waiting began: the scenario's history of reports (read from
        // its start when its first agent step comes), which would only fill the state until it timed out.
        if (r.createdAt !== undefined && now - r.createdAt > this.batcher.steps.groupTimeoutMs) {
          this.bump('reports_too_old');
          continue;
        }
        this.batcher.report(scenario, r, now);
      }
      // A last page is read again from the same cursor until it fills: its reports applied are kept to skip.
      this.batcher.setReportCursor(scenario, page.next !== null ? { cursor: page.next, seen: [] } : { cursor: at.cursor, seen: page.items.map((r) => r.id) });
    }
    if (read > 0) this.bump('reports', read);
    return read;
  }

  private async persist(): Promise<void> {
    this.state.batcher = this.batcher.toJSON();
    const put = this.unsaved.map(([n, r]): [string, unknown] => [releaseKey(n), r]);
    await this.ports.commit(this.offset, this.state, { put, delete: [] });
    // Kept on a failed commit: the next one writes them.
    this.unsaved.splice(0, put.length);
  }

  /** Records a release under the next number, kept in the state and saved as its row by the next commit. */
  private addRelease(fields: Omit<Release, 'id'>): Release {
    const n = ++this.state.releaseCount;
    const release: Release = { id: `release-${n}`, ...fields };
    this.state.recentReleases.push(release);
    this.unsaved.push([n, release]);
    this.trimReleases();
    return release;
  }

  /**
   * Only the newest `window` releases stay in the state. A staleness lineage that runs past them
   * (a rollback to a release older than the window, then further back through its parents) stops
   * there, and turns of the older versions count as stale: they were sampled at least a window of
   * releases ago.
   */
  private trimReleases(): void {
    const rels = this.state.recentReleases;
    if (rels.length > this.window) rels.splice(0, rels.length - this.window);
  }

  /** A release by id: from the state, from a version 1 state's releases not yet in rows, or from its row. */
  private async findRelease(id: string): Promise<Release | null> {
    return this.state.recentReleases.find((r) => r.id === id) ?? this.unsaved.find(([, r]) => r.id === id)?.[1] ?? (await this.ports.getRelease(id));
  }

  /**
   * The turns of a batch with their records. A turn whose record is gone was deleted on request
   * (retention keeps every record a batch may still train) and is left out, counted as
   * `turns_deleted`: dead-lettering the batch for it took the other users' turns out of training.
   */
  private async presentTurns(batch: Batch): Promise<{ ref: TaskRef; record: AgentRecord }[]> {
    const turns: { ref: TaskRef; record: AgentRecord }[] = [];
    for (const ref of batch.tasks) {
      const record = await this.ports.getRecord(ref.turnRecordId);
      if (record) turns.push({ ref, record });
    }
    if (turns.length < batch.tasks.length) this.bump('turns_deleted', batch.tasks.length - turns.length);
    return turns;
  }

  /**
   * Deletion on request (the gateway's `forget-records`): these turns leave the batcher's unbatched
   * tasks and the formed batches not trained yet, and the change is saved. It takes its turn after
   * the batch being trained. Answers how many tasks were dropped. A batch trained already is not
   * undone: its release is in the lineage, and rolling back is the operator's choice.
   */
  async forget(ids: readonly string[]): Promise<number> {
    const doomed = new Set(ids);
    return this.exclusive(async () => {
      const saved = this.batcher.toJSON();
      let dropped = 0;
      for (const [scenario, refs] of Object.entries(saved.pending)) {
        const kept = refs.filter((r) => !doomed.has(r.turnRecordId));
        dropped += refs.length - kept.length;
        saved.pending[scenario] = kept;
      }
      const batches: Batch[] = [];
      for (const b of this.state.pending) {
        const kept = b.tasks.filter((r) => !doomed.has(r.turnRecordId));
        dropped += b.tasks.length - kept.length;
        if (kept.length > 0) batches.push(kept.length === b.tasks.length ? b : { ...b, tasks: kept });
      }
      if (dropped === 0) return 0;
      this.batcher = new Batcher(this.opts.batchSize, saved, this.opts.steps ?? DEFAULT_STEP_OPTIONS);
      this.state.pending = batches;
      this.bump('turns_deleted', dropped);
      await this.persist();
      return dropped;
    });
  }

  /** Restarts the group from the last release; only a restart that succeeded makes it ready. */
  private async restartTrainer(): Promise<void> {
    this.trainerReady = false;
    await this.ports.trainer.restart(this.lastCheckpoint);
    this.trainerReady = true;
  }

  /**
   * The first pending batch narrowed to the turns `kept`, persisted before the step, so that a
   * retry after a crash trains (or finds in the ledger) this same batch; null when none is kept,
   * and the batch is dropped, logged as `why`.
   */
  private async narrowFirst(batch: Batch, kept: TaskRef[], why: string): Promise<Batch | null> {
    if (kept.length === batch.tasks.length) return batch;
    if (kept.length === 0) {
      this.state.pending.shift();
      await this.persist();
      this.ports.log(`batch ${batch.batchId}: ${why}; not trained`);
      return null;
    }
    const narrowed = { ...batch, tasks: kept };
    this.state.pending[0] = narrowed;
    await this.persist();
    return narrowed;
  }

  /** The first pending batch under the scenario's next batch number, persisted before it trains. */
  private async renumberFirst(batch: Batch): Promise<Batch> {
    const n = this.batcher.claimNumber(batch.scenario);
    const renamed = { ...batch, n, batchId: batchId(batch.scenario, n) };
    this.state.pending[0] = renamed;
    await this.persist();
    return renamed;
  }

  /** Trains and releases the first pending batch, or dead-letters it; false when none is pending. */
  private async trainNext(): Promise<boolean> {
    let batch = this.state.pending[0];
    if (!batch) return false;
    if (this.opts.train === false) return this.setAside(batch);
    const tasks: Task[] = [];
    try {
      const turns = await this.presentTurns(batch);
      const present = await this.narrowFirst(batch, turns.map((t) => t.ref), 'every turn of it was deleted on request');
      if (present === null) return true;
      batch = present;
      // Staleness again, now that the batch is about to train: a backlog read in one tick forms
      // many batches, and the last of them trains many releases after the read found its turns
      // fresh; a rollback since then may also have put their weights aside.
      const lineage = releaseLineage(this.state.recentReleases);
      const fresh = turns.filter((t) => !isStale(t.record.weightVersion, lineage, this.opts.maxStaleness));
      if (fresh.length < turns.length) this.bump('stale', turns.length - fresh.length);
      const unstale = await this.narrowFirst(batch, fresh.map((t) => t.ref), 'every turn went stale before it could train');
      if (unstale === null) return true;
      batch = unstale;
      const rendered: TaskRef[] = [];
      for (const { ref, record } of fresh) {
        try {
          tasks.push(await recordToTask({ record, reward: ref.reward, hints: ref.hints }, this.ports.renderTeacher));
          rendered.push(ref);
        } catch (err) {
          // The recorded request and the template are what they are: a teacher prompt that cannot
          // be rendered never will be. Left out, the turn costs neither its batch (dead-lettered
          // with it) nor training (a plain error failed every tick on this same batch).
          this.bump('untrainable');
          this.ports.log(`turn ${ref.turnRecordId} is not trained: its teacher prompt cannot be rendered: ${(err as Error).message}`);
        }
      }
      const renderable = await this.narrowFirst(batch, rendered, "no turn's teacher prompt could be rendered");
      if (renderable === null) return true;
      batch = renderable;
    } catch (err) {
      // A record that is gone, or that cannot be rendered, stays so: the batch could never train.
      if (err instanceof ReefError && !err.retryable) return this.deadLetter(batch, err, 0);
      throw err;
    }
    let result: StepResult | null = null;
    let renumbered = 0;
    for (let attempt = 1; result === null; attempt++) {
      let stage: 'restart' | 'step' | 'load' = 'restart';
      try {
        // A new controller (a first start, or after its own crash) cannot know what a group left
        // running holds, nor can one whose last restart, step or rollback failed: start it from the
        // last release. Training on without it trained the next batch on the base weights.
        if (!this.trainerReady) await this.restartTrainer();
        // Lineage (GET /reef/scenarios/{s}/lineage): which turns this batch id trains on, noted
        // before it trains; the release that trains it names the id. Idempotent across retries.
        await this.ports.noteBatchTurns?.(batch.batchId, batch.scenario, batch.tasks.map((t) => t.turnRecordId));
        stage = 'step';
        const r = await this.ports.trainer.step(batch.batchId, tasks);
        stage = 'load';
        // A batch the trainer's ledger already holds (we crashed between its step and our commit)
        // was not trained by this group: load its checkpoint, so the next batch trains on top of it.
        // Inside the retries: a group broken meanwhile fails the load until it is restarted.
        if (!r.trained) await this.ports.trainer.load(r.checkpointPath);
        result = r;
      } catch (err) {
        const code = err instanceof ReefError ? err.code : null;
        if (stage === 'step' && code === 'REEF_ERR_CONFLICT' && renumbered < RENUMBER_LIMIT) {
          // The trainer's ledger trained this id on other tasks: our state is older than the ledger
          // (the store lost commits to a power loss, or was restored). Under a new id the batch
          // trains; the group is fine, and the attempt is not the batch's failure.
          renumbered++;
          attempt--;
          const old = batch.batchId;
          batch = await this.renumberFirst(batch);
          this.bump('batches_renumbered');
          this.ports.log(`batch ${old}: ${(err as Error).message}; training it as ${batch.batchId}`);
          continue;
        }
        this.trainerReady = false;
        this.ports.log(`batch ${batch.batchId}: trainer ${stage} failed (attempt ${attempt}): ${(err as Error).message}`);
        if (stage === 'restart' && code === 'REEF_ERR_INVALID_ARGUMENT') {
          // The last release's checkpoint is unusable (cut short, a tensor missing): every restart
          // will fail alike, and no batch trains until an operator puts another release back.
          this.ports.log(`the last release's checkpoint ${this.lastCheckpoint} cannot be loaded, so training waits: roll back to an earlier release (POST /reef/scenarios/{scenario}/releases/rollback) to train on from it`);
        }
        // Only the step's answer is a verdict on the batch; a failed restart or load is the
        // group's trouble, and the batch waits for it in pending.
        if (stage === 'step' && code !== null && PERMANENT.has(code)) return this.deadLetter(batch, err as ReefError, attempt);
        if (attempt >= this.opts.maxAttempts) {
          // REEF_ERR_TRAINER from a step (a non-finite loss) that every fresh group from the last
          // release answered alike is the batch's. A dead rank, shim or timeout is not.
          if (stage === 'step' && code === 'REEF_ERR_TRAINER') return this.deadLetter(batch, err as ReefError, attempt);
          throw err;
        }
        // A dead rank takes the group down: the next attempt starts it again from the last
        // release and retries the same batch id; the trainer's ledger keeps it from training twice.
        this.bump('trainer_restarts');
      }
    }
    const published = await this.ports.publish(result.checkpointPath, result.weightVersion, 'release');
    this.countSync(published);
    const parent = this.currentVersion;
    this.checkFirstBatchLogprobs(batch, result.metrics);
    const release = this.addRelease({
      weightVersion: result.weightVersion,
      parent,
      batchIds: [batch.batchId],
      metrics: result.metrics,
      createdAt: Date.now(),
      checkpointPath: result.checkpointPath,
      rollbackOf: null,
      keyId: null,
      sync: published.sync,
    });
    this.state.pending.shift();
    this.bump('batches');
    this.bump('samples', batch.tasks.length);
    const overlong = result.metrics.teacher_candidates_overlong ?? 0;
    if (overlong > 0) this.bump('teacher_candidates_overlong', overlong);
    const line = this.opts.recordFile ? { ...recordLine(batch, await this.ports.correlation()), run: this.state.run } : null;
    this.state.lastLine = line;
    await this.persist();
    if (line) this.writeRecordLine(line);
    this.pruneCheckpoints();
    this.ports.log(`released ${release.weightVersion} from ${batch.batchId} (${batch.tasks.length} samples, loss ${result.metrics.loss?.toFixed?.(4) ?? '?'}, ${Math.round(result.stepMs)} ms)`);
    return true;
  }

  /**
   * With training off: the first pending batch is recorded as it would have trained, and left. The
   * line and the shift are saved together, as a release's are, so a crash writes it once.
   */
  private async setAside(batch: Batch): Promise<boolean> {
    this.state.pending.shift();
    this.bump('batches_untrained');
    const line = this.opts.recordFile ? { ...recordLine(batch, await this.ports.correlation()), run: this.state.run, trained: false } : null;
    this.state.lastLine = line;
    await this.persist();
    if (line) this.writeRecordLine(line);
    this.ports.log(`batch ${batch.batchId} (${batch.tasks.length} samples) not trained: training.enabled is false`);
    return true;
  }

  /**
   * Gives up on the first pending batch for good, recording why with it, and moves on. Persisted
   * with the shift, so a restarted controller does not take it up again; never trained, so no
   * turn of it is trained twice.
   */
  private async deadLetter(batch: Batch, err: ReefError, attempts: number): Promise<boolean> {
    const letters = this.state.deadLetters;
    letters.push({ batch, code: err.code, message: err.message, attempts, failedAt: Date.now() });
    if (letters.length > MAX_DEAD_LETTERS) letters.splice(0, letters.length - MAX_DEAD_LETTERS);
    this.state.pending.shift();
    this.bump('dead_letters');
    await this.persist();
    this.ports.log(`batch ${batch.batchId} dead-lettered after ${attempts} step(s), not trained: ${err.code}: ${err.message}`);
    return true;
  }

  /**
   * The first batch is trained on the weights that sampled all of its turns, so ℓθ before the
   * update should give back the engine's logprobs (1e-7 in fp32, ~1e-3 in bf16). Far more means the
   * trainer scores another distribution than the engine reports (`training.engine_logprobs`,
   * `--dtype`, another model), and every ratio is off: say so where the operator looks.
   */
  private checkFirstBatchLogprobs(batch: Batch, metrics: Record<string, number>): void {
    const diff = metrics.train_rollout_logprob_abs_diff;
    if (this.state.releaseCount > 0 || diff === undefined || !(diff > FIRST_BATCH_LOGPROB_GAP)) return;
    this.bump('logprob_mismatch_warnings');
    this.ports.log(`warning: batch ${batch.batchId}, the first, was sampled by the weights it trained, yet the trainer's logprobs differ from the engine's by ${diff.toPrecision(3)} on average (expected below ${FIRST_BATCH_LOGPROB_GAP}): check training.engine_logprobs (how the engine reports logprobs), --dtype and that trainer and engine load the same model`);
  }

  private countSync(p: Published): void {
    this.bump(`weight_sync_${p.sync}`);
    if (p.fallback !== null) this.bump('weight_sync_fallbacks');
  }

  /**
   * Appends a release's line unless the file has it: written after the release is saved, and again
   * at the next start should the process have died in between. Lines are told apart by run and
   * batch id, so another run's line with the same batch id is not this one.
   */
  private writeRecordLine(line: Record<string, unknown>): void {
    const file = this.opts.recordFile;
    if (!file) return;
    mkdirSync(dirname(file), { recursive: true });
    if (existsSync(file) && readFileSync(file, 'utf8').split('\n').some((l) => sameLine(l, line))) return;
    appendFileSync(file, `${JSON.stringify(line)}\n`);
  }

  private pruneCheckpoints(): void {
    const rels = this.state.recentReleases;
    const keep = new Set(rels.slice(-this.opts.keepCheckpoints).map((r) => r.checkpointPath));
    for (const r of rels) {
      if (keep.has(r.checkpointPath) || r.checkpointPath === this.opts.baseModelPath || !existsSync(r.checkpointPath)) continue;
      rmSync(r.checkpointPath, { recursive: true, force: true });
    }
  }

  /**
   * Puts an earlier release back into the engine and the trainer: `releaseId`, 'base', or null for
   * the one before the release that was current when the rollback was asked. It waits for the
   * batch being trained, if any, to be released first. `keyId` is who asked, kept on the release.
   */
  async rollback(releaseId: string | null, keyId: string | null = null): Promise<Release> {
    const rels = this.state.recentReleases;
    const target = releaseId === null ? (rels.length >= 2 ? rels[rels.length - 2]! : null) : releaseId === 'base' ? null : await this.findRelease(releaseId);
    const base = releaseId === 'base' || (releaseId === null && this.state.releaseCount === 1);
    if (!target && !base) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `release ${releaseId ?? '(previous)'}` });
    return this.exclusive(async () => {
      const path = base ? this.opts.baseModelPath : target!.checkpointPath;
      // Checked now: retention may have pruned it while the rollback waited for its turn.
      if (!existsSync(path)) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `checkpoint ${path} (pruned by retention)` });
      const version = base ? 'base' : target!.weightVersion;
      const parent = this.currentVersion;
      try {
        // A group that is not ready may have lost a rank (a failed step or rollback): a load there
        // fails until it is restarted, which only a pending batch did, so with none pending every
        // rollback failed alike. The restart loads the target itself.
        if (this.trainerReady) await this.ports.trainer.load(path);
        else await this.ports.trainer.restart(path);
        const published = await this.ports.publish(path, version, 'rollback');
        this.countSync(published);
        const release = this.addRelease({
          weightVersion: version,
          parent,
          batchIds: [],
          metrics: {},
          createdAt: Date.now(),
          checkpointPath: path,
          rollbackOf: base ? 'base' : target!.id,
          keyId,
          sync: published.sync,
        });
        await this.persist();
        this.trainerReady = true; // it holds the last release now
        // As after a trained release: the state must still hold each release leaving the newest
        // `keepCheckpoints` when its checkpoint is pruned.
        this.pruneCheckpoints();
        return release;
      } catch (err) {
        // The trainer may hold the rollback (or, after a failed load, anything) while the
        // releases still end at the old current: the next step restarts it from that one.
        this.trainerReady = false;
        throw err;
      }
    });
  }
}
