import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { loadConfig } from '../../../cluster/config/index.js';
import { freePort } from '../../../cluster/net.js';
import { pythonBin, pythonEnv } from '../../../cluster/paths.js';
import { Stack } from '../../../cluster/stack.js';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import { STATE_KEY as TRAINER_STATE } from '../../../actors/trainer-controller/messages.js';
import { readReleases } from '../../../actors/trainer-controller/releases.js';
import { clearRunState, judgeConfig, runStatePaths, startRulePrm } from '../demo/experiment.js';
import { scriptFor, type ScriptedTask } from './script.js';

/**
 * One arm of the agents example: the whole stack on this machine (gateway, store, judge with PRM
 * actors against the rule PRM double, trainer-controller, one trainer rank, the hf engine serving
 * the model with the scripted policy), episodes run by Ray env workers in the sandbox
 * (python_shim/reef_shim/envs/run.py), `n` rollouts per task in one group per task per round.
 * Before the rounds and after them, greedy episodes (never scripted, never trained) measure the
 * model's own success. The control arm runs the same with `training.enabled: false`.
 */

export const SCENARIO = 'agents';
export const EVAL_SCENARIO = 'agents-eval';

export interface AgentArmOptions {
  /** Training off: batches are formed, counted and recorded, not trained. */
  control: boolean;
  tasks: readonly ScriptedTask[];
  /** Rollouts per task per round (one group); even, so a group holds as many good as bad first steps. @default 4 */
  n: number;
  /** Rounds of rollouts, each trained before the next. @default 2 */
  rounds: number;
  /** Greedy episodes per task before and after (0: none). @default 2 */
  evalEpisodes: number;
  /** Ray env workers. @default 8 */
  workers: number;
  lr: number;
  seed: number;
  maxTokens: number;
  modelDir: string;
  /** The arm's results, config and data dir. */
  out: string;
  groupTimeoutS: number;
  log: (line: string) => void;
  signal?: AbortSignal;
}

export interface StepFigure {
  index: number;
  receipt: string | null;
  tool_calls: Array<{ name: string | null; ok: boolean; observation: string }>;
  content: string | null;
  /** p_t, r_t and A_t as the batch's record line has them; null for a step not trained (the final answer, an all-equal bucket). */
  process: number | null;
  combined: number | null;
  advantage: number | null;
  /** The reply's summed logprob under the weights that served it (the engine's own, forced or not). */
  logprob: number | null;
}

export interface EpisodeFigure {
  round: number;
  task: string;
  session: string;
  group: string | null;
  variant: 'good' | 'bad' | 'other';
  success: boolean;
  /** The outcome it reported (+1 / −1), or null for an evaluation episode (not reported). */
  outcome: number | null;
  stopped: string;
  error: string | null;
  isolation: string | null;
  steps: StepFigure[];
}

export interface SuccessFigure {
  episodes: number;
  successes: number;
  rate: number | null;
  per_task: Record<string, { episodes: number; successes: number }>;
  /** Episodes whose first greedy reply held a parsed tool call. */
  tool_calls: number;
}

export interface ArmResult {
  arm: 'trained' | 'control';
  training_enabled: boolean;
  success: { before: SuccessFigure | null; after: SuccessFigure | null };
  /** Per round and task: mean summed logprob of the good and the bad scripted first reply, under the weights serving that round. */
  first_step_logprob: Array<{ round: number; task: string; good: number | null; bad: number | null }>;
  episodes: EpisodeFigure[];
  evaluation: { before: EpisodeFigure[]; after: EpisodeFigure[] };
  batches: Array<Record<string, unknown>>;
  releases: Array<{ id: string; weightVersion: string; batchIds: string[]; loss: number | null; train_rollout_logprob_abs_diff: number | null }>;
  counters: Record<string, number>;
  timings_s: Record<string, number>;
}

interface RawEpisode {
  env: string;
  task: string;
  session: string;
  group: string | null;
  success: boolean;
  score: number;
  stopped: string;
  error: string | null;
  info: Record<string, unknown>;
  steps: Array<{ index: number; receipt: string | null; content: string | null; tool_calls: Array<{ name: string | null; arguments: unknown; ok: boolean; observation: string }> }>;
}

