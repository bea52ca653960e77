/**
 * The resolved, frozen shape of `serve.yaml`. Keys are snake_case as written in YAML, except
 * `training.resolved`, which is computed. The full reference with every default is docs/config.md.
 */
import type { z } from 'zod';

export type EngineKind = 'hf' | 'sglang';
/** How an engine reports a sampled token's logprob (`training.engine_logprobs`). */
export type EngineLogprobs = 'tempered' | 'raw';
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export type StageName = 'record2record' | 'record2task' | 'task2batch';
export const STAGE_NAMES: readonly StageName[] = ['record2record', 'record2task', 'task2batch'];

export interface ApiKeyConfig {
  /** The key itself; exactly one of `key` and `key_env` is set. */
  readonly key: string | null;
  /** Name of an environment variable holding the key (read by the gateway at start). */
  readonly key_env: string | null;
  /** Scenarios this key may use; null = all. */
  readonly scenarios: readonly string[] | null;
  /** @default 64 */
  readonly max_concurrency: number;
  /** Requests per minute, every route but /healthz; null = unlimited. @default null */
  readonly requests_per_minute: number | null;
  /** Prompt tokens plus completion budget per minute of chat completions; null = unlimited. @default null */
  readonly tokens_per_minute: number | null;
}

/** How the HTTP listener bounds slow clients, connections, bodies, disk and failed authentications (docs/config.md). */
export interface LimitsSection {
  /** Time to receive a whole request, headers and body; its response is not timed. @default 120 */
  readonly request_timeout_s: number;
  /** @default 30 */
  readonly headers_timeout_s: number;
  /** Longest pause between two pieces of a body. @default 30 */
  readonly body_idle_timeout_s: number;
  /** @default 75 */
  readonly keep_alive_timeout_s: number;
  readonly engine_timeout_s: number;
  /** @default 1024 */
  readonly max_connections: number;
  /** @default 67108864 (64 MiB) */
  readonly body_bytes: number;
  /** @default 4194304 (4 MiB) */
  readonly reef_body_bytes: number;
  /** /reef/* requests in flight per key. @default 8 */
  readonly reef_concurrency: number;
  /** @default 8388608 (8 MiB) */
  readonly page_bytes: number;
  /** @default 1000 */
  readonly max_scenarios: number;
  /** 0 = never checked. @default 256 */
  readonly min_free_disk_mb: number;
  /** Longest a gateway write waits (off its event loop) for the record store's write lock. @default 5000 */
  readonly store_lock_wait_ms: number;
  /** @default 256 */
  readonly keyless_max_concurrency: number;
  /** @default null */
  readonly keyless_requests_per_minute: number | null;
  /** @default null */
  readonly keyless_tokens_per_minute: number | null;
  /** Failed authentications per client address (IPv6: per /64) before its requests get 429; null = no bound. @default 30 */
  readonly auth_failures_per_minute: number | null;
  /** Client addresses whose failures are tracked at once. @default 10000 */
  readonly auth_failure_addresses: number;
}

/** Redaction before the judge (actors/prm/redact.ts). */
export interface RedactionConfig {
  /** Built-in rules: `email`, `phone`, `card`, `api_key`. @default all four */
  readonly builtin: readonly ('email' | 'phone' | 'card' | 'api_key')[];
  /** Patterns of one's own, each masked as `[NAME]`. @default [] */
  readonly patterns: readonly { readonly name: string; readonly regex: string }[];
  /** `openai`: prompts to an external OpenAI-API PRM (`prm_api: openai`); `all`: every PRM's. @default 'openai' */
  readonly apply_to: 'openai' | 'all';
}

export interface RetentionConfig {
  /** Records and reports finished longer ago are deleted; null keeps everything. @default null */
  readonly max_age_days: number | null;
  /**
   * MiB of the record store's pages in use past which the oldest records the judge and the
   * trainer-controller are done with are deleted (then the chunks they alone referenced); null: no
   * size bound. @default null
   */
  readonly max_size_mb: number | null;
  /** Seconds between runs (the first a minute after start, at most). @default 3600 */
  readonly interval_s: number;
}

export interface ReefSection {
  /** @default '127.0.0.1' */
  readonly host: string;
  /** @default 8600 */
  readonly port: number;
  /** @default [] (required when host is not loopback) */
  readonly api_keys: readonly ApiKeyConfig[];
  /** Names a browser may send in Host to a gateway without keys, besides localhost, loopback literals and `host`. @default [] */
  readonly allowed_hosts: readonly string[];
  /** Origins (`scheme://host[:port]`) a browser may call a gateway without keys from, besides the gateway's own. @default [] */
  readonly allowed_origins: readonly string[];
  /** Absolute; written relative to the config file. @default '.reef' */
  readonly data_dir: string;
  /**
   * What an acknowledged record survives: `power` (synchronous=FULL, an fsync per commit) or
   * `process` (synchronous=NORMAL: kill -9 of any process, not an OS crash or power loss).
   * @default 'power'
   */
  readonly durability: 'power' | 'process';
  /** Deletion of old records, judgments and reports, and of chunks no record references. */
  readonly retention: RetentionConfig;
  /** What is masked in the prompts sent to an external PRM; the records keep the original. */
  readonly redaction: RedactionConfig;
  /** @default 'default' */
  readonly default_scenario: string;
  /** New tokens for a request that sets neither max_tokens nor max_completion_tokens; null = the rest of the context. @default 1024 */
  readonly default_max_tokens: number | null;
  /** @default 'info' */
  readonly log_level: LogLevel;
  readonly limits: LimitsSection;
}

