import { existsSync, readFileSync, appendFileSync, mkdirSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { ReefError } from '../runtime/errors.js';
import type { AgentRecord } from '../gateway/store/types.js';
import { isStale, recordToTask, type Task, type TeacherRenderer } from '../../recipes/openclawrl/record2task.js';
import { Batcher, recordLine, type Batch, type BatcherState } from '../../recipes/openclawrl/task2batch.js';

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
  /** How the weights reached the rollout engine (`disk` also after a failed distributed push). */
  sync: WeightSync;
}

export type WeightSync = 'disk' | 'distributed';

/** What `publish` did: the path that put the weights in, and why the distributed one was left, if it was. */
export interface Published {
  sync: WeightSync;
  /** The distributed push's error when it fell back to disk; null otherwise. */
  fallback: string | null;
}

export interface ControllerPorts {
  readJudged(offset: number, limit: number): Promise<JudgedTurnRow[]>;
  getRecord(id: string): Promise<AgentRecord | null>;
  /** Persists the next offset and the controller state atomically. */
  commit(offset: number, state: ControllerState): Promise<void>;
  renderTeacher: TeacherRenderer;
  trainer: {
    /** (Re)starts the trainer group, loading `checkpointPath` when given. */
    restart(checkpointPath: string | null): Promise<void>;
    step(batchId: string, tasks: Task[]): Promise<StepResult>;
    load(checkpointPath: string): Promise<void>;
  };
  /**
   * Puts weights into the rollout engine, bracketed by the gateway's pause/resume. A `release`
   * (the trainer holds exactly these weights) may be pushed from the trainer; a `rollback` is
   * always loaded from its checkpoint.
   */
  publish(checkpointPath: string, weightVersion: string, kind: 'release' | 'rollback'): Promise<Published>;
  /** Cumulative correlation counters for the record line. */
  correlation(): Promise<Record<string, number>>;
  log(line: string): void;
}

export interface ControllerOptions {
  batchSize: number;
  maxStaleness: number;
  /** JSONL file receiving one line per trained batch, or null. */
  recordFile: string | null;
  /** Checkpoints kept on disk (older ones are deleted; releases stay listed). @default 5 */
  keepCheckpoints: number;
  /** Base model directory: release 0, the target of a rollback to the start. */
  baseModelPath: string;
  /** Trainer failures tolerated per batch before giving up on this pass. @default 3 */
  maxAttempts: number;
}

export interface ControllerState {
  batcher: BatcherState;
  /** Formed batches not yet released, in order. */
  pending: Batch[];
  releases: Release[];
  counters: Record<string, number>;
}

const PERMANENT = new Set(['REEF_ERR_INVALID_ARGUMENT', 'REEF_ERR_BAD_MESSAGE', 'REEF_ERR_UNKNOWN_MESSAGE']);

export function emptyState(): ControllerState {
  return { batcher: { lastN: {}, pending: {}, judged: {} }, pending: [], releases: [], counters: {} };
}

export class TrainerController {
  private readonly batcher: Batcher;
  private state: ControllerState;
  /** Whether this controller has (re)started the trainer group since it was constructed. */
  private trainerReady = false;

  constructor(private readonly ports: ControllerPorts, private readonly opts: ControllerOptions, private offset: number, state: ControllerState | null) {
    this.state = state ?? emptyState();
    this.batcher = new Batcher(opts.batchSize, this.state.batcher);
  }

  get currentVersion(): string | null {
    return this.state.releases.at(-1)?.weightVersion ?? null;
  }

  /** What the trainer group restarts from: the last release's checkpoint, or null for the base model. */
  private get lastCheckpoint(): string | null {
    return this.state.releases.at(-1)?.checkpointPath ?? null;
  }

  get releases(): readonly Release[] {
    return this.state.releases;
  }

  get counters(): Readonly<Record<string, number>> {
    return this.state.counters;
  }

  private bump(name: string, by = 1): void {
    this.state.counters[name] = (this.state.counters[name] ?? 0) + by;
  }

  /** Reads new judged turns into batches (persisted), then trains and releases pending batches. Returns rows read. */
  async tick(limit = 256): Promise<number> {
    const rows = await this.ports.readJudged(this.offset, limit);
    for (const row of rows) {
      this.batcher.count(row.scenario, row.counters);
      this.offset = row.offset + 1;
      if (row.decision === 'dropped') continue;
      const rec = await this.ports.getRecord(row.turnRecordId);
      if (!rec) {
        this.bump('missing_records');
        continue;
      }
      if (isStale(rec.weightVersion, this.currentVersion, this.opts.maxStaleness)) {
        this.bump('stale');
        continue;
      }
      const batch = this.batcher.add(row.scenario, { turnRecordId: row.turnRecordId, reward: row.reward, hints: row.hints });
      if (batch) this.state.pending.push(batch);
    }
    if (rows.length > 0) await this.persist();
    while (this.state.pending.length > 0) await this.trainNext();
    return rows.length;
  }

  private async persist(): Promise<void> {
    this.state.batcher = this.batcher.toJSON();
    await this.ports.commit(this.offset, this.state);
  }

