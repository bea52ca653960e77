import type { Problem } from '../harness/problems.js';
import { PLAIN_ANSWER_RULE, scoreSession, type PassRule } from '../harness/scoring.js';
import { ScriptedStudent } from '../harness/student.js';
import { distinctN, wilson } from './stats.js';

/**
 * Held-out evaluation through the gateway: first replies to problems no training session saw,
 * asked the way the student opens a session, sampled at the serving temperature (and greedily,
 * for exact match). The requests are side turns of their own scenario: recorded, never trained.
 */

export interface HeldoutReply {
  problem_id: string;
  gold: number;
  text: string;
  finish_reason: string | null;
  completion_tokens: number;
  habit: boolean;
  bold: boolean;
  list: boolean;
  header: boolean;
  answered: boolean;
  final_number: number | null;
  /** The final number is the gold answer. */
  correct: boolean;
}

export interface RateWithCi {
  k: number;
  n: number;
  rate: number;
  ci95: [number, number];
}

export interface EvalMetrics {
  n: number;
  habit: RateWithCi;
  bold_rate: number;
  list_rate: number;
  header_rate: number;
  answer: RateWithCi;
  /** Replies cut off by the token limit. */
  truncated_rate: number;
  mean_tokens: number;
  distinct_1: number;
  distinct_2: number;
}

export interface HeldoutEval {
  round: string;
  temperature: number;
  max_tokens: number;
  sampled: HeldoutReply[];
  metrics: EvalMetrics;
  /** Greedy (T = 0) replies to the same problems, or null when not asked. */
  greedy: HeldoutReply[] | null;
  greedy_accuracy: number | null;
  wall_s: number;
}

export interface EvalOptions {
  gateway: string;
  apiKey?: string | null;
  problems: readonly Problem[];
  systemPrompt: string;
  /** Also reply greedily to every problem, for exact match. */
  greedy: boolean;
  /**
   * Sampling seeds are `seedBase + i`: the same for the evaluation before and after training, so
   * the two differ by the weights only (common random numbers), and different per run seed.
   */
  seedBase: number;
  round: string;
  temperature: number;
  maxTokens: number;
  /** Requests in flight at once, so a batching engine decodes them together. */
  concurrency: number;
  rule?: PassRule;
  log?: (line: string) => void;
  signal?: AbortSignal;
}

/** The student's opening for held-out problem `i`: worded as sessions open, from indices no session uses. */
export function heldoutOpening(problem: Problem, i: number): Promise<string> {
  return new ScriptedStudent().begin(problem, 100_000 + i).opening();
}

export function scoreReply(problem: Problem, text: string, finish: string | null, tokens: number, rule: PassRule = PLAIN_ANSWER_RULE): HeldoutReply {
  const s = scoreSession(text, problem.answer, rule, finish);
  return {
    problem_id: problem.id,
    gold: problem.answer,
    text,
    finish_reason: finish,
    completion_tokens: tokens,
    habit: s.habit,
    bold: s.bold,
    list: s.list,
    header: s.header,
    answered: s.answered,
    final_number: s.finalNumber,
    correct: s.finalNumber !== null && Math.abs(s.finalNumber - problem.answer) < 1e-9,
  };
}

export function rateWithCi(k: number, n: number): RateWithCi {
  return { k, n, rate: n > 0 ? k / n : 0, ci95: wilson(k, n) };
}

export function evalMetrics(replies: readonly HeldoutReply[]): EvalMetrics {
  const n = replies.length;
  const count = (f: (r: HeldoutReply) => boolean) => replies.filter(f).length;
  const rate = (f: (r: HeldoutReply) => boolean) => (n > 0 ? count(f) / n : 0);
  return {
    n,
    habit: rateWithCi(count((r) => r.habit), n),
    bold_rate: rate((r) => r.bold),
    list_rate: rate((r) => r.list),
    header_rate: rate((r) => r.header),
    answer: rateWithCi(count((r) => r.answered), n),
    truncated_rate: rate((r) => r.finish_reason === 'length'),
    mean_tokens: n > 0 ? replies.reduce((a, r) => a + r.completion_tokens, 0) / n : 0,
    distinct_1: distinctN(replies.map((r) => r.text), 1),
    distinct_2: distinctN(replies.map((r) => r.text), 2),
  };
}

