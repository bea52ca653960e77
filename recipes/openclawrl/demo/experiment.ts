import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { stringify } from 'yaml';
import { loadConfig } from '../../../cluster/config/index.js';
import { EngineClient } from '../../../cluster/engine-client.js';
import { freePort } from '../../../cluster/net.js';
import { pythonBin, pythonEnv, smolModelDir } from '../../../cluster/paths.js';
import { Stack } from '../../../cluster/stack.js';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import type { JudgedTurn } from '../../../actors/gateway/store/types.js';
import { CONSUMER as TRAINER, STATE_KEY as TRAINER_STATE } from '../../../actors/trainer-controller/messages.js';
import { readReleases } from '../../../actors/trainer-controller/releases.js';
import { CONSUMER as JUDGE, STATE_KEY as JUDGE_STATE } from '../../../actors/judge/handler.js';
import { generateProblems, type Problem } from '../harness/problems.js';
import { PLAIN_ANSWER_RULE } from '../harness/scoring.js';
import { curveTable, type RunSummary } from '../harness/report.js';
import { runSessions } from '../harness/run.js';
import { ScriptedStudent } from '../harness/student.js';
import { evaluateHeldout, exactMatchKept, heldoutOpening, type EvalMetrics, type HeldoutEval } from './evaluate.js';
import { twoProportionP } from './stats.js';

/**
 * One arm of the real-model experiment, on this machine, through the whole real pipeline: a
 * pretrained model no one here trained (SmolLM2-135M-Instruct) serves a scripted student's homework
 * sessions through the gateway; a rule-following PRM double (speaking the SGLang API; or a real
 * LLM judge over the OpenAI API) judges each turn from the student's next message and proposes a
 * hint; judged turns are batched and trained with the hybrid RL + OPD objective (or not at all, in
 * the control arm); each release goes live in the hf engine while the sessions continue. Before the
 * sessions and after them, fresh first replies to held-out problems measure the model's own habit
 * (bold, lists, headings), whether replies still end with an answer, exact match, length, distinct-n,
 * and the KL to the base on a fixed reference set.
 */

export type Arm = 'both' | 'rl' | 'opd' | 'control';

export type JudgeChoice =
  | { kind: 'rule' }
  /** A real LLM judge: any OpenAI-compatible endpoint (`prm_api: openai`). */
  | { kind: 'openai'; url: string; model: string; apiKeyEnv: string };

export interface ArmOptions {
  /** @default 1 */
  wRl: number;
  /** @default 1 */
  wOpd: number;
  /** Training off (`training.enabled: false`): same sessions, same judge. @default false */
  control: boolean;
  /** Seeds the engine's sampling, the agent's per-request seeds and the held-out sampling seeds. @default 1 */
  seed: number;
  /** @default 72 (48 with `--quick`) */
  sessions: number;
  /** @default 16 */
  batchSize: number;
  /** @default LR_DEFAULT */
  lr: number;
  /** Extra `training.options` flags, appended after the arm's own. @default [] */
  trainOptions: string[];
  /** Where this arm's results, config and data dir go. @default results/smollm2/<arm>-seed<seed>, `-quick` appended with `--quick` */
  out: string;
  /** @default .cache/smollm2-135m-instruct */
  modelDir: string;
  /** Held-out problems, one fresh sampled first reply each, before and after. @default 100 */
  evalSamples: number;
  /** Also reply greedily to each held-out problem (exact match). @default true (false with `--quick`) */
  greedy: boolean;
  /** Sessions in flight at once, so the batching engine decodes them together. @default 16 */
  concurrency: number;
  /** Held-out requests in flight at once. @default 32 */
  evalConcurrency: number;
  /** Completion token limit of every reply. @default 256 */
  maxTokens: number;
  /** Trainer ranks (logical GPUs on this machine). @default 1 */
  trainerRanks: number;
  judge: JudgeChoice;
  /** A held-out `before` evaluation of an earlier run with the same seed, model and settings, reused. @default null */
  beforeFrom: string | null;
  log: (line: string) => void;
  /** Aborting stops the run: the stack is taken down and the rule PRM stopped before runArm rejects. */
  signal?: AbortSignal;
}

/**
 * 3e-5: the recipe's 1e-5 is the reference's for a 4B model; 135M models are fine-tuned at a few
 * times that (published SmolLM2-135M fine-tunes use 1e-5 to 5e-5). Chosen before any run of this
 * experiment, and the same for every arm; the toy demo's 3e-4 was 30× the recipe's.
 */
