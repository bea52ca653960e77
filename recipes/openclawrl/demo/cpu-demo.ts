import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { stringify } from 'yaml';
import { loadConfig } from '../../../cluster/config/index.js';
import { EngineClient } from '../../../cluster/engine-client.js';
import { freePort } from '../../../cluster/net.js';
import { pythonBin, pythonEnv, repoRoot } from '../../../cluster/paths.js';
import { Stack } from '../../../cluster/stack.js';
import { generateProblems, type Problem } from '../harness/problems.js';
import { AGENT_SYSTEM_PROMPT, SAVE_TOOL } from '../harness/agent.js';
import { scoreSession } from '../harness/scoring.js';
import { curveTable, type RunSummary } from '../harness/report.js';
import { runSessions } from '../harness/run.js';
import { ScriptedStudent } from '../harness/student.js';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import { CONSUMER as TRAINER, STATE_KEY as TRAINER_STATE } from '../../../actors/trainer-controller/messages.js';
import { CONSUMER as JUDGE, STATE_KEY as JUDGE_STATE } from '../../../actors/judge/handler.js';

/**
 * The closed-loop CPU demo: the whole real pipeline on this machine. The demo model starts with
 * a habit the student dislikes (bold text in about half its replies); a scripted student
 * complains about it; a rule-following PRM double (speaking the SGLang API) judges each turn and
 * proposes a hint; judged turns are batched and trained by 2 gloo ranks with the hybrid
 * RL + OPD objective; each release goes live in the hf engine while the sessions continue.
 */

export interface DemoOptions {
  /** @default 1 */
  wRl: number;
  /** @default 1 */
  wOpd: number;
  /** @default 100 */
  sessions: number;
  /** @default 16 */
  batchSize: number;
  /** @default 3e-4 */
  lr: number;
  /** Where results, plots, the config and the data dir go. @default results/cpu-demo */
  out: string;
  /** The pre-trained demo model. @default .cache/demo-model */
  modelDir: string;
  /** Fresh first replies sampled before and after the sessions to measure the habit. @default 40 */
  evalSamples: number;
  log: (line: string) => void;
  /** Aborting stops the run: the stack is taken down and the rule PRM stopped before runDemo rejects. */
  signal?: AbortSignal;
}

/** Where a run keeps its state. Every one of these is removed when a run starts. */
export function runStatePaths(out: string): { dataDir: string; prmRecordFile: string } {
  return { dataDir: join(out, 'data'), prmRecordFile: join(out, 'prm-records.jsonl') };
}

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

/** What a stack writes in its data dir (SQLite's -wal/-shm beside the store). */
const DATA_DIR_ENTRIES = new Set(['records.sqlite', 'records.sqlite-wal', 'records.sqlite-shm', 'run', 'checkpoints']);

export function demoOptions(argv: readonly string[], log: (line: string) => void): DemoOptions {
  const o: DemoOptions = { wRl: 1, wOpd: 1, sessions: 100, batchSize: 16, lr: 3e-4, out: resolve('results/cpu-demo'), evalSamples: 40, modelDir: process.env.REEF_DEMO_MODEL ?? join(repoRoot(), '.cache', 'demo-model'), log };
  for (let i = 0; i < argv.length; i++) {
    // Split at the first '=' only: split('=', 2) would drop the rest of a value such as a path with '='.
    const eq = argv[i]!.indexOf('=');
    const flag = eq < 0 ? argv[i]! : argv[i]!.slice(0, eq);
    const inline = eq < 0 ? undefined : argv[i]!.slice(eq + 1);
    const value = inline ?? argv[++i];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    const num = () => {
      const n = Number(value);
      if (!Number.isFinite(n) || n < 0) throw new Error(`${flag}: expected a non-negative number, got ${value}`);
      return n;
    };
    switch (flag) {
      case '--w-rl': o.wRl = num(); break;
      case '--w-opd': o.wOpd = num(); break;
      case '--sessions': o.sessions = Math.max(1, Math.round(num())); break;
      case '--batch-size': o.batchSize = Math.max(1, Math.round(num())); break;
      case '--lr':
        // training.options would refuse it only after the rule PRM and the config were made.
        o.lr = num();
        if (o.lr === 0) throw new Error(`${flag}: expected a positive number, got ${value}`);
        break;
      case '--out': o.out = resolve(value); break;
      case '--model': o.modelDir = resolve(value); break;
      case '--eval-samples':
        // The before/after comparison is the demo's result; with no samples it would read "0% of 0".
        o.evalSamples = Math.round(num());
        if (o.evalSamples < 1) throw new Error(`${flag}: expected at least 1, got ${value}`);
        break;
      default: throw new Error(`unknown option ${flag} (known: --w-rl --w-opd --sessions --batch-size --lr --out --model --eval-samples)`);
    }
  }
  return o;
}

