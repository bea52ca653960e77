/**
 * The core sections of serve.yaml. Stage configs (`pipeline.*.config`) and `recipe.config` are
 * left open here: the recipe named by `recipe.implementation` declares their keys.
 */
import { isIPv4, isIPv6 } from 'node:net';
import { z } from 'zod';
import { SCENARIO_RE, SCENARIO_RULE } from '../../actors/runtime/scenario-name.js';
import { isPlainObject } from './keys.js';
import { boolean, envName, nonEmptyString, nonNegativeInt, nonNegativeNumber, oneOf, port, positiveInt, positiveNumber, section, stringList } from './kit.js';
import { BUILTIN_NAMES, type BuiltinName, patternProblem } from '../../actors/prm/redact.js';

/** Runs an object-level check even when some of its fields failed, so all errors are collected. */
const always = { when: () => true };
type Ctx = z.core.$RefinementCtx<Record<string, unknown>>;
/**
 * `always` also runs it on a value that is no mapping at all (`api_keys:` with a bare `-` is
 * `[null]`), which its type check already reports: reading fields of null threw a TypeError out of
 * the loader instead, and a string entry got a second, meaningless issue.
 */
const check = (fn: (o: Record<string, unknown>, ctx: Ctx) => void) =>
  z.superRefine((o: Record<string, unknown>, ctx: Ctx) => {
    if (isPlainObject(o)) fn(o, ctx);
  }, always);

/** 127.0.0.0/8, ::1 (also IPv4-mapped) and localhost. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  if (h === 'localhost') return true;
  if (isIPv4(h)) return h.startsWith('127.');
  if (isIPv6(h)) {
    if (h === '::1' || /^(0{1,4}:){7}0{0,3}1$/.test(h)) return true;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
    return mapped !== null && mapped[1]!.startsWith('127.');
  }
  return false;
}

const scenarioName = () => {
  const e = { error: `expected a scenario name (${SCENARIO_RULE})` };
  return z.string(e).regex(SCENARIO_RE, e);
};

/** What an API key may hold: the characters a client can send in a header (checked for key_env values too). */
export const PRINTABLE_ASCII = /^[\x20-\x7e]*$/;

/**
 * The shortest API key accepted (checked for key_env values too). Entropy cannot be read off a
 * string, so length stands in for it: 32 hex digits, the least dense alphabet key generators use,
 * are 128 bits, out of reach of guessing even at the rate the gateway lets failed attempts through.
 */
export const MIN_API_KEY_LENGTH = 32;

/** Why a key of `length` characters is refused, or null. Says neither the key nor any part of it. */
export function shortKeyProblem(length: number): string | null {
  if (length >= MIN_API_KEY_LENGTH) return null;
  return `must be at least ${MIN_API_KEY_LENGTH} characters, got ${length}: use a random one, e.g. \`openssl rand -hex 32\``;
}

const apiKey = z
  .strictObject(
    {
      // A client's key is trimmed when read (auth.ts extractKey), so a configured one with spaces
      // around it could never match.
      key: nonEmptyString()
        .refine((k) => k.trim() === k, { error: 'must not begin or end with whitespace' })
        // Node reads header bytes as Latin-1, so a key with other characters (é, emoji) never
        // matches what a client sends, or matches from one client library and not another.
        .refine((k) => PRINTABLE_ASCII.test(k), { error: 'must be printable ASCII (characters a client can send in a header)' })
        .check(
          z.superRefine((k: string, ctx) => {
            // An empty key is already reported as one.
            const problem = k === '' ? null : shortKeyProblem(k.length);
            if (problem !== null) ctx.addIssue({ code: 'custom', message: problem });
          }),
        )
        .nullable()
        .default(null),
      key_env: envName().nullable().default(null),
      scenarios: z.array(scenarioName(), { error: 'expected a list of scenario names' }).nullable().default(null),
      max_concurrency: positiveInt().default(64),
      // Off unless set: a limit that nobody configured must not start refusing an agent that ran
      // fine before (OpenAI's own limits are per account tier, so no default fits every deployment).
      requests_per_minute: positiveInt().nullable().default(null),
      tokens_per_minute: positiveInt().nullable().default(null),
    },
    { error: 'expected a mapping' },
  )
  .check(
    check((o, ctx) => {
      if ((o.key == null) === (o.key_env == null)) ctx.addIssue({ code: 'custom', path: [], message: 'set exactly one of key and key_env' });
    }),
  );

