import type { ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { freePort } from '../../cluster/net.js';
import { tinyModelDir } from '../../cluster/paths.js';
import { readRunFile } from '../../cluster/run-file.js';
import { judgeConfig, pipelineDrained, startRulePrm } from '../../recipes/openclawrl/demo/experiment.js';
import { seeded } from '../../test/helpers/seeded.js';
import { descendants, runReef, testConfig } from '../../test/helpers/stack.js';
import { pidAlive } from '../../test/helpers/wait.js';
import { type ChaosCounts, KINDS, type Kind, runChaos } from './chaos.js';
import { checkSoak, type SoakCheck } from './check.js';
import { type LoadCounts, runLoad } from './load.js';

/**
 * The kill -9 soak: a real stack on the tiny model (`reef up --detach`, the rule PRM double as its
 * judge, training on), tagged client sessions, and SIGKILL of random actors and the shim, then a
 * drain and the invariants of bench/soak/check.ts. docs/benchmarks.md says what it checks.
 */

export interface SoakOptions {
  /** How long the load and the kills run. */
  minutes: number;
  /** Seeds the kill intervals and targets and the sessions' choices. @default 1 */
  seed: number;
  /** Concurrent client sessions. @default 4 */
  sessions: number;
  /** The share of requests sent streamed (0–1; the security review's soak streams them all). @default 0.5 */
  streamed: number;
  /** Seconds between kills, uniform in [min, max]. @default 5–60 (security review 3.4) */
  killEveryS: { min: number; max: number };
  /** @default every kind */
  kinds: readonly Kind[];
  /** @default 4 */
  batchSize: number;
  /** The longest the pipeline may take to drain once the load stopped. @default 600 */
  drainS: number;
  log: (line: string) => void;
}

export interface SoakResult extends SoakCheck {
  dir: string;
  load: LoadCounts;
  chaos: ChaosCounts;
  /** Whether the judge and the trainer-controller caught up before the checks. */
  drained: boolean;
  seconds: number;
}

export const SOAK_DEFAULTS: Omit<SoakOptions, 'log'> = { minutes: 30, seed: 1, sessions: 4, streamed: 0.5, killEveryS: { min: 5, max: 60 }, kinds: KINDS, batchSize: 4, drainS: 600 };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Every actor and the shim running again, after the last kill. */
async function stackBack(configPath: string, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const r = await runReef(['status', '--json', '-c', configPath], { timeoutMs: 60_000 });
    if (r.code === 0) {
      const st = JSON.parse(r.stdout) as { actors: Array<{ state: string }>; shim: { state: string }; engines: Array<{ healthy?: boolean }> };
      if (st.shim.state === 'running' && st.actors.every((a) => a.state === 'running') && st.engines.every((e) => e.healthy !== false)) return true;
    }
    await sleep(2000);
  }
  return false;
}