/**
 * Why `dir` cannot serve as the demo model, or null when it can. Checked before anything starts:
 * a missing model surfaced as a Python traceback of the rule PRM and "exited with code 1".
 */
export function modelDirProblem(dir: string): string | null {
  const missing = ['config.json', 'tokenizer.json', 'model.safetensors'].filter((f) => !existsSync(join(dir, f)));
  if (missing.length === 0) return null;
  return `no demo model at ${dir} (missing ${missing.join(', ')}): \`npm run demo\` builds it (scripts/setup.sh), or pass --model DIR`;
}

const ACCEPT_HINT = 'Write plain sentences without bold text or lists, and show each calculation step.';

/** Starts the rule-following PRM double and waits until it answers /health. */
async function startRulePrm(modelDir: string, log: (l: string) => void, signal?: AbortSignal): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  // An accepted plain reply also gets a hint, so accepted turns distil toward the hinted teacher
  // rather than toward the base model's habit (see rule_prm_server --accept-hint).
  const args = ['-m', 'reef_shim.engines.rule_prm_server', '--host', '127.0.0.1', '--port', String(port), '--tokenizer-path', modelDir, '--accept-hint', ACCEPT_HINT];
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
    // The caller only stops a PRM it got back: one that never became healthy must not outlive the demo.
    child.kill('SIGTERM');
    throw err;
  } finally {
    await client.close();
  }
  return { url, child };
}

/** Writes the demo's serve.yaml: the CPU layout with the demo model and the rule PRM. */
function writeConfig(o: DemoOptions, prmUrl: string, port: number): string {
  const cfg = {
    reef: { host: '127.0.0.1', port, data_dir: runStatePaths(o.out).dataDir, default_scenario: 'homework' },
    cluster: {
      num_gpus: 3,
      num_cpus: 8,
      trainer: { gpus: 2 },
      rollout: { gpus: 1, engine: 'hf', model_path: o.modelDir },
      prm: { replicas: 0 },
      prm_actors: 2,
    },
    pipeline: {
      record2record: { config: { prm_url: prmUrl, prm_api: 'sglang', prm_tokenizer_path: o.modelDir, prm_m: 1, prm_max_tokens: 256, prm_timeout_s: 60 } },
      record2task: {},
      task2batch: { config: { batch_size: o.batchSize, prm_record_file: runStatePaths(o.out).prmRecordFile, max_staleness: 4 } },
    },
    training: { options: [`--openclawrl-w-rl=${o.wRl}`, `--openclawrl-w-opd=${o.wOpd}`, `--lr=${o.lr}`] },
  };
  const path = join(o.out, 'serve.yaml');
  writeFileSync(path, stringify(cfg));
  return path;
}

export interface HabitEval {
  samples: number;
  bold: number;
  list: number;
}

export interface DemoResult {
  summary: RunSummary;
  /** Bold/list rates of fresh first replies under the base weights and after the run. */
  before: HabitEval;
  after: HabitEval;
  /** Batch ids the trainer released, in order (from the releases API). */
  releasedBatches: string[];
}

