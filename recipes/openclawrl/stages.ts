/**
 * The OpenClaw-RL pipeline stages and their config schemas. The core loader validates
 * `pipeline.<stage>.config` with `configSchema` and knows no stage key itself.
 */
import { z } from 'zod';
import { nonEmptyString, nonNegativeNumber, oneOf, envName, positiveInt, positiveNumber, string, numberIn } from '../../cluster/config/kit.js';
import type { StepRewardOptions } from './steps.js';
import type { PathKind } from '../../cluster/config/types.js';

const always = { when: () => true };

/**
 * Why `url` cannot be the PRM's base URL, or null. Parsed as the PRM client's fetches will parse
 * it: a prefix check passed `http://127.0.0.1:230011` and `http://prm host:1`, and every PRM call
 * then failed as an invalid URL. The client appends its paths to the text, so a query or fragment
 * would swallow them. The message leaves out the value: the loader appends what it got.
 */
function prmUrlProblem(url: string): string | null {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return "expected an http(s) URL or ''";
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') return "expected an http(s) URL or ''";
  if (parsed.search !== '' || parsed.hash !== '' || url.includes('?') || url.includes('#')) {
    return "expected an http(s) URL or '' without a query or fragment (Reef appends the PRM's paths to it)";
  }
  return null;
}

/** Each PRM call's deadline is a Node timer: one past 2^31 - 1 ms fires at once, failing every call. */
const MAX_PRM_TIMEOUT_S = 2_147_483;

const record2recordSchema = z
  .strictObject({
    /** PRM engine base URL; '' = correlate-only (sessions bind, nothing is judged or trained). @default '' */
    prm_url: string().default(''),
    /** Tokenizer of the PRM model; required when prm_url is set and prm_api is sglang. @default '' */
    prm_tokenizer_path: string().default(''),
    /** `sglang`: native /generate with token ids; `openai`: /v1/chat/completions. @default 'sglang' */
    prm_api: oneOf(['sglang', 'openai']).default('sglang'),
    /** Model name sent to an OpenAI-compatible PRM. @default null */
    prm_model: nonEmptyString().nullable().default(null),
    /** Environment variable holding the OpenAI-compatible PRM's API key. @default null */
    prm_api_key_env: envName().nullable().default(null),
    /** Score votes (and hint votes) per turn. @default 3 */
    prm_m: positiveInt().default(3),
    /** @default 0.6 */
    prm_temperature: numberIn(0, 2, true).default(0.6),
    /** @default 8192 */
    prm_max_tokens: positiveInt().default(8192),
    /** @default 120 */
    prm_timeout_s: positiveNumber().max(MAX_PRM_TIMEOUT_S, { error: `expected at most ${MAX_PRM_TIMEOUT_S} (about 24.8 days, the longest timer Node keeps)` }).default(120),
    /** PRM requests in flight per PRM actor. @default 8 */
    prm_concurrency: positiveInt().default(8),
    /** Hints kept as teacher candidates per turn. @default 3 */
    prm_max_hint_candidates: positiveInt().default(3),
    /** A session with no new turn for this long is closed. @default 900 */
    session_ttl_s: positiveNumber().default(900),
    /** Open sessions over every scenario and key; beyond it the scenario and key holding the most close their oldest. @default 4096 */
    max_open_sessions: positiveInt().default(4096),
  })
  .check(
    z.superRefine((o: Record<string, unknown>, ctx) => {
      const url = typeof o.prm_url === 'string' ? o.prm_url : '';
      if (url === '') return;
      const problem = prmUrlProblem(url);
      if (problem !== null) ctx.addIssue({ code: 'custom', path: ['prm_url'], message: problem });
      if (o.prm_api === 'sglang' && o.prm_tokenizer_path === '') {
        ctx.addIssue({ code: 'custom', path: ['prm_tokenizer_path'], message: 'required when prm_url is set and prm_api is sglang' });
      }
      if (o.prm_api === 'openai') {
        if (o.prm_model == null) ctx.addIssue({ code: 'custom', path: ['prm_model'], message: 'required when prm_api is openai' });
        if (o.prm_api_key_env == null) ctx.addIssue({ code: 'custom', path: ['prm_api_key_env'], message: 'required when prm_api is openai' });
      }
    }, always),
  );

