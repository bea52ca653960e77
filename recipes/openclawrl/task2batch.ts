/**
 * task2batch: every `batch_size` tasks of a scenario form one batch with the monotonic id
 * `{scenario}:openclawrl:{n}`. The batcher is pure and its state serialisable, so the
 * trainer-controller persists it with its offset in one transaction: each task lands in exactly
 * one batch, across crashes too.
 */

/** What a batch keeps of a task: enough to rebuild it from the store. */
export interface TaskRef {
  turnRecordId: string;
  reward: number;
  hints: string[];
}

/** Per-batch judge counters, as the record line reports them. */
export type JudgedCounters = Record<string, number>;

export interface Batch {
  batchId: string;
  /** The batch's number within its scenario, from 1. */
  n: number;
  scenario: string;
  tasks: TaskRef[];
  /** Judge counters of every turn judged since the scenario's previous batch (dropped ones too). */
  judged: JudgedCounters;
}

export interface BatcherState {
  lastN: Record<string, number>;
  pending: Record<string, TaskRef[]>;
  judged: Record<string, JudgedCounters>;
}

export function batchId(scenario: string, n: number): string {
  return `${scenario}:openclawrl:${n}`;
}

export class Batcher {
  private state: BatcherState;

  constructor(readonly batchSize: number, state: BatcherState | null = null) {
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new Error(`batch_size must be a positive integer, got ${batchSize}`);
    this.state = state ? structuredClone(state) : { lastN: {}, pending: {}, judged: {} };
  }

  /** Counts one judged turn of `scenario` (trained or dropped) under the given counter names. */
  count(scenario: string, names: readonly string[]): void {
    const c = (this.state.judged[scenario] ??= {});
    for (const n of names) c[n] = (c[n] ?? 0) + 1;
  }

  /** Adds a task; returns the batch it completed, if any. */
  add(scenario: string, task: TaskRef): Batch | null {
    const pending = (this.state.pending[scenario] ??= []);
    pending.push(task);
    if (pending.length < this.batchSize) return null;
    const n = (this.state.lastN[scenario] ?? 0) + 1;
    this.state.lastN[scenario] = n;
    // Oldest first, and never more than batch_size: state saved under a larger batch_size holds
    // more pending tasks than one batch may take; the rest go into the batches after it.
    const tasks = pending.splice(0, this.batchSize);
    const judged = this.state.judged[scenario] ?? {};
    this.state.judged[scenario] = {};
    return { batchId: batchId(scenario, n), n, scenario, tasks, judged };
  }

  /**
   * Takes the scenario's next batch number for a batch formed already, whose own id the trainer
   * answered as another batch's (its ledger is ahead of this state).
   */
  claimNumber(scenario: string): number {
    const n = (this.state.lastN[scenario] ?? 0) + 1;
    this.state.lastN[scenario] = n;
    return n;
  }

  pendingCount(scenario: string): number {
    return this.state.pending[scenario]?.length ?? 0;
  }

  toJSON(): BatcherState {
    return structuredClone(this.state);
  }
}

/** Counts of +1, -1 and 0 rewards. */
export function rewardSplit(tasks: readonly TaskRef[]): { '1': number; '-1': number; '0': number } {
  const split = { '1': 0, '-1': 0, '0': 0 };
  for (const t of tasks) split[t.reward > 0 ? '1' : t.reward < 0 ? '-1' : '0']++;
  return split;
}

/** The `prm_record_file` line of a batch. */
export function recordLine(batch: Batch, correlation: Record<string, number>): Record<string, unknown> {
  return {
    batch: batch.n,
    batch_id: batch.batchId,
    scenario: batch.scenario,
    samples: batch.tasks.length,
    // Which turns the batch trained, so that a reader can check no turn is trained twice (the
    // kill -9 soak does); only turn ids, the store holds the rest.
    turns: batch.tasks.map((t) => t.turnRecordId),
    rewards: rewardSplit(batch.tasks),
    judged: batch.judged,
    correlation,
  };
}