export interface EngineConfig {
  /** @default 1 */
  readonly gpus: number;
  /** @default 'sglang' */
  readonly engine: EngineKind;
  /** Absolute path (or, for the PRM and student engines, a hub id such as `Qwen/Qwen3-4B`). */
  readonly model_path: string;
  /** 0 = pick a free port. @default 0 */
  readonly port: number;
  /** @default [] */
  readonly extra_args: readonly string[];
}

export interface PrmEngineConfig extends Omit<EngineConfig, 'model_path'> {
  /** PRM engines started by Reef; 0 = an external PRM at the record2record stage's URL. @default 1 */
  readonly replicas: number;
  /** Required when replicas > 0. */
  readonly model_path: string | null;
}

export type WeightSync = 'disk' | 'distributed' | 'tensor';

export interface ClusterSection {
  /** null = start a local Ray head. @default null */
  readonly ray_address: string | null;
  /** Logical GPUs declared on a local head; null with a remote cluster. @default the layout's sum */
  readonly num_gpus: number | null;
  /** @default null */
  readonly num_cpus: number | null;
  /** @default {gpus: 4} */
  readonly trainer: { readonly gpus: number };
  readonly rollout: EngineConfig;
  readonly prm: PrmEngineConfig;
  /** @default null */
  readonly student: EngineConfig | null;
  /** PRM actor processes. @default 2 */
  readonly prm_actors: number;
  /** @default 1 */
  readonly cpus_per_bundle: number;
  /** @default 120 */
  readonly placement_timeout_s: number;
  /**
   * The trainer and the rollout engine share one GPU: the engine gives its memory back while the
   * trainer steps, and each release comes by `update_weights_from_tensor`. @default false
   */
  readonly colocate: boolean;
}

export type StageConfig = Readonly<Record<string, unknown>>;

export interface ReefConfig {
  readonly reef: ReefSection;
  readonly cluster: ClusterSection;
  readonly recipe: {
    /** `module.path:Export`. @default 'recipes.openclawrl.recipe:OpenClawRLRecipe' */
    readonly implementation: string;
    readonly config: StageConfig;
  };
  /** Keys and defaults are declared by the recipe's stage classes. */
  readonly pipeline: { readonly [S in StageName]: { readonly config: StageConfig } };
  readonly training: {
    /** @default 'fsdp2' */
    readonly backend: 'fsdp2' | 'tp';
    /** @default [] */
    readonly options: readonly string[];
    /**
     * Whether batches are trained. false runs everything before training (correlation, judging,
     * batching, the record file) and trains and releases nothing: the control arm of an
     * experiment, or a dry run that shows what would train. @default true
     */
    readonly enabled: boolean;
    /** Release checkpoints kept on disk. @default 5 */
    readonly keep_checkpoints: number;
    /**
     * How a release reaches the rollout engine: `distributed` (trainer rank 0 broadcasts into the
     * engine, the checkpoint from disk as fallback), `tensor` (colocated: rank 0 hands the weights
     * over in shared memory, `update_weights_from_tensor`) or `disk` (`update_weights_from_disk`).
     * Written as `auto` (the default) it resolves to `tensor` when colocated, else `distributed`
     * for an sglang engine, `disk` for hf.
     */
    readonly weight_sync: WeightSync;
    /**
     * How the rollout engine reports a sampled token's logprob, the one distribution the trainer
     * scores ℓθ, ℓold and the teacher in: `tempered` (log-softmax of logits / temperature, before
     * top-k and top-p: SGLang and the hf engine), `raw` (log-softmax of the logits: SGLang with
     * SGLANG_RETURN_ORIGINAL_LOGPROB). Written as `auto` (the default) it is `tempered`; the
     * removed `sampled` is refused, naming `tempered`.
     */
    readonly engine_logprobs: EngineLogprobs;
    /** `options` parsed by the recipe's training-options spec (camelCase). */
    readonly resolved: Readonly<Record<string, unknown>>;
  };
}

/**
 * How a stage's path value resolves: a plain file path; a model path an engine loads (which may be
 * a hub id); or a model directory Reef reads itself (a tokenizer), where a hub id is an error.
 */
export type PathKind = 'file' | 'model' | 'model-dir';

/** The static side of a stage class, as the loader sees it. */
export interface StageClass {
  /** Strict zod object: unknown keys are errors. */
  readonly configSchema: z.ZodObject;
  readonly defaults: StageConfig;
  /** Keys holding paths, resolved against the config file's directory. */
  readonly pathKeys?: Readonly<Record<string, PathKind>>;
}

/** One `--flag` of `training.options`. */
export interface TrainingOptionSpec {
  readonly flag: string;
  /** Name in the parsed values handed to `resolve`. */
  readonly key: string;
  readonly kind: 'number' | 'string';
  /** Validates the converted value; its error text is the expectation ("expected ..."). */
  readonly schema: z.ZodType;
  readonly default: number | string;
  readonly help: string;
}

export interface TrainingOptionsSpec {
  readonly options: readonly TrainingOptionSpec[];
  /** Builds `training.resolved` from every option's value (defaults filled in). */
  resolve(values: Readonly<Record<string, number | string>>): object;
}

/** The static side of a recipe class, as named by `recipe.implementation`. */
export interface RecipeClass {
  readonly stages: { readonly [S in StageName]: StageClass };
  /** Schema of `recipe.config` (strict). */
  readonly configSchema: z.ZodObject;
  readonly trainingOptions: TrainingOptionsSpec;
  /**
   * Problems between the recipe's stage keys and the core sections, which neither schema sees
   * alone (a stage key that only works with some `cluster` layout), on the resolved config.
   */
  readonly crossCheck?: (cfg: ReefConfig) => readonly { path: string; message: string }[];
}
