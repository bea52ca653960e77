/**
 * serve.yaml → ReefConfig: fold key spellings, apply overrides, validate the core sections and the
 * recipe's stage configs, collect every issue, resolve paths, then freeze.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import YAML from 'yaml';
import type { z } from 'zod';
import { engineArgIssues } from './engine-args.js';
import type { WeightSync } from './types.js';
import { ConfigError, type ConfigIssue } from './errors.js';
import { convertIssues, type KeyHomes, show } from './issues.js';
import { foldKeys, isPlainObject, type PathSegment, renderPath, valueAt } from './keys.js';
import { applyOverrides, type Overrides } from './overrides.js';
import { loadRecipe } from './recipe-loader.js';
import { DEFAULT_RECIPE, gatewayPortClash, layoutGpus, recipeSchema, rootSchema, SECTIONS } from './schema.js';
import { parseTrainingOptions } from './training.js';
import { STAGE_NAMES, type EngineLogprobs, type PathKind, type RecipeClass, type ReefConfig, type StageName } from './types.js';

export interface ResolveOptions {
  /** Directory relative paths are resolved against: the config file's directory. */
  baseDir: string;
  /** `--path.to.key=value` strings (see parseOverrides), or a map of dotted path → value. */
  overrides?: Overrides;
}

/** Reads, validates and freezes a config file. Throws ConfigError with every issue found. */
export async function loadConfig(path: string, overrides: Overrides = []): Promise<ReefConfig> {
  const file = resolve(path);
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    const reason = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message;
    throw new ConfigError('REEF_ERR_CONFIG_FILE', [{ path: file, message: reason }], { path: file, reason });
  }
  const doc = YAML.parseDocument(text, { prettyErrors: true });
  if (doc.errors.length > 0) {
    const issues = doc.errors.map((e) => ({ path: file, message: `invalid YAML: ${e.message.split('\n')[0]}` }));
    throw new ConfigError('REEF_ERR_CONFIG_FILE', issues, { path: file, reason: issues.map((i) => i.message).join('; ') });
  }
  return resolveConfig(doc.toJS(), { baseDir: dirname(file), overrides });
}