/** A name a client puts in Host: a DNS name or an IP literal, without scheme or port. */
const hostName = () => {
  const e = { error: 'expected a host name without scheme or port (reef.example.com, 10.0.0.5, [fd00::1])' };
  return z.string(e).refine((h) => /^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/i.test(h) || isIPv6(h.replace(/^\[(.*)\]$/, '$1')), e);
};

/**
 * An origin as a browser sends it in Origin, which is compared as written: scheme, lower-case host
 * and a port only where it is not the scheme's default (`http://localhost:3000`).
 */
const webOrigin = () => {
  const e = { error: 'expected an origin as a browser sends it (http://localhost:3000: scheme and host in lower case, a port unless the default, no path or trailing /)' };
  return z.string(e).refine((o) => {
    try {
      const u = new URL(o);
      return (u.protocol === 'http:' || u.protocol === 'https:') && u.origin === o;
    } catch {
      return false;
    }
  }, e);
};

/** How the HTTP listener bounds slow clients, connections, bodies, disk and failed authentications (security review H6, M2, M4, M7). */
const limits = section({
  request_timeout_s: positiveNumber().default(120),
  headers_timeout_s: positiveNumber().default(30),
  body_idle_timeout_s: positiveNumber().default(30),
  keep_alive_timeout_s: positiveNumber().default(75),
  engine_timeout_s: positiveNumber().default(300),
  max_connections: positiveInt().default(1024),
  body_bytes: positiveInt().default(64 * 1024 * 1024),
  reef_body_bytes: positiveInt().default(4 * 1024 * 1024),
  reef_concurrency: positiveInt().default(8),
  page_bytes: positiveInt().default(8 * 1024 * 1024),
  max_scenarios: positiveInt().default(1000),
  min_free_disk_mb: nonNegativeNumber().default(256),
  store_lock_wait_ms: nonNegativeInt().default(5000),
  keyless_max_concurrency: positiveInt().default(256),
  keyless_requests_per_minute: positiveInt().nullable().default(null),
  keyless_tokens_per_minute: positiveInt().nullable().default(null),
  // On by default, unlike the per-key limits: nobody sends wrong keys on purpose but a guesser, and a
  // client whose key is wrong fails every request anyway (security review M7).
  auth_failures_per_minute: positiveInt().nullable().default(30),
  auth_failure_addresses: positiveInt().default(10_000),
}).check(
  check((o, ctx) => {
    const headers = typeof o.headers_timeout_s === 'number' ? o.headers_timeout_s : 30;
    const request = typeof o.request_timeout_s === 'number' ? o.request_timeout_s : 120;
    // Node refuses a headers timeout longer than the request's, which includes the headers.
    if (headers > request) ctx.addIssue({ code: 'custom', path: ['headers_timeout_s'], message: `must not be more than reef.limits.request_timeout_s (${request}), which covers the headers too` });
  }),
);

/**
 * Redaction before the judge (actors/prm/redact.ts): built-in rules and patterns of one's own,
 * masked in the prompts a PRM actor sends to an external PRM.
 */
const redaction = section({
  builtin: z.array(oneOf(BUILTIN_NAMES as unknown as [BuiltinName, ...BuiltinName[]]), { error: 'expected a list' }).default([...BUILTIN_NAMES]),
  patterns: z.array(
    z.strictObject({
      // Upper-cased into the mask ([EMPLOYEE_ID]): letters, digits and _ keep the mask one word.
      name: z.string({ error: 'expected a string' }).regex(/^[A-Za-z][A-Za-z0-9_]{0,39}$/, { error: 'expected a name of letters, digits and _ (at most 40, a letter first)' }),
      regex: nonEmptyString().check(
        z.superRefine((r: string, ctx) => {
          const problem = r === '' ? null : patternProblem(r);
          if (problem !== null) ctx.addIssue({ code: 'custom', message: problem });
        }),
      ),
    }, { error: 'expected a mapping with name and regex' }),
    { error: 'expected a list' },
  ).default([]),
  apply_to: oneOf(['openai', 'all']).default('openai'),
});