export const LR_DEFAULT = 3e-5;
/** Training problems: the generator's default seed. Held-out ones come from another seed, minus any repeat. */
export const TRAIN_SEED = 20260310;
export const HELDOUT_SEED = 77_000_001;
export const SYSTEM_PROMPT = "You are a friendly homework helper. Solve the student's math problem and explain the solution.";
export const SCENARIO = 'homework';
/** Replies a session allows before the student gives up (its complaint on the last one still judges it). */
export const MAX_REPLIES = 3;
/** The closing HOMEWORK_DONE's request only gives the last reply its next state; its own reply is never read. */
const CLOSING_MAX_TOKENS = 8;
/** Reference replies for the KL to the base: the base model's greedy replies to the first held-out problems. */
const KL_REFERENCE = 16;

export function armOf(o: Pick<ArmOptions, 'wRl' | 'wOpd' | 'control'>): Arm {
  if (o.control) return 'control';
  if (o.wRl > 0 && o.wOpd > 0) return 'both';
  return o.wRl > 0 ? 'rl' : 'opd';
}

/** The stand-ins of a run, named wherever its results are printed. */
export function doublesOf(judge: JudgeChoice): { judge: string; student: string } {
  return {
    judge: judge.kind === 'rule'
      ? 'rule-following PRM double (python_shim/reef_shim/engines/rule_prm_server.py), not a model: fixed rules read the student\'s next message, never the reply, and pick a hint among fixed paraphrases'
      : `LLM judge ${judge.model} at ${judge.url} (prm_api: openai)`,
    student: 'scripted student (recipes/openclawrl/harness/student.ts), not a model: deterministic rules; it asks to drop bold, lists and headings, and for an answer at the end',
  };
}

/** Training and held-out problems; the held-out ones share no question with the training ones. */
export function experimentProblems(sessions: number, heldout: number): { train: Problem[]; heldout: Problem[] } {
  const train = generateProblems(Math.max(1, sessions));
  const seen = new Set(train.map((p) => p.question));
  const candidates = generateProblems(heldout * 2 + 24, HELDOUT_SEED).filter((p) => !seen.has(p.question));
  if (candidates.length < heldout) throw new Error(`only ${candidates.length} held-out problems differ from the training ones; ask for fewer`);
  return { train, heldout: candidates.slice(0, heldout).map((p, i) => ({ ...p, id: `heldout-${String(i + 1).padStart(3, '0')}` })) };
}

/** Where a run keeps its state. Every one of these is removed when a run starts. */
export function runStatePaths(out: string): { dataDir: string; prmRecordFile: string } {
  return { dataDir: join(out, 'data'), prmRecordFile: join(out, 'prm-records.jsonl') };
}

/** What a stack writes in its data dir (SQLite's -wal/-shm beside the store). */
const DATA_DIR_ENTRIES = new Set(['records.sqlite', 'records.sqlite-wal', 'records.sqlite-shm', 'run', 'checkpoints']);

/**
 * Each run measures learning from the base weights: a data dir left by an earlier run would bring
 * back its releases, its judged turns and its trainer state, and its record lines would stand in
 * for this run's (batch ids restart at 1 and the trainer-controller writes an id's line once).
 */
export function clearRunState(out: string): void {
  const p = runStatePaths(out);
  // --out names any directory: its data/ is only removed when it holds nothing but what a stack
  // writes there (`--out ~` removed ~/data whole).
  if (existsSync(p.dataDir)) {
    const foreign = readdirSync(p.dataDir).filter((n) => !DATA_DIR_ENTRIES.has(n)).sort();
    if (foreign.length > 0) throw new Error(`--out ${out}: ${p.dataDir} holds ${foreign.slice(0, 3).join(', ')}${foreign.length > 3 ? ', …' : ''}, not a data dir of an earlier run; choose another --out`);
    rmSync(p.dataDir, { recursive: true, force: true });
  }
  rmSync(p.prmRecordFile, { force: true });
}

/**
 * Why `dir` cannot serve as the model, or null when it can. Checked before anything starts: a
 * missing model surfaced as a Python traceback of the rule PRM and "exited with code 1".
 */
export function modelDirProblem(dir: string): string | null {
  const missing = ['config.json', 'tokenizer.json', 'model.safetensors'].filter((f) => !existsSync(join(dir, f)));
  if (missing.length === 0) return null;
  return `no model at ${dir} (missing ${missing.join(', ')}): \`npm run demo\` builds SmolLM2 (scripts/setup.sh), or pass --model DIR`;
}

/** Starts the rule-following PRM double and waits until it answers /health. */
export async function startRulePrm(modelDir: string, log: (l: string) => void, signal?: AbortSignal): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  const args = ['-m', 'reef_shim.engines.rule_prm_server', '--host', '127.0.0.1', '--port', String(port), '--tokenizer-path', modelDir];
  const child = spawn(pythonBin(), args, { env: pythonEnv(), stdio: ['ignore', 'ignore', 'inherit'] });
  const url = `http://127.0.0.1:${port}`;
  const client = new EngineClient(url, { name: 'rule-prm' });
  try {
    for (let i = 0; ; i++) {
      signal?.throwIfAborted();
      if (child.exitCode !== null) throw new Error(`the rule PRM exited with code ${child.exitCode}`);
      if (await client.health()) break;
      if (i > 600) throw new Error('the rule PRM did not become healthy in 60 s');
      if (i % 50 === 49) log(`waiting for the rule PRM on ${url} …`);
      await new Promise((r) => setTimeout(r, 100));
    }
  } catch (err) {
    // The caller only stops a PRM it got back: one that never became healthy must not outlive the run.
    child.kill('SIGTERM');
    throw err;
  } finally {
    await client.close();
  }
  return { url, child };
}