export type Record2RecordConfig = z.output<typeof record2recordSchema>;

/** Correlates records into sessions and turns, and has finished turns judged by the PRM. */
export class Record2RecordStage {
  static readonly configSchema = record2recordSchema;
  static readonly defaults: Readonly<Record2RecordConfig> = Object.freeze(record2recordSchema.parse({}));
  /** The PRM actors load the tokenizer from its directory (actors/prm/prm-client.ts). */
  static readonly pathKeys: Readonly<Record<string, PathKind>> = { prm_tokenizer_path: 'model-dir' };

  constructor(readonly config: Readonly<Record2RecordConfig>) {}
}

const record2taskSchema = z.strictObject({});
export type Record2TaskConfig = z.output<typeof record2taskSchema>;

/** Turns judged turns into training tasks. Takes no config. */
export class Record2TaskStage {
  static readonly configSchema = record2taskSchema;
  static readonly defaults: Readonly<Record2TaskConfig> = Object.freeze({});

  constructor(readonly config: Readonly<Record2TaskConfig>) {}
}

const task2batchSchema = z.strictObject({
  /** Tasks per training batch. @default 16 */
  batch_size: positiveInt().default(16),
  /** JSONL file receiving one line per batch; null = off. @default null */
  prm_record_file: nonEmptyString().nullable().default(null),
  /** Drop tasks generated more than this many releases ago. @default 2 */
  max_staleness: z.int({ error: 'expected an integer >= 0' }).min(0, { error: 'expected an integer >= 0' }).default(2),
  // Agent steps (records tagged `x-reef-tag-group`; docs/training.md "Agent episodes"). The
  // defaults are the reference's: outcome plus 1.0 × the step's PRM score, undiscounted, in groups
  // of 8 rollouts per task.
  /** Outcome reports (episodes) that complete a group of parallel rollouts. @default 8 */
  group_size: positiveInt().default(8),
  /** A group incomplete this long after its first step is batched as it is; its steps without an outcome train on c_prm · p_t alone. @default 600 */
  group_timeout_s: positiveNumber().default(600),
  /** c_out: weight of the episode's reported outcome in a step's reward. @default 1 */
  outcome_coef: nonNegativeNumber().default(1),
  /** c_prm: weight of the step's process reward (the PRM's majority vote). @default 1 */
  prm_coef: nonNegativeNumber().default(1),
  /** γ: the outcome's discount per step from the episode's end. @default 1 */
  outcome_discount: numberIn(0, 1, true).default(1),
});
export type Task2BatchConfig = z.output<typeof task2batchSchema>;

/** The step-reward options of a `pipeline.task2batch.config`. */
export function stepRewardOptions(c: Pick<Task2BatchConfig, 'group_size' | 'group_timeout_s' | 'outcome_coef' | 'prm_coef' | 'outcome_discount'>): StepRewardOptions {
  return { groupSize: c.group_size, groupTimeoutMs: c.group_timeout_s * 1000, outcomeCoef: c.outcome_coef, prmCoef: c.prm_coef, discount: c.outcome_discount };
}

/** Groups tasks into batches with monotonic ids `{scenario}:openclawrl:{n}`. */
export class Task2BatchStage {
  static readonly configSchema = task2batchSchema;
  static readonly defaults: Readonly<Task2BatchConfig> = Object.freeze(task2batchSchema.parse({}));
  static readonly pathKeys: Readonly<Record<string, PathKind>> = { prm_record_file: 'file' };

  constructor(readonly config: Readonly<Task2BatchConfig>) {}
}