export const reefSchema = section({
  host: nonEmptyString().default('127.0.0.1'),
  port: port().default(8600),
  api_keys: z.array(apiKey, { error: 'expected a list' }).default([]),
  allowed_hosts: z.array(hostName(), { error: 'expected a list of host names' }).default([]),
  allowed_origins: z.array(webOrigin(), { error: 'expected a list of origins' }).default([]),
  data_dir: nonEmptyString().default('.reef'),
  durability: oneOf(['power', 'process']).default('power'),
  retention: section({
    max_age_days: positiveNumber().nullable().default(null),
    max_size_mb: positiveNumber().nullable().default(null),
    interval_s: positiveInt().default(3600),
  }),
  redaction,
  default_scenario: scenarioName().default('default'),
  default_max_tokens: positiveInt().nullable().default(1024),
  log_level: oneOf(['debug', 'info', 'warn', 'error']).default('info'),
  limits,
}).check(
  check((o, ctx) => {
    const host = typeof o.host === 'string' ? o.host : '127.0.0.1';
    const keys = Array.isArray(o.api_keys) ? o.api_keys : [];
    if (!isLoopback(host) && keys.length === 0) {
      ctx.addIssue({ code: 'custom', path: ['api_keys'], message: `at least one key is required when reef.host (${host}) is not a loopback address` });
    }
  }),
);

const engineKind = oneOf(['hf', 'sglang']);

const engineShape = {
  gpus: positiveInt().default(1),
  engine: engineKind.default('sglang'),
  model_path: nonEmptyString(),
  port: port().default(0),
  extra_args: stringList().default([]),
};

const engine = section(engineShape);

const prm = section({ ...engineShape, replicas: nonNegativeInt().default(1), model_path: nonEmptyString().nullable().default(null) }).check(
  check((o, ctx) => {
    const replicas = typeof o.replicas === 'number' ? o.replicas : 1;
    if (replicas > 0 && o.model_path == null) ctx.addIssue({ code: 'custom', path: ['model_path'], message: 'required when cluster.prm.replicas > 0 (use replicas: 0 for an external PRM)' });
    if (replicas > 1 && typeof o.port === 'number' && o.port !== 0) ctx.addIssue({ code: 'custom', path: ['port'], message: 'must be 0 when replicas > 1 (each replica needs its own port)' });
  }),
);

/** GPUs the layout asks for; null when a part of it is not (yet) a valid count. */
export function layoutGpus(c: Record<string, unknown>): number | null {
  const n = (v: unknown): number | null => (typeof v === 'number' && Number.isInteger(v) ? v : null);
  const part = (v: unknown, key: string): unknown => (v !== null && typeof v === 'object' ? (v as Record<string, unknown>)[key] : undefined);
  const trainer = n(part(c.trainer, 'gpus'));
  const rollout = n(part(c.rollout, 'gpus'));
  const prmGpus = n(part(c.prm, 'gpus'));
  const replicas = n(part(c.prm, 'replicas'));
  const student = c.student == null ? 0 : n(part(c.student, 'gpus'));
  if (trainer === null || rollout === null || prmGpus === null || replicas === null || student === null) return null;
  // Colocated, the rollout engine runs on the trainer's GPU.
  return trainer + (c.colocate === true ? 0 : rollout) + prmGpus * replicas + student;
}

export const clusterSchema = section({
  ray_address: nonEmptyString().nullable().default(null),
  num_gpus: nonNegativeInt().nullable().default(null),
  num_cpus: positiveInt().nullable().default(null),
  trainer: section({ gpus: positiveInt().default(4) }),
  rollout: engine,
  prm,
  student: engine.nullable().default(null),
  prm_actors: nonNegativeInt().default(2),
  cpus_per_bundle: positiveNumber().default(1),
  placement_timeout_s: positiveNumber().default(120),
  colocate: boolean().default(false),
}).check(
  check((o, ctx) => {
    if (o.colocate !== true) return;
    // One GPU for both: NCCL refuses two ranks on one device, and a bigger trainer group would
    // need the engine's weights pushed into each of its GPUs' engines.
    for (const [path, v] of [[['trainer', 'gpus'], (o.trainer as { gpus?: unknown } | undefined)?.gpus], [['rollout', 'gpus'], (o.rollout as { gpus?: unknown } | undefined)?.gpus]] as const) {
      if (v !== undefined && v !== 1) ctx.addIssue({ code: 'custom', path: [...path], message: `must be 1 with cluster.colocate (the trainer and the rollout engine share one GPU), got ${String(v)}` });
    }
  }),
  check((o, ctx) => {
    if (o.ray_address != null) {
      // The shim declares neither when it joins a cluster: it would only log that it ignored them.
      for (const key of ['num_gpus', 'num_cpus'] as const) {
        if (o[key] != null) ctx.addIssue({ code: 'custom', path: [key], message: 'only applies to a local head; remove it or set cluster.ray_address to null' });
      }
      return;
    }
    const need = layoutGpus(o);
    if (o.ray_address == null && typeof o.num_gpus === 'number' && need !== null && o.num_gpus < need) {
      ctx.addIssue({ code: 'custom', path: ['num_gpus'], message: `the layout needs ${need} GPUs, got ${o.num_gpus}` });
    }
  }),
  check((o, ctx) => {
    const seen = new Map<number, string>();
    for (const [role, port] of enginePorts(o)) {
      const first = seen.get(port);
      if (first === undefined) seen.set(port, role);
      else ctx.addIssue({ code: 'custom', path: [role, 'port'], message: `${port} is also cluster.${first}.port; the engines listen on 127.0.0.1, each needs its own port` });
    }
  }),
);

