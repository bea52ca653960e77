import { combinedReward, DEFAULT_STEP_OPTIONS, normaliseGroup, type StepRewardOptions } from './steps.js';

/**
 * task2batch: every `batch_size` tasks of a scenario form one batch with the monotonic id
 * `{scenario}:openclawrl:{n}`. The batcher is pure and its state serialisable, so the
 * trainer-controller persists it with its offset in one transaction: each task lands in exactly
 * one batch, across crashes too.
 *
 * Agent steps (records tagged with a group, steps.ts) wait in their group instead, until the group
 * is complete (`group_size` episodes reported their outcome and every step those reports name has
 * been read) or timed out. Then each step's reward is combined with its episode's outcome and
 * standardised within its (group, step index) bucket, and the steps join the scenario's tasks with
 * that advantage as their reward: what the RL term weights the step's tokens by.
 */

/** What a batch keeps of a task: enough to rebuild it from the store. */
export interface TaskRef {
  turnRecordId: string;
  /** What the trainer weights the turn's tokens by: the judge's score, or an agent step's advantage. */
  reward: number;
  hints: string[];
  /** How an agent step's advantage came about; absent on a chat turn (and in states saved before agent steps). */
  step?: StepInfo;
}

/** An agent step's reward terms, kept with its task for the record line. */
export interface StepInfo {
  group: string;
  index: number;
  /** p_t: the PRM's majority vote on the step. */
  process: number;
  /** The outcome its episode reported, or null when none came before the group was batched. */
  outcome: number | null;
  stepsFromEnd: number | null;
  /** r_t, before the bucket's standardisation. */
  combined: number;
}

/** An agent step waiting in its group. */
interface WaitingStep {
  turnRecordId: string;
  hints: string[];
  index: number;
  process: number;
  outcome: number | null;
  stepsFromEnd: number | null;
  /** The report that gave the outcome. */
  episode: string | null;
}

interface GroupState {
  scenario: string;
  group: string;
  /** When its first step was read (ms since the epoch): the timeout counts from here. */
  firstAt: number;
  steps: WaitingStep[];
  /** Its turns read and not trained (dropped by the judge, stale, untrainable): they still count toward an episode. */
  skipped: string[];
}

/** An episode's outcome report, while its group waits. */
interface EpisodeState {
  scenario: string;
  /** The group key its steps were found in; null while none was. */
  group: string | null;
  /** Steps the report names that have not been read yet. */
  waiting: number;
  at: number;
}

/** Where reading a scenario's outcome reports goes on from (`RecordStore.listReports`). */
export interface ReportCursor {
  cursor: string | null;
  /** Reports of the last page read from `cursor` that were applied already (it is read again until it fills). */
  seen: string[];
}

/** The agent-step part of the state; absent in states saved before it existed. */
export interface AgentState {
  groups: Record<string, GroupState>;
  /** Turn record id → [report id, outcome, steps from the end]: named by a report, not read yet. */
  awaiting: Record<string, [string, number, number]>;
  episodes: Record<string, EpisodeState>;
  reports: Record<string, ReportCursor>;
}

/** An outcome report as the batcher reads it (the store's `Report`). */
export interface OutcomeReport {
  id: string;
  score: number;
  /** The episode's receipts, in the order they were made. */
  references: readonly string[];
  /** When it was filed (ms since the epoch), when known. */
  createdAt?: number;
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
  agent?: AgentState;
}

const groupKey = (scenario: string, group: string): string => JSON.stringify([scenario, group]);

export function batchId(scenario: string, n: number): string {
  return `${scenario}:openclawrl:${n}`;
}

export class Batcher {
  private state: BatcherState;
  readonly steps: Readonly<StepRewardOptions>;

  constructor(readonly batchSize: number, state: BatcherState | null = null, steps: Readonly<StepRewardOptions> = DEFAULT_STEP_OPTIONS) {
    if (!Number.isInteger(batchSize) || batchSize < 1) throw new Error(`batch_size must be a positive integer, got ${batchSize}`);
    if (!Number.isInteger(steps.groupSize) || steps.groupSize < 1) throw new Error(`group_size must be a positive integer, got ${steps.groupSize}`);
    this.steps = steps;
    this.state = state ? structuredClone(state) : { lastN: {}, pending: {}, judged: {} };
  }

  private get agent(): AgentState {
    return (this.state.agent ??= { groups: {}, awaiting: {}, episodes: {}, reports: {} });
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
    return this.take(scenario);
  }