/** Runs `jobs` with at most `limit` in flight; results in job order. */
async function pool<T>(count: number, limit: number, job: (i: number) => Promise<T>): Promise<T[]> {
  const out = new Array<T>(count);
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      out[i] = await job(i);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(limit, count)) }, worker));
  return out;
}

async function ask(o: EvalOptions, problem: Problem, i: number, temperature: number, kind: string): Promise<HeldoutReply> {
  const res = await fetch(`${o.gateway}/v1/chat/completions`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      'x-reef-scenario': 'eval',
      'x-reef-tag-session': `eval-${o.round}-${kind}-${i}`,
      'x-reef-tag-turn-type': 'side',
      ...(o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}),
    },
    body: JSON.stringify({
      messages: [{ role: 'system', content: o.systemPrompt }, { role: 'user', content: await heldoutOpening(problem, i) }],
      temperature,
      seed: o.seedBase + i,
      max_tokens: o.maxTokens,
    }),
    ...(o.signal ? { signal: o.signal } : {}),
  });
  if (res.status !== 200) throw new Error(`eval request answered ${res.status}: ${await res.text()}`);
  const body = (await res.json()) as { choices: Array<{ message: { content: string | null }; finish_reason: string | null }>; usage?: { completion_tokens?: number } };
  const choice = body.choices[0]!;
  return scoreReply(problem, choice.message.content ?? '', choice.finish_reason, body.usage?.completion_tokens ?? 0, o.rule);
}

export async function evaluateHeldout(o: EvalOptions): Promise<HeldoutEval> {
  const t0 = performance.now();
  const total = o.problems.length * (o.greedy ? 2 : 1);
  let done = 0;
  let shown = 0;
  const progress = () => {
    done++;
    // A line at each quarter: long enough to see it move, short enough not to flood the console.
    if (o.log && done * 4 >= (shown + 1) * total) {
      shown = Math.floor((done * 4) / total);
      o.log(`  held-out ${o.round}: ${done}/${total} replies (${Math.round((performance.now() - t0) / 1000)} s)`);
    }
  };
  const run = (temperature: number, kind: string) => pool(o.problems.length, o.concurrency, async (i) => {
    o.signal?.throwIfAborted();
    const r = await ask(o, o.problems[i]!, i, temperature, kind);
    progress();
    return r;
  });
  const sampled = await run(o.temperature, 'sampled');
  const greedy = o.greedy ? await run(0, 'greedy') : null;
  return {
    round: o.round,
    temperature: o.temperature,
    max_tokens: o.maxTokens,
    sampled,
    metrics: evalMetrics(sampled),
    greedy,
    greedy_accuracy: greedy === null || greedy.length === 0 ? null : greedy.filter((r) => r.correct).length / greedy.length,
    wall_s: Math.round((performance.now() - t0) / 100) / 10,
  };
}

/**
 * Capability kept: of the problems the base model answered right greedily, the share the trained
 * model still answers right greedily ("exact match where the base model was right at T=0").
 */
export function exactMatchKept(before: readonly HeldoutReply[] | null, after: readonly HeldoutReply[] | null): { base_correct: number; still_correct: number; rate: number | null } | null {
  if (before === null || after === null) return null;
  const afterById = new Map(after.map((r) => [r.problem_id, r]));
  const right = before.filter((r) => r.correct);
  const kept = right.filter((r) => afterById.get(r.problem_id)?.correct === true).length;
  return { base_correct: right.length, still_correct: kept, rate: right.length > 0 ? kept / right.length : null };
}