/**
 * The fixed ports of the engines Reef starts (cluster/stack.ts puts every one on 127.0.0.1): port 0
 * picks a free one, and an external PRM (`replicas: 0`) or an absent student starts nothing.
 */
export function enginePorts(c: Record<string, unknown>): [role: 'rollout' | 'prm' | 'student', port: number][] {
  const out: [role: 'rollout' | 'prm' | 'student', port: number][] = [];
  const portOf = (v: unknown): number | null => (isPlainObject(v) && typeof v.port === 'number' && v.port > 0 ? v.port : null);
  const add = (role: 'rollout' | 'prm' | 'student', v: unknown) => {
    const port = portOf(v);
    if (port !== null) out.push([role, port]);
  };
  add('rollout', c.rollout);
  if (!isPlainObject(c.prm) || typeof c.prm.replicas !== 'number' || c.prm.replicas > 0) add('prm', c.prm);
  add('student', c.student);
  return out;
}

/** Hosts whose bind takes 127.0.0.1's port too (tried on Linux): `::1` and `127.0.0.2` do not. */
const BINDS_ENGINE_ADDRESS = new Set(['127.0.0.1', 'localhost', '0.0.0.0', '::', '::ffff:127.0.0.1']);

/**
 * `reef.port` taken by an engine too: the gateway's bind then fails with EADDRINUSE when it binds
 * the engines' address, 127.0.0.1 (`localhost` binds it as well), or a wildcard address.
 */
export function gatewayPortClash(reef: { host: string; port: number }, cluster: Record<string, unknown>): string | null {
  if (reef.port === 0) return null;
  if (!BINDS_ENGINE_ADDRESS.has(reef.host.replace(/^\[(.*)\]$/, '$1').toLowerCase())) return null;
  const clash = enginePorts(cluster).find(([, port]) => port === reef.port);
  return clash === undefined ? null : `${reef.port} is also cluster.${clash[0]}.port, where the ${clash[0]} engine listens on 127.0.0.1`;
}

export const DEFAULT_RECIPE = 'recipes.openclawrl.recipe:OpenClawRLRecipe';

export const recipeSchema = section({
  implementation: z
    .string({ error: 'expected module.path:ExportName' })
    .regex(/^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_$][\w$]*$/, { error: 'expected module.path:ExportName' })
    .default(DEFAULT_RECIPE),
  config: z.unknown().optional(),
});

const stageSection = section({ config: z.unknown().optional() });

export const pipelineSchema = section({ record2record: stageSection, record2task: stageSection, task2batch: stageSection });

export const trainingSchema = section({
  /** false: turns are judged and batched (and the record file written), but no batch is trained. */
  enabled: boolean().default(true),
  backend: oneOf(['fsdp2', 'tp']).default('fsdp2'),
  options: stringList().default([]),
  /** Release checkpoints kept on disk; older ones are deleted (their releases stay listed). */
  keep_checkpoints: positiveInt().default(5),
  /** How a release reaches the rollout engine; `auto` is resolved against `cluster.rollout.engine`. */
  weight_sync: oneOf(['auto', 'disk', 'distributed', 'tensor']).default('auto'),
  /**
   * How the rollout engine reports logprobs, the one distribution the trainer scores ℓθ, ℓold and
   * the teacher in; `auto` is `tempered` for both engines. `sampled` was removed and is refused
   * when the config resolves, naming `tempered` (resolve.ts).
   */
  engine_logprobs: oneOf(['auto', 'tempered', 'raw', 'sampled']).default('auto'),
});

/** Each top-level section, validated on its own so that one bad section hides nothing in another. */
export const SECTIONS = { reef: reefSchema, cluster: clusterSchema, recipe: recipeSchema, pipeline: pipelineSchema, training: trainingSchema } as const;

export const rootSchema = z.strictObject(
  { reef: z.unknown().optional(), cluster: z.unknown().optional(), recipe: z.unknown().optional(), pipeline: z.unknown().optional(), training: z.unknown().optional() },
  { error: 'expected a mapping' },
);