  private async trainNext(): Promise<void> {
    const batch = this.state.pending[0]!;
    const tasks: Task[] = [];
    for (const ref of batch.tasks) {
      const rec = await this.ports.getRecord(ref.turnRecordId);
      if (!rec) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `record ${ref.turnRecordId} of batch ${batch.batchId}` });
      tasks.push(await recordToTask({ record: rec, reward: ref.reward, hints: ref.hints }, this.ports.renderTeacher));
    }
    if (!this.trainerReady) {
      // A new controller (a first start, or after its own crash) cannot know what a group left
      // running holds: start it from the last release, as after a rank crash. Starting from the
      // base model here would have trained the next batch on the base weights.
      await this.ports.trainer.restart(this.lastCheckpoint);
      this.trainerReady = true;
    }
    let result: StepResult | null = null;
    for (let attempt = 1; result === null; attempt++) {
      try {
        result = await this.ports.trainer.step(batch.batchId, tasks);
      } catch (err) {
        // A malformed batch fails the same way every time; anything else (a dead rank, a dead
        // shim, a timeout) is worth a restart of the group.
        const permanent = err instanceof ReefError && PERMANENT.has(err.code);
        this.ports.log(`batch ${batch.batchId}: training failed (attempt ${attempt}): ${(err as Error).message}`);
        if (permanent || attempt >= this.opts.maxAttempts) throw err;
        // A dead rank takes the group down: start it again from the last release and retry the
        // same batch id; the trainer's record of finished batches keeps it from training twice.
        this.bump('trainer_restarts');
        await this.ports.trainer.restart(this.lastCheckpoint);
      }
    }
    // A batch the trainer's ledger already holds (we crashed between its step and our commit) was
    // not trained by this group: load its checkpoint, so the next batch trains on top of it.
    if (!result.trained) await this.ports.trainer.load(result.checkpointPath);
    const published = await this.ports.publish(result.checkpointPath, result.weightVersion, 'release');
    this.countSync(published);
    const parent = this.currentVersion;
    const release: Release = {
      id: `release-${this.state.releases.length + 1}`,
      weightVersion: result.weightVersion,
      parent,
      batchIds: [batch.batchId],
      metrics: result.metrics,
      createdAt: Date.now(),
      checkpointPath: result.checkpointPath,
      rollbackOf: null,
      sync: published.sync,
    };
    this.state.releases.push(release);
    this.state.pending.shift();
    this.bump('batches');
    this.bump('samples', batch.tasks.length);
    await this.persist();
    this.writeRecordLine(batch, await this.ports.correlation());
    this.pruneCheckpoints();
    this.ports.log(`released ${release.weightVersion} from ${batch.batchId} (${batch.tasks.length} samples, loss ${result.metrics.loss?.toFixed?.(4) ?? '?'}, ${Math.round(result.stepMs)} ms)`);
  }

  private countSync(p: Published): void {
    this.bump(`weight_sync_${p.sync}`);
    if (p.fallback !== null) this.bump('weight_sync_fallbacks');
  }

  /** Appends the batch's line once: a crash between the commit and the append is healed on the next line. */
  private writeRecordLine(batch: Batch, correlation: Record<string, number>): void {
    const file = this.opts.recordFile;
    if (!file) return;
    mkdirSync(dirname(file), { recursive: true });
    if (existsSync(file) && readFileSync(file, 'utf8').split('\n').some((l) => l.includes(`"batch_id":${JSON.stringify(batch.batchId)}`))) return;
    appendFileSync(file, `${JSON.stringify(recordLine(batch, correlation))}\n`);
  }

  private pruneCheckpoints(): void {
    const keep = new Set(this.state.releases.slice(-this.opts.keepCheckpoints).map((r) => r.checkpointPath));
    for (const r of this.state.releases) {
      if (keep.has(r.checkpointPath) || r.checkpointPath === this.opts.baseModelPath || !existsSync(r.checkpointPath)) continue;
      rmSync(r.checkpointPath, { recursive: true, force: true });
    }
  }

  /** Puts an earlier release (default: the one before the current) back into the engine and the trainer. */
  async rollback(releaseId: string | null): Promise<Release> {
    const rels = this.state.releases;
    const current = rels.at(-1) ?? null;
    const target = releaseId === null ? (rels.length >= 2 ? rels[rels.length - 2]! : null) : (rels.find((r) => r.id === releaseId) ?? null);
    const base = releaseId === 'base' || (releaseId === null && rels.length === 1);
    if (!target && !base) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `release ${releaseId ?? '(previous)'}` });
    const path = base ? this.opts.baseModelPath : target!.checkpointPath;
    if (!existsSync(path)) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `checkpoint ${path} (pruned by retention)` });
    const version = base ? 'base' : target!.weightVersion;
    await this.ports.trainer.load(path);
    const published = await this.ports.publish(path, version, 'rollback');
    this.countSync(published);
    const release: Release = {
      id: `release-${rels.length + 1}`,
      weightVersion: version,
      parent: current?.weightVersion ?? null,
      batchIds: [],
      metrics: {},
      createdAt: Date.now(),
      checkpointPath: path,
      rollbackOf: base ? 'base' : target!.id,
      sync: published.sync,
    };
    rels.push(release);
    await this.persist();
    return release;
  }
}