/** Runs episodes with the Python runner (Ray env workers, sandboxed terminal tasks); its JSON. */
export async function runEpisodes(o: { gateway: string; tasks: readonly ScriptedTask[]; n: number; workers: number; runId: string; measure: boolean; scenario: string; maxTokens: number; outFile: string; log: (l: string) => void; signal?: AbortSignal }): Promise<RawEpisode[]> {
  const args = ['-m', 'reef_shim.envs.run', '--base-url', o.gateway, '--model', 'agents', '--tasks', o.tasks.map((t) => t.id).join(','),
    '--n', String(o.n), '--workers', String(o.workers), '--max-steps', '4', '--run-id', o.runId, '--header', `x-reef-scenario:${o.scenario}`,
    '--temperature', o.measure ? '0' : '1', '--max-tokens', String(o.maxTokens), '--out', o.outFile, ...(o.measure ? ['--measure'] : [])];
  await new Promise<void>((resolve, reject) => {
    const child = spawn(pythonBin(), args, { env: pythonEnv({ RAY_USAGE_STATS_ENABLED: '0' }), stdio: ['ignore', 'ignore', 'pipe'] });
    let tail = '';
    child.stderr.on('data', (d: Buffer) => {
      const text = d.toString();
      tail = (tail + text).slice(-4000);
      for (const line of text.split('\n')) if (line.startsWith('[envs]')) o.log(`  ${line}`);
    });
    const onAbort = () => child.kill('SIGTERM');
    o.signal?.addEventListener('abort', onAbort, { once: true });
    child.on('error', reject);
    child.on('exit', (code) => {
      o.signal?.removeEventListener('abort', onAbort);
      if (code === 0) resolve();
      else reject(new Error(`the env runner exited with ${code}: ${tail.slice(-1500)}`));
    });
  });
  return (JSON.parse(readFileSync(o.outFile, 'utf8')) as { episodes: RawEpisode[] }).episodes;
}

interface TrainerState {
  pending?: unknown[];
  counters?: Record<string, number>;
}

/**
 * Waits until every group of the rounds so far is batched (complete or timed out) and no formed
 * batch waits to be trained, with a line every 20 s; a stalled wait fails naming what it waits for.
 */