/** The judge's stage config for the chosen judge. */
export function judgeConfig(judge: JudgeChoice, prmUrl: string | null, modelDir: string): Record<string, unknown> {
  if (judge.kind === 'openai') {
    // A model judges: several votes per turn, as the recipe's defaults, and room to think.
    // The PRM client appends /v1/chat/completions; an OpenAI-style base URL ending in /v1 is taken too.
    return { prm_url: judge.url.replace(/\/+$/, '').replace(/\/v1$/, ''), prm_api: 'openai', prm_model: judge.model, prm_api_key_env: judge.apiKeyEnv, prm_m: 3, prm_max_tokens: 2048, prm_timeout_s: 120 };
  }
  // The rule double answers the same text to the same prompt: more than one vote would be the same vote.
  return { prm_url: prmUrl, prm_api: 'sglang', prm_tokenizer_path: modelDir, prm_m: 1, prm_max_tokens: 256, prm_timeout_s: 60 };
}

/** The arm's serve.yaml: the CPU layout with the model, the judge, and training on or off. */
export function armConfig(o: ArmOptions, prmUrl: string | null, port: number): Record<string, unknown> {
  return {
    // 32 held-out requests at once queue in one CPU engine that shares two cores with the trainer;
    // on a loaded machine a queued request waited past the default 300 s and the arm failed.
    reef: { host: '127.0.0.1', port, data_dir: runStatePaths(o.out).dataDir, default_scenario: SCENARIO, limits: { engine_timeout_s: 1800 } },
    cluster: {
      num_gpus: 1 + o.trainerRanks,
      num_cpus: 8,
      trainer: { gpus: o.trainerRanks },
      rollout: { gpus: 1, engine: 'hf', model_path: o.modelDir, extra_args: ['--seed', String(o.seed)] },
      prm: { replicas: 0 },
      prm_actors: 2,
    },
    pipeline: {
      record2record: { config: judgeConfig(o.judge, prmUrl, o.modelDir) },
      record2task: {},
      task2batch: { config: { batch_size: o.batchSize, prm_record_file: runStatePaths(o.out).prmRecordFile, max_staleness: 4 } },
    },
    training: {
      enabled: !o.control,
      options: [`--openclawrl-w-rl=${o.wRl}`, `--openclawrl-w-opd=${o.wOpd}`, `--lr=${o.lr}`, ...o.trainOptions],
    },
  };
}

/**
 * How far judging and training are behind the store: the judge is done when it has read every
 * record and every finished turn has its votes, the trainer-controller when it has read every
 * judged turn with no batch left to train (a partial batch waits for more turns, as it should).
 */
export async function pipelineProgress(store: SqliteStore): Promise<{ judgeDone: boolean; trainerDone: boolean; batchesWaiting: number }> {
  const [head, judgeNext, judge, judgedHead, trainerNext, trainer] = await Promise.all([
    store.headOffset(),
    store.getOffset(JUDGE),
    store.getState(JUDGE_STATE) as Promise<{ pending?: unknown[] } | null>,
    store.judgedHeadOffset(),
    store.getOffset(TRAINER),
    store.getState(TRAINER_STATE) as Promise<{ pending?: unknown[] } | null>,
  ]);
  // Offsets start at 1 and a consumer's is the next one it will read (0 before its first).
  const consumed = (next: number, last: number) => last === 0 || next > last;
  const batchesWaiting = trainer?.pending?.length ?? 0;
  return { judgeDone: consumed(judgeNext, head) && (judge?.pending?.length ?? 0) === 0, trainerDone: consumed(trainerNext, judgedHead) && batchesWaiting === 0, batchesWaiting };
}

/** Whether judging and training have caught up with everything in the store (pipelineProgress). */
export async function pipelineDrained(store: SqliteStore): Promise<boolean> {
  const p = await pipelineProgress(store);
  return p.judgeDone && p.trainerDone;
}

/**
 * A student takes minutes between sessions while training takes a minute a batch; on a CPU the
 * sessions would outrun training instead. So before each wave, wait (bounded) until the judge has
 * caught up with the records and the trainer-controller with the judged turns, with no batch in flight.
 */
