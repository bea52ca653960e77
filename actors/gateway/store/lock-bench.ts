import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { type Percentiles } from './bench.js';
import { sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';

/**
 * The event-loop delay of a gateway-style append loop while another connection keeps taking the
 * write lock for 20–200 ms at a time (the judge's or the trainer-controller's state commits), with
 * the store waiting for it in SQLite's busy handler (`lockWait: 'block'`, the old way) and on a
 * timer (`'async'`, the gateway's now), and with nobody else writing. The holder runs on a worker
 * thread with its own connection, so its holds never land on the loop that is measured.
 */

export interface LockBenchOptions {
  /** Time per case. @default 3000 */
  durationMs?: number;
  /** Concurrent appenders (requests in flight). @default 8 */
  writers?: number;
  /** Each lock hold lasts this long, uniformly at random (ms). @default [20, 200] */
  holdMs?: [number, number];
  /** Pause between two holds (ms). @default [20, 200] */
  gapMs?: [number, number];
  /** @default os.tmpdir() */
  dir?: string;
}

export type LockCase = 'no other writer' | 'block' | 'async';

export interface LockBenchResult {
  case: LockCase;
  seconds: number;
  appends: number;
  /** Appends that failed (budget spent): none expected with holds under 5 s. */
  failed: number;
  /** Event-loop delay of the appending thread, ms (monitorEventLoopDelay, 1 ms resolution). */
  loopDelayMs: Percentiles;
  /** From append() to its receipt, ms. */
  receiptMs: Percentiles;
  /** Holds the other connection completed, and their mean length (ms). */
  holds: number;
  meanHoldMs: number;
}

/**
 * A commit that holds the lock the while: BEGIN IMMEDIATE, a state row of 64 KB, a blocking sleep
 * standing in for serialising and writing a large state, COMMIT. A deterministic generator picks
 * the lengths, so both modes meet the same sequence of holds.
 */
const HOLDER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const Database = require(workerData.driver);
const db = new Database(workerData.path);
db.pragma('busy_timeout = 10000');
db.exec("CREATE TABLE IF NOT EXISTS bench_state (k TEXT PRIMARY KEY, v BLOB)");
const put = db.prepare('INSERT INTO bench_state (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v');
const flag = new Int32Array(workerData.flag);
const value = Buffer.alloc(64 * 1024, 7);
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
const between = ([lo, hi]) => lo + rand() * (hi - lo);
let holds = 0;
let held = 0;
while (Atomics.load(flag, 0) === 0) {
  Atomics.wait(flag, 0, 0, between(workerData.gapMs));
  if (Atomics.load(flag, 0) !== 0) break;
  db.exec('BEGIN IMMEDIATE');
  const t0 = performance.now();
  put.run('state', value);
  Atomics.wait(flag, 1, 0, between(workerData.holdMs));
  db.exec('COMMIT');
  held += performance.now() - t0;
  holds++;
}
db.close();
parentPort.postMessage({ holds, held });
`;

function percentiles(values: number[]): Percentiles {
  const sorted = Float64Array.from(values).sort();
  const at = (q: number) => (sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!);
  return { p50: at(0.5), p99: at(0.99), max: at(1) };
}

async function runCase(dir: string, which: LockCase, o: Required<Omit<LockBenchOptions, 'dir'>>): Promise<LockBenchResult> {
  const path = join(dir, `lock-${which.replaceAll(' ', '-')}.db`);
  // 'process': the fsync per commit is the same in both modes and would only blur the lock wait.
  const store = SqliteStore.open(path, { durability: 'process', lockWait: which === 'async' ? 'async' : 'block' });
  const pool = Array.from({ length: 16 }, (_, i) => sampleRecord(i, { scenario: 'bench', promptTokens: 1536, outputTokens: 512, topK: 4 }));
  let holder: { worker: Worker; done: Promise<{ holds: number; held: number }>; flag: Int32Array } | null = null;
  if (which !== 'no other writer') {
    const flag = new Int32Array(new SharedArrayBuffer(8));
    const driver = createRequire(import.meta.url).resolve('better-sqlite3');
    // execArgv []: a parent started with --input-type=module would make the eval'd CommonJS a module.
    const worker = new Worker(HOLDER_SOURCE, { eval: true, execArgv: [], workerData: { path, driver, flag: flag.buffer, holdMs: o.holdMs, gapMs: o.gapMs } });
    const done = new Promise<{ holds: number; held: number }>((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
    });
    holder = { worker, done, flag };
  }
  const receipts: number[] = [];
  let failed = 0;
  let stop = false;
  let measuring = false;
  let n = 0;
  const writer = async () => {
    while (!stop) {
      const t0 = performance.now();
      try {
        await store.append(pool[n++ % pool.length]!);
        if (measuring) receipts.push(performance.now() - t0);
      } catch {
        if (measuring) failed++;
      }
      // A request's engine time between two commits, as the gateway's appenders have.
      await new Promise((r) => setTimeout(r, 2));
    }
  };
  const delay = monitorEventLoopDelay({ resolution: 1 });
  const loops = Array.from({ length: o.writers }, writer);
  // Warm-up: the first append starts the store's checkpoint worker, and the code gets optimized.
  await new Promise((r) => setTimeout(r, 500));
  measuring = true;
  delay.enable();
  const started = performance.now();
  await new Promise((r) => setTimeout(r, o.durationMs));
  stop = true;
  await Promise.all(loops);
  const seconds = (performance.now() - started) / 1000;
  delay.disable();
  let holds = 0;
  let held = 0;
  if (holder !== null) {
    Atomics.store(holder.flag, 0, 1);
    Atomics.notify(holder.flag, 0);
    Atomics.notify(holder.flag, 1);
    ({ holds, held } = await holder.done);
    await holder.worker.terminate();
  }
  await store.close();
  return {
    case: which,
    seconds,
    appends: receipts.length,
    failed,
    loopDelayMs: { p50: delay.percentile(50) / 1e6, p99: delay.percentile(99) / 1e6, max: delay.max / 1e6 },
    receiptMs: percentiles(receipts),
    holds,
    meanHoldMs: holds === 0 ? 0 : held / holds,
  };
}

export async function benchLockWait(options: LockBenchOptions = {}): Promise<LockBenchResult[]> {
  const o = { durationMs: options.durationMs ?? 3000, writers: options.writers ?? 8, holdMs: options.holdMs ?? [20, 200], gapMs: options.gapMs ?? [20, 200] } as const;
  const dir = mkdtempSync(join(options.dir ?? tmpdir(), 'reef-lock-bench-'));
  try {
    const results: LockBenchResult[] = [];
    for (const which of ['no other writer', 'block', 'async'] as const) results.push(await runCase(dir, which, { ...o, holdMs: [...o.holdMs], gapMs: [...o.gapMs] }));
    return results;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export function formatLockBench(results: LockBenchResult[]): string {
  const f = (x: number) => x.toFixed(1);
  const lines = ['case             loop delay p50/p99/max ms  receipt p50/p99/max ms  appends/s  failed  holds (mean ms)'];
  for (const r of results) {
    lines.push(
      `${r.case.padEnd(16)} ${`${f(r.loopDelayMs.p50)}/${f(r.loopDelayMs.p99)}/${f(r.loopDelayMs.max)}`.padStart(25)} ` +
        `${`${f(r.receiptMs.p50)}/${f(r.receiptMs.p99)}/${f(r.receiptMs.max)}`.padStart(23)} ${(r.appends / r.seconds).toFixed(0).padStart(10)} ${String(r.failed).padStart(7)}  ${r.holds} (${f(r.meanHoldMs)})`,
    );
  }
  return lines.join('\n');
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  console.log(formatLockBench(await benchLockWait()));
}
