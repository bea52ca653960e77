/**
 * Step-wise rewards of agent episodes (docs/training.md, "Agent episodes"). Pure: the batcher
 * (task2batch.ts) keeps the state, these functions compute.
 *
 * An agent step is one model call of an episode whose reply was judged against the tool output
 * that followed it. Its reward combines the episode's verified outcome, discounted by the steps
 * from the end, with the step's process reward:
 *
 *   r_t = c_out · outcome · γ^(T−1−t) + c_prm · p_t
 *
 * and its advantage is r_t standardised within the (group, step index) bucket of the parallel
 * rollouts of one task.
 */

/** The record tag (`x-reef-tag-group`) naming the parallel rollouts of one task. */
export const GROUP_TAG = 'group';

/** Added to a bucket's standard deviation, as the reference does, so that a tiny spread does not blow up. */
export const STD_EPS = 1e-6;

/** A bucket whose variance is at most this counts as all equal. */
const EQUAL_VAR = 1e-12;

export interface StepRewardOptions {
  /** c_out: weight of the episode's outcome. @default 1 */
  outcomeCoef: number;
  /** c_prm: weight of the step's process reward. @default 1 */
  prmCoef: number;
  /** γ: the outcome's discount per step from the episode's end. @default 1 */
  discount: number;
  /** Episodes (outcome reports) that complete a group. @default 8 */
  groupSize: number;
  /** A group incomplete this long after its first step is batched as it is. @default 600000 */
  groupTimeoutMs: number;
}

export const DEFAULT_STEP_OPTIONS: Readonly<StepRewardOptions> = Object.freeze({ outcomeCoef: 1, prmCoef: 1, discount: 1, groupSize: 8, groupTimeoutMs: 600_000 });

/** The outcome part of a step: the reported score and how many steps after this one the episode ran. */
export interface StepOutcome {
  score: number;
  stepsFromEnd: number;
}

/** r_t; a step without an outcome (its episode never reported one) trains on c_prm · p_t alone. */
export function combinedReward(process: number, outcome: StepOutcome | null, o: Pick<StepRewardOptions, 'outcomeCoef' | 'prmCoef' | 'discount'>): number {
  const fromOutcome = outcome === null ? 0 : o.outcomeCoef * outcome.score * o.discount ** outcome.stepsFromEnd;
  return fromOutcome + o.prmCoef * process;
}

export interface BucketInput {
  /** The step's place in its episode: 0 for the first model call. */
  index: number;
  reward: number;
}

export interface BucketStats {
  /** Buckets of more than one step. */
  buckets: number;
  /** Of those, buckets whose rewards were all equal: their steps are dropped (no signal to learn from). */
  allEqual: number;
  /** Steps dropped with them. */
  stepsDropped: number;
  /** Buckets of one step: its reward is kept as it is. */
  singletons: number;
}

/**
 * The advantage of each step, standardised within its step-index bucket of one group:
 * (r − mean) / (std + ε) with the population standard deviation, as the reference's step-wise
 * estimator does. A bucket of one step keeps its raw reward (there is nothing to compare it with);
 * a bucket whose rewards are all equal gives null for each of its steps (dropped, counted).
 */
export function normaliseGroup(steps: readonly BucketInput[]): { advantages: (number | null)[]; stats: BucketStats } {
  const byIndex = new Map<number, number[]>();
  steps.forEach((s, i) => {
    if (!Number.isFinite(s.reward)) throw new RangeError(`step ${i}: reward ${s.reward} is not a finite number`);
    const at = byIndex.get(s.index);
    if (at === undefined) byIndex.set(s.index, [i]);
    else at.push(i);
  });
  const advantages: (number | null)[] = steps.map(() => null);
  const stats: BucketStats = { buckets: 0, allEqual: 0, stepsDropped: 0, singletons: 0 };
  for (const members of byIndex.values()) {
    if (members.length === 1) {
      stats.singletons++;
      advantages[members[0]!] = steps[members[0]!]!.reward;
      continue;
    }
    stats.buckets++;
    const rs = members.map((i) => steps[i]!.reward);
    const mean = rs.reduce((a, b) => a + b, 0) / rs.length;
    const variance = rs.reduce((a, r) => a + (r - mean) ** 2, 0) / rs.length;
    if (variance <= EQUAL_VAR) {
      stats.allEqual++;
      stats.stepsDropped += members.length;
      continue;
    }
    const std = Math.sqrt(variance);
    for (const i of members) advantages[i] = (steps[i]!.reward - mean) / (std + STD_EPS);
  }
  return { advantages, stats };
}

/**
 * A step's index in its episode, read from the request the model answered: the assistant messages
 * before it. An agent loop resends the whole conversation on each call, so the t-th call of an
 * episode holds t assistant messages, whichever agent sent it.
 */
export function stepIndexOf(messages: readonly unknown[]): number {
  let n = 0;
  for (const m of messages) if ((m as { role?: unknown } | null)?.role === 'assistant') n++;
  return n;
}

/** The record's group tag, or null when it has none (a chat turn: trained as before). */
export function groupOf(tags: Readonly<Record<string, string>>): string | null {
  const g = tags[GROUP_TAG];
  return typeof g === 'string' && g.trim() !== '' ? g : null;
}