export async function trainingCaughtUp(store: SqliteStore, log: (l: string) => void, signal?: AbortSignal, timeoutMs = 900_000): Promise<void> {
  const t0 = Date.now();
  let said = 0;
  for (;;) {
    signal?.throwIfAborted();
    const { judgeDone, trainerDone, batchesWaiting } = await pipelineProgress(store);
    if (judgeDone && trainerDone) return;
    if (Date.now() - t0 > timeoutMs) {
      // Going on in silence read as caught up: the sessions after it run on older weights.
      log(`  judging and training not caught up after ${Math.round(timeoutMs / 1000)} s (judge ${judgeDone ? 'done' : 'behind'}, trainer ${trainerDone ? 'done' : 'behind'}); going on`);
      return;
    }
    // Every 30 s a line, so a long training wait shows it is alive.
    if (Date.now() - t0 > 5_000 + said * 30_000) {
      log(`  waiting for judging and training to catch up (${judgeDone ? 'judge done' : 'judge behind'}, ${batchesWaiting} batch(es) to train) …`);
      said++;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Before a session starts: wait while more than `maxPending` formed batches wait to be trained.
 * Sessions and training then share the two cores instead of sessions running ahead on weights
 * many releases old (their turns would go stale) or training leaving the engine idle.
 */
export async function trainerKeepsUp(store: SqliteStore, maxPending: number, log: (l: string) => void, signal?: AbortSignal): Promise<void> {
  const t0 = Date.now();
  let said = 0;
  for (;;) {
    signal?.throwIfAborted();
    const state = (await store.getState(TRAINER_STATE)) as { pending?: unknown[] } | null;
    const pending = state?.pending?.length ?? 0;
    if (pending <= maxPending) return;
    if (Date.now() - t0 > 10_000 + said * 30_000) {
      log(`  ${pending} batches wait to be trained; the next session waits for the trainer …`);
      said++;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** A held-out evaluation's figures as summary.json holds them. */
function heldoutFigures(e: HeldoutEval): Record<string, unknown> {
  const m: EvalMetrics = e.metrics;
  return {
    habit_rate: m.habit.rate,
    habit_ci95: m.habit.ci95,
    answer_rate: m.answer.rate,
    answer_ci95: m.answer.ci95,
    bold_rate: m.bold_rate,
    list_rate: m.list_rate,
    header_rate: m.header_rate,
    truncated_rate: m.truncated_rate,
    mean_tokens: m.mean_tokens,
    distinct_1: m.distinct_1,
    distinct_2: m.distinct_2,
    greedy_accuracy: e.greedy_accuracy,
  };
}

export interface ArmSummary {
  model: string;
  model_dir: string;
  arm: Arm;
  seed: number;
  w_rl: number;
  w_opd: number;
  training_enabled: boolean;
  lr: number;
  batch_size: number;
  sessions: number;
  training_options: string[];
  doubles: { judge: string; student: string };
  heldout: {
    n: number;
    problems: string;
    temperature: number;
    max_tokens: number;
    before: Record<string, unknown>;
    after: Record<string, unknown>;
    /** Two-sided p of the pooled two-proportion test, habit rate before vs after. */
    habit_p_value: number;
    exact_match_kept: ReturnType<typeof exactMatchKept>;
    kl_to_base: { tokens: number; mean_kl: number; max_kl: number; reference: string } | null;
  };
  sessions_to_adaptation: number | null;
  pass_definition: string;
  session_results: Pick<RunSummary, 'passed' | 'habit' | 'bold' | 'list' | 'ended' | 'rolling'>;
  /**
   * `hints`: the judged turns of the sessions by reward and decision, and each hint the judge gave
   * with how many turns it conditioned the teacher of (the OPD term learns only what they say).
   */
  training: { batches: number; releases: number; counters: Record<string, number>; steps: Array<Record<string, number>>; hints?: HintCounts };
  wall_time_s: number;
  timings_s: Record<string, number>;
}

function modelName(dir: string): string {
  try {
    // SmolLM2's build names the model and where its weights came from (reef_shim/smollm2_model.py).
    const build = JSON.parse(readFileSync(join(dir, 'reef_build.json'), 'utf8')) as { model?: unknown; requirement?: unknown };
    if (typeof build.model === 'string') return typeof build.requirement === 'string' ? `${build.model} (the Q4_1 GGUF of ${build.requirement}, dequantised to fp32)` : build.model;
  } catch {
    // a model directory without Reef's build record: named by its folder
  }
  return dir.split('/').filter(Boolean).at(-1) ?? dir;
}

/** Reads a reusable `before` evaluation, refusing one of other settings. */
function reusableBefore(path: string, want: Record<string, unknown>): HeldoutEval {
  const saved = JSON.parse(readFileSync(path, 'utf8')) as { settings?: Record<string, unknown>; eval?: HeldoutEval };
  const differs = Object.keys(want).filter((k) => JSON.stringify(saved.settings?.[k]) !== JSON.stringify(want[k]));
  if (differs.length > 0 || !saved.eval) throw new Error(`--before-from ${path}: made with other settings (${differs.join(', ') || 'no evaluation'}); run without it`);
  return saved.eval;
}

function runKl(baseDir: string, policyDir: string, reference: string, out: string, signal?: AbortSignal): Promise<{ tokens: number; mean_kl: number; max_kl: number }> {
  return new Promise((resolveKl, reject) => {
    const child = spawn(pythonBin(), ['-m', 'reef_shim.eval_kl', '--base', baseDir, '--policy', policyDir, '--reference', reference, '--out', out], { env: pythonEnv(), stdio: ['ignore', 'ignore', 'inherit'] });
    const onAbort = () => child.kill('SIGTERM');
    signal?.addEventListener('abort', onAbort, { once: true });
    child.once('error', reject);
    child.once('exit', (code) => {
      signal?.removeEventListener('abort', onAbort);
      if (code !== 0) reject(new Error(`reef_shim.eval_kl exited with code ${code}`));
      else resolveKl(JSON.parse(readFileSync(out, 'utf8')) as { tokens: number; mean_kl: number; max_kl: number });
    });
  });
}

export interface HintCounts {
  /** Judged turns by `reward/decision`, e.g. `-1/hint`, `1/anchor`. */
  turns: Record<string, number>;
  /** Each hint text, most used first, with the number of turns whose teacher it conditioned. */
  hints: Array<{ hint: string; turns: number }>;
}

/** Every judged turn of `scenario`, in log order. */
export async function judgedTurns(store: SqliteStore, scenario: string): Promise<JudgedTurn[]> {
  const out: JudgedTurn[] = [];
  for (let offset = 0; ; ) {
    const page = await store.readJudgedTurns(offset, 1000);
    if (page.length === 0) return out;
    out.push(...page.filter((t) => t.scenario === scenario));
    offset = page.at(-1)!.offset + 1;
  }
}

export function hintCounts(turns: readonly Pick<JudgedTurn, 'reward' | 'decision' | 'teacherCandidates'>[]): HintCounts {
  const byKind: Record<string, number> = {};
  const byHint = new Map<string, number>();
  for (const t of turns) {
    const kind = `${t.reward}/${t.decision}`;
    byKind[kind] = (byKind[kind] ?? 0) + 1;
    for (const h of t.teacherCandidates) if (h !== null) byHint.set(h, (byHint.get(h) ?? 0) + 1);
  }
  const hints = [...byHint.entries()].map(([hint, n]) => ({ hint, turns: n })).sort((a, b) => b.turns - a.turns || (a.hint < b.hint ? -1 : 1));
  return { turns: byKind, hints };
}

export async function runArm(o: ArmOptions): Promise<ArmSummary> {
  mkdirSync(o.out, { recursive: true });
  clearRunState(o.out);
  const paths = runStatePaths(o.out);
  const signal = o.signal;
  const arm = armOf(o);
  const t0 = performance.now();
  const timings: Record<string, number> = {};
  const lap = (name: string, since: number) => (timings[name] = Math.round((performance.now() - since) / 100) / 10);
  const doubles = doublesOf(o.judge);
  const model = modelName(o.modelDir);
  o.log(`real-model experiment, arm ${arm} (w_rl=${o.wRl}, w_opd=${o.wOpd}${o.control ? ', training off' : `, lr ${o.lr}`}), seed ${o.seed}: ${o.sessions} sessions, batch ${o.batchSize}, model ${model}`);
  o.log(`judge: ${doubles.judge}`);
  o.log(`student: ${doubles.student}`);
  o.log(`output in ${o.out}; the stack comes up first, then the held-out evaluation, one line per session, and the evaluation again; Ctrl-C stops it and everything it started`);
  const problems = experimentProblems(o.sessions, o.evalSamples);
  const prm = o.judge.kind === 'rule' ? await startRulePrm(o.modelDir, o.log, signal) : null;
  let stack: Stack | null = null;
  const stores: SqliteStore[] = [];
  try {
    const port = await freePort();
    const configPath = join(o.out, 'serve.yaml');
    writeFileSync(configPath, stringify(armConfig(o, prm?.url ?? null, port)));
    const config = await loadConfig(configPath);
    let t = performance.now();
    stack = await Stack.up({ config, configPath, overrides: [], log: (l) => o.log(`  [reef] ${l}`), ...(signal ? { signal } : {}) });
    signal?.throwIfAborted();
    lap('stack_up', t);
    o.log(`stack up in ${timings.stack_up} s; the live page: http://127.0.0.1:${port}/reef/ui#${SCENARIO} (curves, judged turns, releases, while the arm runs)`);
    const store = SqliteStore.open(join(paths.dataDir, 'records.sqlite'));
    stores.push(store);
    const gateway = `http://127.0.0.1:${port}`;
    const evalSettings = { model, seed: o.seed, n: o.evalSamples, greedy: o.greedy, max_tokens: o.maxTokens, temperature: 0.7, system: SYSTEM_PROMPT };
    const evalOpts = { gateway, problems: problems.heldout, systemPrompt: SYSTEM_PROMPT, greedy: o.greedy, seedBase: o.seed * 1_000_003, temperature: 0.7, maxTokens: o.maxTokens, concurrency: o.evalConcurrency, rule: PLAIN_ANSWER_RULE, log: o.log, ...(signal ? { signal } : {}) };

    t = performance.now();
    let before: HeldoutEval;
    if (o.beforeFrom) {
      before = reusableBefore(o.beforeFrom, evalSettings);
      o.log(`held-out before: reused from ${o.beforeFrom}`);
    } else {
      before = await evaluateHeldout({ ...evalOpts, round: 'before' });
    }
    writeFileSync(join(o.out, 'heldout-before.json'), `${JSON.stringify({ settings: evalSettings, eval: before })}\n`);
    lap('heldout_before', t);
    const pct = (x: number) => `${(x * 100).toFixed(0)}%`;
    o.log(`base weights, ${before.metrics.n} held-out first replies: habit ${pct(before.metrics.habit.rate)} [${before.metrics.habit.ci95.map(pct).join(', ')}], answer ${pct(before.metrics.answer.rate)}${before.greedy_accuracy === null ? '' : `, greedy exact ${pct(before.greedy_accuracy)}`} (${timings.heldout_before} s)`);
    const reference = join(o.out, 'reference.jsonl');
    const refReplies = (before.greedy ?? before.sampled).slice(0, KL_REFERENCE);
    const openings = await Promise.all(refReplies.map((_r, i) => heldoutOpening(problems.heldout[i]!, i)));
    writeFileSync(reference, refReplies.map((r, i) => `${JSON.stringify({ messages: [{ role: 'system', content: SYSTEM_PROMPT }, { role: 'user', content: openings[i] }], response: r.text })}\n`).join(''));

    t = performance.now();
    const student = new ScriptedStudent({ dislikes: PLAIN_ANSWER_RULE.dislikes, requireSteps: false, requireAnswer: true, save: false, maxReplies: MAX_REPLIES });
    const sessions = await runSessions({
      gateway,
      scenario: SCENARIO,
      problems: problems.train,
      sessions: o.sessions,
      student,
      outputDir: o.out,
      prmRecordFile: paths.prmRecordFile,
      agent: { systemPrompt: SYSTEM_PROMPT, tools: false, maxTokens: o.maxTokens, temperature: 0.7, seed: o.seed },
      maxTurns: MAX_REPLIES + 1,
      passRule: PLAIN_ANSWER_RULE,
      concurrency: o.concurrency,
      closingMaxTokens: CLOSING_MAX_TOKENS,
      onProgress: (p) => o.log(p.line),
      beforeSession: () => trainerKeepsUp(store, 1, o.log, signal),
      ...(signal ? { signal } : {}),
    });
    // runSessions stops early on abort and returns a partial summary: not a result of this run.
    signal?.throwIfAborted();
    await trainingCaughtUp(store, o.log, signal);
    lap('sessions', t);

    t = performance.now();
    const after = await evaluateHeldout({ ...evalOpts, round: 'after' });
    writeFileSync(join(o.out, 'heldout-after.json'), `${JSON.stringify({ settings: evalSettings, eval: after })}\n`);
    lap('heldout_after', t);
    const hints = hintCounts(await judgedTurns(store, SCENARIO));
    const state = (await store.getState(TRAINER_STATE)) as { counters?: Record<string, number> } | null;
    const releases = await readReleases(store);
    o.log(`after ${releases.length} release(s), ${after.metrics.n} held-out first replies: habit ${pct(after.metrics.habit.rate)} [${after.metrics.habit.ci95.map(pct).join(', ')}], answer ${pct(after.metrics.answer.rate)}${after.greedy_accuracy === null ? '' : `, greedy exact ${pct(after.greedy_accuracy)}`} (${timings.heldout_after} s)`);

    t = performance.now();
    const policyDir = releases.at(-1)?.checkpointPath ?? o.modelDir;
    const kl = await runKl(o.modelDir, policyDir, reference, join(o.out, 'kl.json'), signal);
    lap('kl', t);
    const summary: ArmSummary = {
      model,
      model_dir: o.modelDir,
      arm,
      seed: o.seed,
      w_rl: o.wRl,
      w_opd: o.wOpd,
      training_enabled: !o.control,
      lr: o.lr,
      batch_size: o.batchSize,
      sessions: o.sessions,
      training_options: (config.training.options as readonly string[]).slice(),
      doubles,
      heldout: {
        n: o.evalSamples,
        problems: `generated with seed ${HELDOUT_SEED}, none of them among the ${problems.train.length} training problems (seed ${TRAIN_SEED})`,
        temperature: 0.7,
        max_tokens: o.maxTokens,
        before: heldoutFigures(before),
        after: heldoutFigures(after),
        habit_p_value: twoProportionP(before.metrics.habit.k, before.metrics.habit.n, after.metrics.habit.k, after.metrics.habit.n),
        exact_match_kept: exactMatchKept(before.greedy, after.greedy),
        kl_to_base: { tokens: kl.tokens, mean_kl: kl.mean_kl, max_kl: kl.max_kl, reference: `${refReplies.length} ${before.greedy ? 'greedy' : 'sampled'} base replies to the first held-out problems` },
      },
      sessions_to_adaptation: sessions.sessions_to_adaptation,
      pass_definition: 'the first reply has no bold, list or heading and ends with an answer (a number in its last two sentences, not cut off); the arithmetic need not be right',
      session_results: { passed: sessions.passed, habit: sessions.habit, bold: sessions.bold, list: sessions.list, ended: sessions.ended, rolling: sessions.rolling },
      training: {
        batches: (state?.counters?.batches ?? 0) + (state?.counters?.batches_untrained ?? 0),
        releases: releases.length,
        counters: state?.counters ?? {},
        steps: releases.filter((r) => r.rollbackOf === null).map((r) => r.metrics),
        hints,
      },
      wall_time_s: Math.round((performance.now() - t0) / 100) / 10,
      timings_s: timings,
    };
    writeFileSync(join(o.out, 'summary.json'), `${JSON.stringify(summary, null, 2)}\n`);
    o.log(describeArm(summary, o.out, sessions));
    return summary;
  } finally {
    for (const s of stores) await s.close();
    await stack?.down();
    prm?.child.kill('SIGTERM');
  }
}

/** The closing lines of a run: the held-out figures, the stand-ins, and where everything is. */
export function describeArm(s: ArmSummary, out: string, sessions: RunSummary | null = null): string {
  const pct = (x: unknown) => (typeof x === 'number' ? `${(x * 100).toFixed(0)}%` : '-');
  const ci = (x: unknown) => (Array.isArray(x) ? `[${x.map(pct).join(', ')}]` : '');
  const b = s.heldout.before;
  const a = s.heldout.after;
  const em = s.heldout.exact_match_kept;
  return [
    '',
    ...(sessions ? [curveTable(sessions), ''] : []),
    `arm ${s.arm}, seed ${s.seed}, model ${s.model}`,
    `judge: ${s.doubles.judge}`,
    `student: ${s.doubles.student}`,
    `held-out habit rate (bold, lists or headings; ${s.heldout.n} fresh first replies at T=${s.heldout.temperature}): ${pct(b.habit_rate)} ${ci(b.habit_ci95)} before → ${pct(a.habit_rate)} ${ci(a.habit_ci95)} after (p = ${s.heldout.habit_p_value.toFixed(3)})`,
    `answer rate (ends with an answer): ${pct(b.answer_rate)} → ${pct(a.answer_rate)}; mean length ${Number(b.mean_tokens).toFixed(0)} → ${Number(a.mean_tokens).toFixed(0)} tokens; distinct-2 ${Number(b.distinct_2).toFixed(2)} → ${Number(a.distinct_2).toFixed(2)}`,
    `exact match kept at T=0: ${em ? `${em.still_correct} of the ${em.base_correct} the base got right` : '-'}; greedy accuracy ${pct(b.greedy_accuracy)} → ${pct(a.greedy_accuracy)}; KL to the base ${s.heldout.kl_to_base ? `${s.heldout.kl_to_base.mean_kl.toFixed(4)} nats/token` : '-'}`,
    `sessions_to_adaptation (first of 3 passed sessions in a row): ${s.sessions_to_adaptation ?? `not reached in ${s.sessions}`}; pass: ${s.pass_definition}`,
    ...(s.training.hints ? [`judged turns (reward/decision): ${Object.entries(s.training.hints.turns).map(([k, v]) => `${k} ${v}`).join(', ')}; the teacher's hints, most used first: ${s.training.hints.hints.slice(0, 3).map((h) => `${h.turns} × "${h.hint}"`).join('; ') || 'none'}`] : []),
    `batches: ${s.training.batches} (${s.training.releases} released); wall time ${s.wall_time_s.toFixed(0)} s (${Object.entries(s.timings_s).map(([k, v]) => `${k} ${v.toFixed(0)} s`).join(', ')})`,
    `summary: ${join(out, 'summary.json')}; plots: ${join(out, 'results', 'rates.svg')}, ${join(out, 'results', 'rewards.svg')}; replies: ${join(out, 'heldout-before.json')}, ${join(out, 'heldout-after.json')}`,
    `records and checkpoints: ${runStatePaths(out).dataDir} (removed when this arm runs again); config: ${join(out, 'serve.yaml')}`,
    'next: the whole table, `npm run demo:ablation` (control, RL, OPD and both over 3 seeds); docs/experiment.md explains it',
  ].join('\n');
}

/**
 * The shorter arm a newcomer waits for (`npm run demo`): two thirds of the sessions and no greedy
 * held-out pass, about 20 minutes on two cores where the full arm takes 29-32. Its held-out habit
 * and answer rates are the same measurement on as many replies; it trains on fewer turns, so it is
 * a first look, not a row of the table (docs/experiment.md).
 */
export const QUICK_SESSIONS = 48;

/** Parses the arm's command line (`npm run demo -- ...`). */
export function armOptions(argv: readonly string[], log: (line: string) => void): ArmOptions {
  const o: ArmOptions = {
    wRl: 1, wOpd: 1, control: false, seed: 1, sessions: 72, batchSize: 16, lr: LR_DEFAULT, trainOptions: [],
    out: '', modelDir: smolModelDir(), evalSamples: 100, greedy: true, concurrency: 16, evalConcurrency: 32,
    maxTokens: 256, trainerRanks: 1, judge: { kind: 'rule' }, beforeFrom: null, log,
  };
  const judge: { url?: string; model?: string; keyEnv?: string } = {};
  let out: string | null = null;
  let quick = false;
  let sessionsGiven = false;
  for (let i = 0; i < argv.length; i++) {
    // Split at the first '=' only: split('=', 2) would drop the rest of a value such as a path with '='.
    const eq = argv[i]!.indexOf('=');
    const flag = eq < 0 ? argv[i]! : argv[i]!.slice(0, eq);
    if (flag === '--control' && eq < 0) {
      o.control = true;
      continue;
    }
    if (flag === '--no-greedy' && eq < 0) {
      o.greedy = false;
      continue;
    }
    if (flag === '--quick' && eq < 0) {
      quick = true;
      continue;
    }
    const inline = eq < 0 ? undefined : argv[i]!.slice(eq + 1);
    const value = inline ?? argv[++i];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    const num = () => {
      const n = Number(value);
      if (value.trim() === '' || !Number.isFinite(n) || n < 0) throw new Error(`${flag}: expected a non-negative number, got ${value}`);
      return n;
    };
    const int = (min: number) => {
      const n = num();
      if (!Number.isInteger(n) || n < min) throw new Error(`${flag}: expected an integer of at least ${min}, got ${value}`);
      return n;
    };
    switch (flag) {
      case '--w-rl': o.wRl = num(); break;
      case '--w-opd': o.wOpd = num(); break;
      case '--seed': o.seed = int(0); break;
      case '--sessions': o.sessions = int(1); sessionsGiven = true; break;
      case '--batch-size': o.batchSize = int(1); break;
      case '--lr':
        // training.options would refuse it only after the rule PRM and the config were made.
        o.lr = num();
        if (o.lr === 0) throw new Error(`${flag}: expected a positive number, got ${value}`);
        break;
      case '--train-option': o.trainOptions.push(value); break;
      case '--out': out = resolve(value); break;
      case '--model': o.modelDir = resolve(value); break;
      case '--eval-samples': o.evalSamples = int(1); break;
      case '--concurrency': o.concurrency = int(1); break;
      case '--eval-concurrency': o.evalConcurrency = int(1); break;
      case '--max-tokens': o.maxTokens = int(1); break;
      case '--trainer-ranks': o.trainerRanks = int(1); break;
      case '--before-from': o.beforeFrom = resolve(value); break;
      case '--judge-url': judge.url = value; break;
      case '--judge-model': judge.model = value; break;
      case '--judge-api-key-env': judge.keyEnv = value; break;
      default: throw new Error(`unknown option ${flag} (known: --seed --w-rl --w-opd --control --sessions --batch-size --lr --train-option --out --model --eval-samples --no-greedy --concurrency --eval-concurrency --max-tokens --trainer-ranks --before-from --judge-url --judge-model --judge-api-key-env --quick)`);
    }
  }
  if (!o.control && o.wRl === 0 && o.wOpd === 0) throw new Error('--w-rl 0 --w-opd 0 trains nothing but weight decay; for training off use --control');
  if (judge.url !== undefined || judge.model !== undefined || judge.keyEnv !== undefined) {
    if (!judge.url || !judge.model || !judge.keyEnv) throw new Error('a real judge needs all three of --judge-url, --judge-model and --judge-api-key-env');
    o.judge = { kind: 'openai', url: judge.url, model: judge.model, apiKeyEnv: judge.keyEnv };
  }
  if (quick) {
    if (!sessionsGiven) o.sessions = QUICK_SESSIONS;
    o.greedy = false;
  }
  o.out = out ?? resolve('results', 'smollm2', `${armOf(o)}-seed${o.seed}${quick ? '-quick' : ''}`);
  return o;
}