async function groupsBatched(store: SqliteStore, groups: number, o: { log: (l: string) => void; signal?: AbortSignal; timeoutMs: number }): Promise<Record<string, number>> {
  const t0 = Date.now();
  let said = 0;
  for (;;) {
    o.signal?.throwIfAborted();
    const s = (await store.getState(TRAINER_STATE)) as TrainerState | null;
    const c = s?.counters ?? {};
    const done = (c.groups_complete ?? 0) + (c.groups_timed_out ?? 0);
    if (done >= groups && (s?.pending?.length ?? 0) === 0) return c;
    if (Date.now() - t0 > o.timeoutMs) throw new Error(`after ${Math.round(o.timeoutMs / 1000)} s, ${done} of ${groups} groups batched and ${s?.pending?.length ?? 0} batch(es) waiting to be trained`);
    if (Date.now() - t0 > 20_000 * (said + 1)) {
      said++;
      o.log(`  waiting: ${done} of ${groups} groups batched, ${s?.pending?.length ?? 0} batch(es) to train …`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
}

export function successOf(episodes: readonly EpisodeFigure[]): SuccessFigure {
  const per: Record<string, { episodes: number; successes: number }> = {};
  for (const e of episodes) {
    const t = (per[e.task] ??= { episodes: 0, successes: 0 });
    t.episodes++;
    t.successes += e.success ? 1 : 0;
  }
  const k = episodes.filter((e) => e.success).length;
  return { episodes: episodes.length, successes: k, rate: episodes.length ? k / episodes.length : null, per_task: per, tool_calls: episodes.filter((e) => (e.steps[0]?.tool_calls.length ?? 0) > 0).length };
}

export function mean(xs: readonly number[]): number | null {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
}

export async function runAgentArm(o: AgentArmOptions): Promise<ArmResult> {
  if (o.n < 2 || o.n % 2 !== 0) throw new Error(`rollouts per task must be even and at least 2 (a group holds as many good as bad first steps), got ${o.n}`);
  mkdirSync(o.out, { recursive: true });
  clearRunState(o.out);
  const paths = runStatePaths(o.out);
  const timings: Record<string, number> = {};
  const lap = (name: string, since: number) => (timings[name] = Math.round((performance.now() - since) / 100) / 10);
  const scriptPath = join(o.out, 'script.json');
  writeFileSync(scriptPath, `${JSON.stringify(scriptFor(o.tasks), null, 1)}\n`);
  const batchSize = o.tasks.reduce((a, t) => a + t.trainedSteps(o.n), 0);
  const prm = await startRulePrm(o.modelDir, o.log, o.signal);
  let stack: Stack | null = null;
  let store: SqliteStore | null = null;
  try {
    const port = await freePort();
    const cfg = {
      reef: { host: '127.0.0.1', port, data_dir: paths.dataDir, default_scenario: SCENARIO },
      cluster: {
        num_gpus: 2,
        num_cpus: 8,
        trainer: { gpus: 1 },
        rollout: { gpus: 1, engine: 'hf', model_path: o.modelDir, extra_args: ['--seed', String(o.seed), '--scripted-outputs', scriptPath] },
        prm: { replicas: 0 },
        prm_actors: 1,
      },
      pipeline: {
        record2record: { config: judgeConfig({ kind: 'rule' }, prm.url, o.modelDir) },
        record2task: {},
        // One batch per round: exactly the steps a round's groups train (script.ts trainedSteps).
        task2batch: { config: { batch_size: batchSize, prm_record_file: paths.prmRecordFile, group_size: o.n, group_timeout_s: o.groupTimeoutS } },
      },
      training: { enabled: !o.control, options: ['--openclawrl-w-rl=1.0', '--openclawrl-w-opd=1.0', `--lr=${o.lr}`] },
    };
    const configPath = join(o.out, 'serve.yaml');
    writeFileSync(configPath, stringify(cfg));
    const config = await loadConfig(configPath);
    let t = performance.now();
    stack = await Stack.up({ config, configPath, overrides: [], log: (l) => o.log(`  [reef] ${l}`), ...(o.signal ? { signal: o.signal } : {}) });
    lap('stack_up', t);
    o.log(`  stack up in ${timings.stack_up} s (batch_size ${batchSize}, group_size ${o.n})`);
    store = SqliteStore.open(join(paths.dataDir, 'records.sqlite'));
    const gateway = `http://127.0.0.1:${port}`;
    const run = (runId: string, measure: boolean, n: number) =>
      runEpisodes({ gateway, tasks: o.tasks, n, workers: o.workers, runId, measure, scenario: measure ? EVAL_SCENARIO : SCENARIO, maxTokens: o.maxTokens, outFile: join(o.out, `${runId}.json`), log: o.log, ...(o.signal ? { signal: o.signal } : {}) });

    const raw: Array<[number, RawEpisode]> = [];
    let before: RawEpisode[] = [];
    if (o.evalEpisodes > 0) {
      t = performance.now();
      before = await run('eval-before', true, o.evalEpisodes);
      lap('eval_before', t);
    }
    for (let r = 1; r <= o.rounds; r++) {
      t = performance.now();
      o.log(`  round ${r}: ${o.n} rollouts of each of ${o.tasks.length} tasks`);
      for (const e of await run(`round${r}`, false, o.n)) raw.push([r, e]);
      await groupsBatched(store, r * o.tasks.length, { log: o.log, timeoutMs: (o.groupTimeoutS + 240) * 1000, ...(o.signal ? { signal: o.signal } : {}) });
      lap(`round_${r}`, t);
    }
    let after: RawEpisode[] = [];
    if (o.evalEpisodes > 0) {
      t = performance.now();
      after = await run('eval-after', true, o.evalEpisodes);
      lap('eval_after', t);
    }

    const lines = existsSync(paths.prmRecordFile) ? readFileSync(paths.prmRecordFile, 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, any>) : [];
    const trained = new Map<string, { process: number; combined: number; advantage: number }>();
    for (const l of lines) for (const s of (l.steps ?? []) as Array<{ turn: string; process: number; combined: number; advantage: number }>) trained.set(s.turn, s);
    const logprobOf = async (receipt: string | null, scenario: string): Promise<number | null> => {
      if (receipt === null) return null;
      const res = await fetch(`${gateway}/reef/scenarios/${scenario}/records/${receipt}`);
      if (res.status !== 200) return null;
      const rec = (await res.json()) as { logprobs?: number[] | null };
      return rec.logprobs ? rec.logprobs.reduce((a, b) => a + b, 0) : null;
    };
    const figure = async (round: number, e: RawEpisode, scenario: string, reported: boolean): Promise<EpisodeFigure> => {
      const id = `${e.env}:${e.task}`;
      const task = o.tasks.find((x) => x.id === id);
      const steps: StepFigure[] = [];
      for (const s of e.steps) {
        const tr = s.receipt === null ? undefined : trained.get(s.receipt);
        steps.push({ index: s.index, receipt: s.receipt, tool_calls: s.tool_calls.map((c) => ({ name: c.name, ok: c.ok, observation: c.observation })), content: s.content, process: tr?.process ?? null, combined: tr?.combined ?? null, advantage: tr?.advantage ?? null, logprob: await logprobOf(s.receipt, scenario) });
      }
      return { round, task: id, session: e.session, group: e.group, variant: task ? task.variant(e.steps[0]?.tool_calls ?? []) : 'other', success: e.success, outcome: reported ? e.score : null, stopped: e.stopped, error: e.error, isolation: (e.info.isolation as string | undefined) ?? null, steps };
    };
    const episodes: EpisodeFigure[] = [];
    for (const [r, e] of raw) episodes.push(await figure(r, e, SCENARIO, true));
    const evalBefore: EpisodeFigure[] = [];
    for (const e of before) evalBefore.push(await figure(0, e, EVAL_SCENARIO, false));
    const evalAfter: EpisodeFigure[] = [];
    for (const e of after) evalAfter.push(await figure(o.rounds + 1, e, EVAL_SCENARIO, false));
    const firstStep: ArmResult['first_step_logprob'] = [];
    for (let r = 1; r <= o.rounds; r++) {
      for (const task of o.tasks) {
        const of = (v: 'good' | 'bad') => mean(episodes.filter((e) => e.round === r && e.task === task.id && e.variant === v).map((e) => e.steps[0]?.logprob).filter((x): x is number => typeof x === 'number'));
        firstStep.push({ round: r, task: task.id, good: of('good'), bad: of('bad') });
      }
    }
    // Oldest first, by number (`release-<n>`), whatever order the store lists them in.
    const releases = (await readReleases(store)).filter((x) => x.rollbackOf === null).sort((a, b) => Number(a.id.split('-')[1]) - Number(b.id.split('-')[1]));
    const state = (await store.getState(TRAINER_STATE)) as TrainerState | null;
    return {
      arm: o.control ? 'control' : 'trained',
      training_enabled: !o.control,
      success: { before: o.evalEpisodes > 0 ? successOf(evalBefore) : null, after: o.evalEpisodes > 0 ? successOf(evalAfter) : null },
      first_step_logprob: firstStep,
      episodes,
      evaluation: { before: evalBefore, after: evalAfter },
      batches: lines,
      releases: releases.map((x) => ({ id: x.id, weightVersion: x.weightVersion, batchIds: x.batchIds, loss: x.metrics.loss ?? null, train_rollout_logprob_abs_diff: x.metrics.train_rollout_logprob_abs_diff ?? null })),
      counters: state?.counters ?? {},
      timings_s: timings,
    };
  } finally {
    await store?.close();
    await stack?.down();
    prm.child.kill('SIGTERM');
  }
}
