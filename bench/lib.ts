import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../cluster/paths.js';

/**
 * Benchmark helpers shared by every suite (`bench/suites/*.ts`). The bridge suite uses
 * `measureCalls` on `bridge.call({type: 'ping'})` and `measureWindow` for raw sockets, so its
 * numbers come out in the same rows as the actor suite's.
 */

export interface BenchRow {
  /** What is measured, e.g. `round trip, sequential`. */
  case: string;
  /** Which implementation, e.g. `mailbox+rpc` or `raw zeromq`. */
  impl: string;
  ops: number;
  seconds: number;
  opsPerSec: number;
  /** Latencies in microseconds; null where not measured per operation. */
  p50Us: number | null;
  p99Us: number | null;
  /** Payload megabytes (10^6) per second; null for small payloads. */
  mbPerSec: number | null;
  /** The worst one, in microseconds, where a suite reports it (a column only when some row has it). */
  maxUs?: number | null;
}

export interface BenchContext {
  /** Seconds each case runs (after a short warm-up). `REEF_BENCH_SECONDS`, @default 2 */
  seconds: number;
  log: (line: string) => void;
}

export interface BenchSuite {
  name: string;
  description: string;
  run(ctx: BenchContext): Promise<BenchRow[]>;
}

/** The p-th percentile (0..100) of ascending `sorted`, nearest rank. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * sorted.length) - 1;
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank))]!;
}

export interface Measurement {
  ops: number;
  seconds: number;
  latenciesUs: number[];
}

export function toRow(caseName: string, impl: string, m: Measurement, payloadBytes: number | null = null): BenchRow {
  const sorted = [...m.latenciesUs].sort((a, b) => a - b);
  const opsPerSec = m.ops / m.seconds;
  return {
    case: caseName,
    impl,
    ops: m.ops,
    seconds: round(m.seconds, 2),
    opsPerSec: Math.round(opsPerSec),
    p50Us: sorted.length ? round(percentile(sorted, 50), 1) : null,
    p99Us: sorted.length ? round(percentile(sorted, 99), 1) : null,
    mbPerSec: payloadBytes === null ? null : round((opsPerSec * payloadBytes) / 1e6, 1),
  };
}

function round(x: number, digits: number): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/**
 * Run `call` from `concurrency` loops for `seconds` (after `warmupS`), timing each call.
 * For anything with a promise per request: RpcClient, the bridge client, an HTTP client.
 */
export async function measureCalls(call: () => Promise<unknown>, options: { seconds: number; concurrency?: number; warmupS?: number }): Promise<Measurement> {
  const concurrency = options.concurrency ?? 1;
  const warmEnd = performance.now() + (options.warmupS ?? 0.3) * 1000;
  const end = warmEnd + options.seconds * 1000;
  const latenciesUs: number[] = [];
  let ops = 0;
  const worker = async (): Promise<void> => {
    for (;;) {
      const t0 = performance.now();
      if (t0 >= end) return;
      await call();
      const t1 = performance.now();
      if (t0 >= warmEnd) {
        ops++;
        latenciesUs.push((t1 - t0) * 1000);
      }
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return { ops, seconds: (performance.now() - warmEnd) / 1000, latenciesUs };
}

/**
 * Keep up to `window` requests in flight on a socket that allows one pending send and returns
 * replies in order of arrival: `send(seq)` sends request `seq`, `receive()` returns the seq its
 * reply carries. For raw sockets, where there is no per-call promise.
 */
export async function measureWindow(
  send: (seq: number) => Promise<void>,
  receive: () => Promise<number>,
  options: { seconds: number; window: number; warmupS?: number },
): Promise<Measurement> {
  const warmEnd = performance.now() + (options.warmupS ?? 0.3) * 1000;
  const end = warmEnd + options.seconds * 1000;
  const started = new Map<number, number>();
  const latenciesUs: number[] = [];
  let seq = 0;
  let ops = 0;
  for (;;) {
    const now = performance.now();
    while (now < end && started.size < options.window) {
      started.set(seq, performance.now());
      await send(seq++);
    }
    if (started.size === 0) break;
    const got = await receive();
    const t1 = performance.now();
    const t0 = started.get(got);
    started.delete(got);
    if (t0 !== undefined && t0 >= warmEnd) {
      ops++;
      latenciesUs.push((t1 - t0) * 1000);
    }
  }
  return { ops, seconds: (performance.now() - warmEnd) / 1000, latenciesUs };
}

/** Print one suite's rows as an aligned table. */
export function printTable(title: string, rows: readonly BenchRow[], out: (line: string) => void = console.log): void {
  const withMax = rows.some((r) => r.maxUs !== undefined);
  const header = ['case', 'impl', 'ops/s', 'p50 µs', 'p99 µs', ...(withMax ? ['max µs'] : []), 'MB/s', 'ops'];
  const cells = rows.map((r) => [r.case, r.impl, String(r.opsPerSec), fmt(r.p50Us), fmt(r.p99Us), ...(withMax ? [fmt(r.maxUs ?? null)] : []), fmt(r.mbPerSec), String(r.ops)]);
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (c: string[]): string => c.map((v, i) => (i < 2 ? v.padEnd(widths[i]!) : v.padStart(widths[i]!))).join('  ');
  out(`\n${title}`);
  out(line(header));
  out(widths.map((w) => '-'.repeat(w)).join('  '));
  for (const c of cells) out(line(c));
}

function fmt(x: number | null): string {
  return x === null ? '-' : String(x);
}

/** Write `bench/out/<suite>.json` with the rows and where they were measured. */
export function writeResult(suite: string, rows: readonly BenchRow[]): string {
  const dir = join(repoRoot(), 'bench', 'out');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${suite}.json`);
  const machine = { node: process.version, platform: process.platform, cpus: cpus().length, cpuModel: cpus()[0]?.model ?? null };
  writeFileSync(file, `${JSON.stringify({ suite, at: Date.now(), machine, rows }, null, 2)}\n`);
  return file;
}