export async function resolveConfig(raw: unknown, opts: ResolveOptions): Promise<ReefConfig> {
  const issues: ConfigIssue[] = [];
  const input = raw ?? {};
  if (!isPlainObject(input)) throw new ConfigError('REEF_ERR_CONFIG_INVALID', [{ path: '', message: `expected a mapping at the top level, got ${show(input)}` }]);
  const tree = foldKeys(input, [], issues) as Record<string, unknown>;
  issues.push(...applyOverrides(tree, opts.overrides ?? []));

  const recipe = await recipeFor(tree, issues);
  const homes = keyHomes(recipe);
  const validate = <S extends z.ZodType>(schema: S, data: unknown, prefix: PathSegment[]): z.output<S> | null => {
    const r = schema.safeParse(data);
    if (r.success) return r.data;
    issues.push(...convertIssues(r.error.issues, { prefix, schema, data, homes }));
    return null;
  };

  validate(rootSchema, tree, []);
  const reef = validate(SECTIONS.reef, tree.reef, ['reef']);
  const cluster = validate(SECTIONS.cluster, tree.cluster, ['cluster']);
  const recipeSection = validate(SECTIONS.recipe, tree.recipe, ['recipe']);
  validate(SECTIONS.pipeline, tree.pipeline, ['pipeline']);
  const training = validate(SECTIONS.training, tree.training, ['training']);

  if (reef !== null && cluster !== null) {
    const clash = gatewayPortClash(reef, cluster);
    if (clash !== null) issues.push({ path: 'reef.port', message: clash });
  }
  if (cluster !== null) issues.push(...engineArgIssues(cluster));
  if (cluster !== null && training !== null) {
    const sync = weightSyncIssue(training.weight_sync, cluster.colocate);
    if (sync !== null) issues.push({ path: 'training.weight_sync', message: sync });
  }

  let recipeConfig: Record<string, unknown> | null = null;
  const stages: Partial<Record<StageName, Record<string, unknown>>> = {};
  let resolvedTraining: object | null = null;
  if (recipe !== null) {
    recipeConfig = validate(recipe.configSchema, valueAt(tree, ['recipe', 'config']) ?? {}, ['recipe', 'config']);
    for (const name of STAGE_NAMES) {
      const parsed = validate(recipe.stages[name].configSchema, valueAt(tree, ['pipeline', name, 'config']) ?? {}, ['pipeline', name, 'config']);
      if (parsed !== null) stages[name] = resolvePaths(parsed, recipe.stages[name].pathKeys ?? {}, opts.baseDir, ['pipeline', name, 'config'], issues);
    }
    if (training !== null) {
      // Named by the schema so the message can say why, but the trainer would refuse it at start,
      // minutes into `reef up`.
      if (training.backend === 'tp') issues.push({ path: 'training.backend', message: 'tp is not implemented; use fsdp2 (docs/training.md)' });
      if (training.engine_logprobs === 'sampled') issues.push({ path: 'training.engine_logprobs', message: SAMPLED_REMOVED });
      const r = parseTrainingOptions(training.options, recipe.trainingOptions);
      issues.push(...r.issues);
      resolvedTraining = r.resolved;
    }
  }

  // The gateway, the trainer-controller and the trainer all read the policy from its directory.
  const rolloutModel = cluster === null ? null : resolveModelDir(opts.baseDir, cluster.rollout.model_path, 'cluster.rollout.model_path', issues);

  if (issues.length > 0 || !reef || !cluster || !recipeSection || !training || !recipeConfig || !resolvedTraining) {
    throw new ConfigError('REEF_ERR_CONFIG_INVALID', issues);
  }
  const pipeline = Object.fromEntries(STAGE_NAMES.map((n) => [n, { config: stages[n]! }])) as ReefConfig['pipeline'];
  const base = opts.baseDir;
  const config = {
    reef: { ...reef, data_dir: resolveFile(base, reef.data_dir) },
    cluster: {
      ...cluster,
      num_gpus: cluster.ray_address === null ? (cluster.num_gpus ?? layoutGpus(cluster)) : null,
      rollout: { ...cluster.rollout, model_path: rolloutModel! },
      prm: { ...cluster.prm, model_path: cluster.prm.model_path === null ? null : resolveModel(base, cluster.prm.model_path) },
      student: cluster.student === null ? null : { ...cluster.student, model_path: resolveModel(base, cluster.student.model_path) },
    },
    recipe: { implementation: recipeSection.implementation, config: recipeConfig },
    pipeline,
    training: {
      ...training,
      weight_sync: weightSyncOf(training.weight_sync, cluster.rollout.engine, cluster.colocate),
      engine_logprobs: engineLogprobsOf(training.engine_logprobs),
      resolved: resolvedTraining as Record<string, unknown>,
    },
  };
  const typed: ReefConfig = deepFreeze(config);
  const crossIssues = recipe?.crossCheck?.(typed) ?? [];
  if (crossIssues.length > 0) throw new ConfigError('REEF_ERR_CONFIG_INVALID', [...crossIssues]);
  return typed;
}

/**
 * `auto`: colocated, `tensor` (the engine shares the trainer's GPU, where NCCL refuses a group);
 * else SGLang is built for the distributed update (a disk reload would write and read the whole
 * model per release); the hf engine reads the checkpoint every step writes anyway, in milliseconds
 * on the models it can serve, while a push costs the ranks a second gather of the full weights.
 */
export function weightSyncOf(value: 'auto' | WeightSync, engine: 'hf' | 'sglang', colocate = false): WeightSync {
  if (value !== 'auto') return value;
  if (colocate) return 'tensor';
  return engine === 'sglang' ? 'distributed' : 'disk';
}

/** Why a `training.weight_sync` cannot serve the layout, or null. */
export function weightSyncIssue(value: 'auto' | WeightSync, colocate: boolean): string | null {
  if (colocate && value === 'distributed') return 'distributed cannot run with cluster.colocate: NCCL refuses two ranks on one GPU; use tensor (the default there) or disk';
  if (!colocate && value === 'tensor') return 'tensor hands the weights over in the GPU\'s own memory, so it needs the engine on the trainer\'s GPU: set cluster.colocate, or use distributed or disk';
  return null;
}

