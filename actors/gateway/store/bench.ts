import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewRecord } from './types.js';

/**
 * Record-store benchmark: appends/s and latencies with 1 and 64 concurrent writers, for both
 * durability levels. Called from a bench suite; `node dist/actors/gateway/store/bench.js` runs it
 * alone and prints a table.
 */

export interface StoreBenchOptions {
  /** Concurrent writer counts to measure. @default [1, 64] */
  writers?: number[];
  /** @default ['process', 'power'] */
  durabilities?: ('process' | 'power')[];
  /** Time spent per configuration, after a short warm-up. @default 3000 */
  durationMs?: number;
  /** Prompt and output tokens of each record (≈2k tokens in all), K = 4. */
  promptTokens?: number;
  outputTokens?: number;
  /** Where the temporary databases go. @default os.tmpdir() */
  dir?: string;
}

export interface Percentiles {
  p50: number;
  p99: number;
  max: number;
}

export interface StoreBenchResult {
  writers: number;
  durability: 'process' | 'power';
  records: number;
  seconds: number;
  appendsPerSec: number;
  /** From append() to its receipt, ms. */
  receiptMs: Percentiles;
  /** One group-commit transaction, ms. */
  commitMs: Percentiles;
  meanBatch: number;
  /** Bytes of token payload per record. */
  payloadBytes: number;
}

function percentiles(values: number[]): Percentiles {
  const sorted = Float64Array.from(values).sort();
  const at = (q: number) => (sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!);
  return { p50: at(0.5), p99: at(0.99), max: at(1) };
}

async function runOne(dir: string, writers: number, durability: 'process' | 'power', durationMs: number, pool: NewRecord[]): Promise<StoreBenchResult> {
  const commits: number[] = [];
  const batches: number[] = [];
  const path = join(dir, `bench-${durability}-${writers}.db`);
  const store = SqliteStore.open(path, { durability, onCommit: (ms, n) => (commits.push(ms), batches.push(n)) });
  const receipts: number[] = [];
  let measuring = false;
  let stop = false;
  let n = 0;
  const writer = async () => {
    while (!stop) {
      const record = pool[n++ % pool.length]!;
      const t0 = performance.now();
      await store.append(record);
      if (measuring) receipts.push(performance.now() - t0);
    }
  };
  const loops = Array.from({ length: writers }, writer);
  await new Promise((r) => setTimeout(r, Math.min(500, durationMs / 5))); // warm-up: page cache, WAL growth
  commits.length = 0;
  batches.length = 0;
  measuring = true;
  const started = performance.now();
  await new Promise((r) => setTimeout(r, durationMs));
  stop = true;
  const seconds = (performance.now() - started) / 1000;
  await Promise.all(loops);
  await store.close();
  rmSync(path, { force: true });
  const r = pool[0]!;
  return {
    writers,
    durability,
    records: receipts.length,
    seconds,
    appendsPerSec: receipts.length / seconds,
    receiptMs: percentiles(receipts),
    commitMs: percentiles(commits),
    meanBatch: batches.reduce((a, b) => a + b, 0) / Math.max(1, batches.length),
    payloadBytes: r.promptIds.byteLength + r.outputIds.byteLength + r.logprobs.byteLength + r.topkIds.byteLength + r.topkLogprobs.byteLength,
  };
}

export async function benchStore(options: StoreBenchOptions = {}): Promise<StoreBenchResult[]> {
  const dir = mkdtempSync(join(options.dir ?? tmpdir(), 'reef-store-bench-'));
  const sample = { scenario: 'bench', promptTokens: options.promptTokens ?? 1536, outputTokens: options.outputTokens ?? 512, topK: 4 };
  const pool = Array.from({ length: 64 }, (_, i) => sampleRecord(i, sample));
  const results: StoreBenchResult[] = [];
  try {
    for (const durability of options.durabilities ?? ['process', 'power']) {
      for (const writers of options.writers ?? [1, 64]) {
        results.push(await runOne(dir, writers, durability, options.durationMs ?? 3000, pool));
      }
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return results;
}

export function formatStoreBench(results: StoreBenchResult[]): string {
  const f = (x: number) => x.toFixed(2);
  const lines = ['durability writers appends/s receipt p50/p99 ms commit p50/p99 ms mean batch'];
  for (const r of results) {
    lines.push(
      `${r.durability.padEnd(10)} ${String(r.writers).padStart(7)} ${r.appendsPerSec.toFixed(0).padStart(10)} ` +
        `${`${f(r.receiptMs.p50)}/${f(r.receiptMs.p99)}`.padStart(18)} ${`${f(r.commitMs.p50)}/${f(r.commitMs.p99)}`.padStart(17)} ${f(r.meanBatch).padStart(10)}`,
    );
  }
  return lines.join('\n');
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const results = await benchStore();
  console.log(formatStoreBench(results));
  console.log(`record payload: ${results[0]?.payloadBytes ?? 0} bytes of token arrays (1536 prompt + 512 output tokens, K=4)`);
}