  private take(scenario: string): Batch | null {
    const pending = this.state.pending[scenario] ?? [];
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
   * Reads one turn of an agent group: a step to train (`step`), or a turn read and not trained
   * (`step` null: dropped, stale, untrainable), which still counts toward its episode's report.
   */
  addStep(scenario: string, group: string, turnRecordId: string, step: { process: number; index: number; hints: string[] } | null, now: number): void {
    const a = this.agent;
    const key = groupKey(scenario, group);
    const g = (a.groups[key] ??= { scenario, group, firstAt: now, steps: [], skipped: [] });
    a.reports[scenario] ??= { cursor: null, seen: [] };
    const early = a.awaiting[turnRecordId];
    if (step === null) g.skipped.push(turnRecordId);
    else {
      g.steps.push({ turnRecordId, hints: step.hints, index: step.index, process: step.process, outcome: early?.[1] ?? null, stepsFromEnd: early?.[2] ?? null, episode: early?.[0] ?? null });
    }
    if (early !== undefined) {
      delete a.awaiting[turnRecordId];
      const ep = a.episodes[early[0]];
      if (ep !== undefined) {
        ep.waiting--;
        ep.group = key;
      }
    }
  }

  /**
   * Applies an episode's outcome report: each step it names gets the outcome and its distance from
   * the episode's end (its place in `references`). Steps not read yet wait for it, except the
   * last receipt, the episode's final answer, which no tool output follows and so is never judged.
   */
  report(scenario: string, r: OutcomeReport, now: number): void {
    if (!Number.isFinite(r.score)) throw new RangeError(`report ${r.id}: outcome ${r.score} is not a finite number`);
    const a = this.agent;
    if (a.episodes[r.id] !== undefined) return;
    const where = new Map<string, [string, WaitingStep | null]>();
    for (const [key, g] of Object.entries(a.groups)) {
      if (g.scenario !== scenario) continue;
      for (const s of g.steps) where.set(s.turnRecordId, [key, s]);
      for (const id of g.skipped) where.set(id, [key, null]);
    }
    const ep: EpisodeState = { scenario, group: null, waiting: 0, at: now };
    const last = r.references.length - 1;
    r.references.forEach((id, i) => {
      const found = where.get(id);
      if (found !== undefined) {
        ep.group = found[0];
        const s = found[1];
        if (s !== null) {
          s.outcome = r.score;
          s.stepsFromEnd = last - i;
          s.episode = r.id;
        }
      } else if (i < last) {
        a.awaiting[id] = [r.id, r.score, last - i];
        ep.waiting++;
      }
    });
    a.episodes[r.id] = ep;
  }

  /** Scenarios whose outcome reports are read (those with agent steps), each with its cursor. */
  reportCursors(): [scenario: string, cursor: ReportCursor][] {
    return Object.entries(this.state.agent?.reports ?? {}).map(([s, c]) => [s, structuredClone(c)]);
  }

  setReportCursor(scenario: string, cursor: ReportCursor): void {
    this.agent.reports[scenario] = structuredClone(cursor);
  }

  /**
   * Batches the groups that are complete or timed out at `now`, and forgets reports whose steps
   * never came within the timeout. Returns the batches their steps completed; `tally` (the
   * controller's counters) gets the same group and bucket counts as the batches' `judged`.
   */
  flushGroups(now: number, tally: Record<string, number> = {}): Batch[] {
    const a = this.state.agent;
    if (a === undefined) return [];
    const out: Batch[] = [];
    const complete = new Map<string, number>();
    for (const ep of Object.values(a.episodes)) if (ep.group !== null && ep.waiting <= 0) complete.set(ep.group, (complete.get(ep.group) ?? 0) + 1);
    for (const [key, g] of Object.entries(a.groups)) {
      const done = (complete.get(key) ?? 0) >= this.steps.groupSize;
      const late = now - g.firstAt >= this.steps.groupTimeoutMs;
      if (!done && !late) continue;
      delete a.groups[key];
      this.dropEpisodes((ep) => ep.group === key);
      const names = [done ? 'groups_complete' : 'groups_timed_out', ...this.batchGroup(g)];
      this.count(g.scenario, names);
      for (const n of names) tally[n] = (tally[n] ?? 0) + 1;
      for (let b = this.take(g.scenario); b !== null; b = this.take(g.scenario)) out.push(b);
    }
    // A report none of whose steps was read within the timeout names turns that are not agent
    // steps of a group, or that the judge never judged: kept, they would grow the state for good.
    this.dropEpisodes((ep) => ep.group === null && now - ep.at >= this.steps.groupTimeoutMs);
    return out;
  }

  private dropEpisodes(which: (ep: EpisodeState) => boolean): void {
    const a = this.agent;
    const gone = new Set<string>();
    for (const [id, ep] of Object.entries(a.episodes)) if (which(ep)) gone.add(id);
    if (gone.size === 0) return;
    for (const id of gone) delete a.episodes[id];
    for (const [turn, [rid]] of Object.entries(a.awaiting)) if (gone.has(rid)) delete a.awaiting[turn];
  }

  /** The group's steps with their advantages join the scenario's tasks; all-equal buckets are dropped. Returns the counter names. */
  private batchGroup(g: GroupState): string[] {
    const rewards = g.steps.map((s) => combinedReward(s.process, s.outcome === null ? null : { score: s.outcome, stepsFromEnd: s.stepsFromEnd ?? 0 }, this.steps));
    const { advantages, stats } = normaliseGroup(g.steps.map((s, i) => ({ index: s.index, reward: rewards[i]! })));
    const names: string[] = [];
    const times = (name: string, n: number) => {
      for (let i = 0; i < n; i++) names.push(name);
    };
    times('step_buckets', stats.buckets);
    times('step_buckets_all_equal', stats.allEqual);
    times('steps_all_equal_dropped', stats.stepsDropped);
    times('step_buckets_singleton', stats.singletons);
    times('steps_outcome_missing', g.steps.filter((s) => s.outcome === null).length);
    const pending = (this.state.pending[g.scenario] ??= []);
    g.steps.forEach((s, i) => {
      const advantage = advantages[i];
      if (advantage === null || advantage === undefined) return;
      pending.push({
        turnRecordId: s.turnRecordId,
        reward: advantage,
        hints: s.hints,
        step: { group: g.group, index: s.index, process: s.process, outcome: s.outcome, stepsFromEnd: s.stepsFromEnd, combined: rewards[i]! },
      });
    });
    return names;
  }

  /** Agent steps waiting in a group of `scenario`. */
  waitingSteps(scenario: string): number {
    let n = 0;
    for (const g of Object.values(this.state.agent?.groups ?? {})) if (g.scenario === scenario) n += g.steps.length;
    return n;
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
    // Agent steps only: each one's reward terms and the advantage it trained with.
    ...(batch.tasks.some((t) => t.step !== undefined)
      ? { steps: batch.tasks.filter((t) => t.step !== undefined).map((t) => ({ turn: t.turnRecordId, ...t.step, advantage: t.reward })) }
      : {}),
  };
}