/**
 * The habit measured directly: first replies to fresh homework requests, sampled the way the agent
 * samples. They are side requests of their own scenario, so they are recorded but never trained.
 */
export async function evalHabit(gateway: string, problems: readonly Problem[], n: number, round: string, signal?: AbortSignal): Promise<HabitEval> {
  let bold = 0;
  let list = 0;
  for (let i = 0; i < n; i++) {
    const problem = problems[(i * 7) % problems.length]!;
    const res = await fetch(`${gateway}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-reef-scenario': 'eval', 'x-reef-tag-session': `eval-${round}-${i}`, 'x-reef-tag-turn-type': 'side' },
      body: JSON.stringify({ messages: [{ role: 'system', content: AGENT_SYSTEM_PROMPT }, { role: 'user', content: `Can you help me with my homework? ${problem.question}` }], tools: [SAVE_TOOL], temperature: 0.7, seed: 9000 + i, max_tokens: 200 }),
      ...(signal ? { signal } : {}),
    });
    if (res.status !== 200) throw new Error(`eval request answered ${res.status}: ${await res.text()}`);
    const body = (await res.json()) as { choices: Array<{ message: { content: string | null } }> };
    const score = scoreSession(body.choices[0]!.message.content ?? '', problem.answer);
    if (score.bold) bold++;
    if (score.list) list++;
  }
  return { samples: n, bold: n ? bold / n : 0, list: n ? list / n : 0 };
}

export async function runDemo(o: DemoOptions): Promise<DemoResult> {
  mkdirSync(o.out, { recursive: true });
  clearRunState(o.out);
  const paths = runStatePaths(o.out);
  const signal = o.signal;
  const t0 = performance.now();
  o.log(`closed-loop CPU demo: ${o.sessions} sessions, w_rl=${o.wRl}, w_opd=${o.wOpd}, batch ${o.batchSize}, lr ${o.lr}; output in ${o.out}`);
  o.log('the stack comes up first, then one line per session; Ctrl-C stops it and everything it started');
  const prm = await startRulePrm(o.modelDir, o.log, signal);
  let stack: Stack | null = null;
  const stores: SqliteStore[] = [];
  try {
    const port = await freePort();
    const configPath = writeConfig(o, prm.url, port);
    const config = await loadConfig(configPath);
    stack = await Stack.up({ config, configPath, overrides: [], log: (l) => o.log(`  [reef] ${l}`), ...(signal ? { signal } : {}) });
    signal?.throwIfAborted();
    o.log(`stack up in ${((performance.now() - t0) / 1000).toFixed(0)} s; running sessions`);
    const store = SqliteStore.open(join(paths.dataDir, 'records.sqlite'));
    stores.push(store);
    const gateway = `http://127.0.0.1:${port}`;
    const problems = generateProblems(72);
    const before = await evalHabit(gateway, problems, o.evalSamples, 'before', signal);
    o.log(`base weights: bold in ${Math.round(before.bold * 100)}% of ${before.samples} fresh first replies`);
    const summary = await runSessions({
      gateway,
      scenario: 'homework',
      problems,
      sessions: o.sessions,
      student: new ScriptedStudent(),
      outputDir: o.out,
      prmRecordFile: paths.prmRecordFile,
      onProgress: (p) => o.log(p.line),
      beforeSession: () => trainingCaughtUp(store, o.log, signal),
      ...(signal ? { signal } : {}),
    });
    // runSessions stops early on abort and returns a partial summary: not a result of this demo.
    signal?.throwIfAborted();
    await trainingCaughtUp(store, o.log, signal);
    const after = await evalHabit(gateway, problems, o.evalSamples, 'after', signal);
    o.log(`after ${summary.batches?.length ?? 0} batches: bold in ${Math.round(after.bold * 100)}% of ${after.samples} fresh first replies`);
    const rel = (await (await fetch(`${gateway}/reef/scenarios/homework/releases`)).json()) as { data: Array<{ batchIds: string[] }> };
    const releasedBatches = rel.data.slice().reverse().flatMap((r) => r.batchIds);
    const result: DemoResult = { summary, before, after, releasedBatches };
    writeFileSync(join(o.out, 'results', 'habit.json'), JSON.stringify({ before, after, releasedBatches: releasedBatches.length }, null, 2));
    return result;
  } finally {
    for (const s of stores) await s.close();
    await stack?.down();
    prm.child.kill('SIGTERM');
  }
}

/**
 * A student takes minutes between sessions while training takes seconds; on a CPU the sessions
 * would outrun training instead. So before each session, wait (bounded) until the judge has caught
 * up with the records and the trainer-controller with the judged turns, with no batch in flight.
 */
export async function trainingCaughtUp(store: SqliteStore, log: (l: string) => void, signal?: AbortSignal, timeoutMs = 120_000): Promise<void> {
  const t0 = Date.now();
  let said = false;
  for (;;) {
    signal?.throwIfAborted();
    const [head, judgeNext, judge, judgedHead, trainerNext, state] = await Promise.all([
      store.headOffset(),
      store.getOffset(JUDGE),
      store.getState(JUDGE_STATE) as Promise<{ pending?: unknown[] } | null>,
      store.judgedHeadOffset(),
      store.getOffset(TRAINER),
      store.getState(TRAINER_STATE) as Promise<{ pending?: unknown[] } | null>,
    ]);
    // Offsets start at 1 and a consumer's is the next one it will read (0 before its first).
    const consumed = (next: number, last: number) => last === 0 || next > last;
    // Read every record, and every finished turn has its votes.
    const judgeDone = consumed(judgeNext, head) && (judge?.pending?.length ?? 0) === 0;
    const trainerDone = consumed(trainerNext, judgedHead) && (state?.pending?.length ?? 0) === 0;
    if (judgeDone && trainerDone) return;
    if (Date.now() - t0 > timeoutMs) {
      // Going on in silence read as caught up: the sessions after it run on older weights.
      log(`  judging and training not caught up after ${Math.round(timeoutMs / 1000)} s (judge ${judgeDone ? 'done' : 'behind'}, trainer ${trainerDone ? 'done' : 'behind'}); going on`);
      return;
    }
    if (!said && Date.now() - t0 > 5_000) {
      log('  waiting for judging and training to catch up …');
      said = true;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

export function describeSummary(r: DemoResult, out: string): string {
  const s = r.summary;
  const p = runStatePaths(out);
  const pct = (x: number | undefined) => (x === undefined ? '-' : `${Math.round(x * 100)}%`);
  return [
    '',
    curveTable(s),
    '',
    // rolling_start is the first full window, by which the first batches have been trained.
    `bold rate (last ${s.rolling_window}): ${pct(s.rolling_start?.bold)} at session ${s.rolling_start?.session ?? '-'} → ${pct(s.rolling_end?.bold)} at session ${s.rolling_end?.session ?? '-'}`,
    `bold rate of ${r.before.samples} fresh first replies: ${pct(r.before.bold)} with the base weights → ${pct(r.after.bold)} after training`,
    `pass rate (last ${s.rolling_window}): ${pct(s.rolling_start?.pass)} → ${pct(s.rolling_end?.pass)}`,
    // The paper's criterion needs correct arithmetic too, which the demo model seldom gets right.
    `sessions_to_adaptation (first of 3 passed sessions in a row): ${s.sessions_to_adaptation ?? `not reached in ${s.sessions}`}`,
    `batches trained: ${s.batches?.length ?? 0}; wall time ${s.wall_time_s.toFixed(0)} s`,
    `plots: ${s.files.rates_plot}, ${s.files.rewards_plot}`,
    `per-session results: ${s.files.sessions}; summary: ${s.files.summary}`,
    `records and checkpoints: ${p.dataDir} (removed when the demo runs again); config: ${join(out, 'serve.yaml')}`,
    'next: an ablation, e.g. `npm run demo -- --w-opd 0 --out results/no-opd`; the README explains the knobs',
  ].join('\n');
}