export async function runSoak(o: SoakOptions): Promise<SoakResult> {
  const started = Date.now();
  const port = await freePort();
  const log = o.log;
  let prm: { url: string; child: ChildProcess } | null = null;
  prm = await startRulePrm(tinyModelDir(), log);
  const cfg = testConfig((c) => {
    c.reef.port = port;
    // One trainer rank and no PRM engine: two shared cores run the rest of the stack and the load.
    c.cluster.num_gpus = 2;
    c.cluster.trainer.gpus = 1;
    c.cluster.prm = { replicas: 0, gpus: 1, engine: 'hf', model_path: null };
    c.cluster.prm_actors = 2;
    c.pipeline.record2record.config = judgeConfig({ kind: 'rule' }, prm!.url, tinyModelDir());
    // Outside the data dir, like the receipts: the checker reads them beside the store.
    // Every judged turn trains, however far the backlog a kill left runs behind: the soak checks
    // that no turn trains twice, and a turn dropped as stale would never be checked at all.
    c.pipeline.task2batch.config = { batch_size: o.batchSize, prm_record_file: 'prm-records.jsonl', max_staleness: 1_000_000 };
  });
  const dataDir = join(cfg.dir, 'data');
  const runDir = join(dataDir, 'run');
  const files = { dataDir, receiptLog: join(cfg.dir, 'receipts.jsonl'), recordFile: join(cfg.dir, 'prm-records.jsonl') };
  log(`soak: ${o.minutes} min, seed ${o.seed}, ${o.sessions} sessions (${Math.round(o.streamed * 100)}% of requests streamed), a kill every ${o.killEveryS.min}–${o.killEveryS.max} s of ${o.kinds.join(', ')}; files in ${cfg.dir}`);
  const load: LoadCounts = { receipts: 0, streamed: 0, failures: 0, conversations: 0 };
  const chaos: ChaosCounts = { kills: {}, skipped: 0 };
  let isDrained = false;
  try {
    const up = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 900_000 });
    if (up.code !== 0) throw new Error(`reef up failed (${up.code}):\n${up.stdout}\n${up.stderr}`);
    const gateway = readRunFile(runDir)!.gateway;
    log(`stack up at ${gateway} (${Math.round((Date.now() - started) / 1000)} s)`);

    const stopLoad = new AbortController();
    const cutLoad = new AbortController();
    const stopChaos = new AbortController();
    const loading = runLoad({ gateway, sessions: o.sessions, streamed: o.streamed, receiptLog: files.receiptLog, seed: o.seed, log }, stopLoad.signal, cutLoad.signal, load);
    const killing = runChaos({ configPath: cfg.path, runDir, rand: seeded(o.seed), intervalS: o.killEveryS, kinds: o.kinds, log }, stopChaos.signal, chaos);
    const t0 = Date.now();
    const endAt = t0 + o.minutes * 60_000;
    for (let minute = 1; Date.now() < endAt; minute++) {
      await sleep(Math.min(60_000, endAt - Date.now()));
      const kills = Object.values(chaos.kills).reduce((a, b) => a + b, 0);
      log(`${((Date.now() - t0) / 60_000).toFixed(1)} min: ${load.receipts} receipts (${load.streamed} streamed), ${load.failures} failed requests, ${kills} kills`);
    }
    stopChaos.abort();
    await killing;
    stopLoad.abort();
    // Each session finishes the request it has in flight; one stuck on a dead gateway is cut.
    const cut = setTimeout(() => cutLoad.abort(), 120_000);
    await loading;
    clearTimeout(cut);
    log(`load stopped: ${load.receipts} receipts; waiting for the stack to be back and the pipeline to drain`);

    if (!(await stackBack(cfg.path, 300_000))) log('the stack was not back (every actor and the shim running) in 300 s');
    const store = SqliteStore.open(join(dataDir, 'records.sqlite'), { readonly: true });
    try {
      const deadline = Date.now() + o.drainS * 1000;
      for (let said = Date.now(); !(isDrained = await pipelineDrained(store)) && Date.now() < deadline; ) {
        if (Date.now() - said > 30_000) {
          log('still draining …');
          said = Date.now();
        }
        await sleep(1000);
      }
    } finally {
      await store.close();
    }
    log(isDrained ? `drained (${Math.round((Date.now() - started) / 1000)} s)` : `not drained after ${o.drainS} s`);
  } finally {
    const down = await runReef(['down', '-c', cfg.path], { timeoutMs: 300_000 }).catch((e: Error) => ({ code: 1, stdout: '', stderr: e.message }));
    if (down.code !== 0) {
      log(`reef down failed (${down.code}): ${down.stderr.trim().split('\n').slice(-3).join(' | ')}; killing the stack's own processes`);
      const supervisor = readRunFile(runDir)?.pid;
      if (supervisor !== undefined) for (const pid of [supervisor, ...descendants(supervisor)]) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
    }
    prm.child.kill('SIGTERM');
  }
  const check = await checkSoak(files);
  if (!isDrained) check.violations.push(`the pipeline did not drain in ${o.drainS} s after the load stopped`);
  const result: SoakResult = { ...check, dir: cfg.dir, load, chaos, drained: isDrained, seconds: Math.round((Date.now() - started) / 1000) };
  writeFileSync(join(cfg.dir, 'summary.json'), JSON.stringify({ options: { ...o, log: undefined }, ...result }, null, 2));
  return result;
}

/** The summary a run prints: counts, kills per kind, then each violation. */
export function summaryLines(r: SoakResult): string[] {
  const c = r.counts;
  return [
    `receipts ${c.receipts} (${r.load.streamed} streamed, ${r.load.failures} failed requests retried), records ${c.records}`,
    `kills ${Object.entries(r.chaos.kills).map(([k, n]) => `${k} ${n}`).join(', ') || 'none'} (${r.chaos.skipped} skipped: nothing of the kind running)`,
    `judged ${c.judged} (${c.judgedDropped} dropped), trained turns ${c.trainedTurns} in ${c.batches} batches, releases ${c.releases}, ledger entries ${c.ledgerEntries}, checkpoints on disk ${c.checkpoints}, stale ${c.stale}, untrainable ${c.untrainable}, dead letters ${c.deadLetters}`,
    `violations ${r.violations.length}`,
    ...r.violations.map((v) => `  ${v}`),
  ];
}