/** Why `training.engine_logprobs: sampled` is refused, and what to write instead. */
export const SAMPLED_REMOVED = 'sampled was removed: both engines report tempered logprobs (log-softmax of logits / temperature, before top-k and top-p), the one distribution the trainer scores ℓold, the teacher and the policy in; use tempered, which auto resolves to (docs/training.md)';

/**
 * `auto`: both engines report SGLang's convention, the log-softmax of logits / temperature before
 * top-k and top-p (`raw` is for an SGLang started with SGLANG_RETURN_ORIGINAL_LOGPROB, which Reef
 * does not set). `sampled` never gets here: resolve refuses it (SAMPLED_REMOVED).
 */
export function engineLogprobsOf(value: 'auto' | 'sampled' | EngineLogprobs): EngineLogprobs {
  return value === 'raw' ? 'raw' : 'tempered';
}

/** The recipe named by the (folded, overridden) tree, or null with an issue when it cannot load. */
async function recipeFor(tree: Record<string, unknown>, issues: ConfigIssue[]): Promise<RecipeClass | null> {
  const impl = valueAt(tree, ['recipe', 'implementation']) ?? DEFAULT_RECIPE;
  // A malformed value is reported by the recipe section's own validation.
  if (!recipeSchema.safeParse({ implementation: impl }).success) return null;
  try {
    return await loadRecipe(impl as string);
  } catch (err) {
    issues.push({ path: 'recipe.implementation', message: (err as Error).message });
    return null;
  }
}

/** Every stage key → the one place it belongs, so a misplaced key can say where it goes. */
function keyHomes(recipe: RecipeClass | null): KeyHomes {
  const homes = new Map<string, string>();
  if (recipe === null) return homes;
  for (const name of STAGE_NAMES) {
    for (const key of Object.keys(recipe.stages[name].configSchema.shape)) {
      if (!homes.has(key)) homes.set(key, renderPath(['pipeline', name, 'config', key]));
    }
  }
  return homes;
}

function expandHome(p: string): string {
  return p === '~' || p.startsWith('~/') ? join(homedir(), p.slice(1)) : p;
}

export function resolveFile(base: string, p: string): string {
  return resolve(base, expandHome(p));
}

/**
 * A model path relative to the config file; `org/name` that is not a directory there is taken
 * as a hub id and left alone.
 */
export function resolveModel(base: string, p: string): string {
  const expanded = expandHome(p);
  if (isAbsolute(expanded)) return expanded;
  const local = resolve(base, expanded);
  if (expanded.startsWith('.') || existsSync(local) || !/^[\w-][\w.-]*\/[\w.-]+$/.test(expanded)) return local;
  return expanded;
}

/**
 * A model directory Reef reads itself (tokenizer.json, config.json): resolved as a model path, but
 * an `org/name` that is no directory here cannot be used as a hub id, since nothing in Reef
 * downloads one. Reported with `path` rather than passed on to fail after the engines loaded.
 */
function resolveModelDir(base: string, p: string, path: string, issues: ConfigIssue[]): string {
  const out = resolveModel(base, p);
  if (!isAbsolute(out)) {
    issues.push({ path, message: `${JSON.stringify(p)} is no directory next to the config file, and Reef reads this model from a directory (a Hugging Face hub id will not do here): download it and give its path` });
  }
  return out;
}

function resolvePaths(cfg: Record<string, unknown>, kinds: Readonly<Record<string, PathKind>>, base: string, prefix: PathSegment[], issues: ConfigIssue[]): Record<string, unknown> {
  const out = { ...cfg };
  for (const [key, kind] of Object.entries(kinds)) {
    const v = out[key];
    if (typeof v !== 'string' || v === '') continue;
    if (kind === 'file') out[key] = resolveFile(base, v);
    else if (kind === 'model') out[key] = resolveModel(base, v);
    else out[key] = resolveModelDir(base, v, renderPath([...prefix, key]), issues);
  }
  return out;
}

export function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}
