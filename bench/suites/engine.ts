import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { request } from 'undici';
import { pythonBin, pythonEnv, repoRoot } from '../../cluster/paths.js';
import { type BenchRow, type BenchSuite, toRow } from '../lib.js';

/**
 * The hf CPU engine on SmolLM2-135M-Instruct: generated tokens per second with 1, 4, 16 and 32
 * concurrent clients, each sending chat prompts for 128-token completions (sampled, seeded,
 * `ignore_eos`, logprobs and top-4 as the gateway asks for them), closed loop. Rows per engine
 * setting: fp32 and bf16 with continuous batching (`--max-batch 32`), and the one-at-a-time
 * engine it replaced (`--max-batch 1`, fp32, concurrency 1 and 4: more clients only queue).
 * The baseline, measured in the same run, is concurrency 1 of each setting.
 *
 * The model: `REEF_BENCH_MODEL` (a Hugging Face directory), @default `.cache/smollm2-135m-instruct`;
 * without it the suite is skipped. Each case runs `REEF_BENCH_ENGINE_ROUNDS` requests per client
 * (@default 2; 4 at concurrency 1), whatever `REEF_BENCH_SECONDS` says: one request alone takes
 * seconds here.
 */

const NEW_TOKENS = 128;
const TOP_K = 4;

interface Setting {
  name: string;
  args: string[];
  concurrency: number[];
}

const SETTINGS: Setting[] = [
  { name: 'fp32, one at a time (--max-batch 1)', args: ['--dtype', 'fp32', '--max-batch', '1'], concurrency: [1, 4] },
  { name: 'fp32, batched (--max-batch 32)', args: ['--dtype', 'fp32', '--max-batch', '32'], concurrency: [1, 4, 16, 32] },
  { name: 'bf16, batched (--max-batch 32)', args: ['--dtype', 'bf16', '--max-batch', '32'], concurrency: [1, 4, 16, 32] },
];

function modelDir(): string {
  return process.env.REEF_BENCH_MODEL ?? join(repoRoot(), '.cache', 'smollm2-135m-instruct');
}

async function startEngine(model: string, args: string[]): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(pythonBin(), ['-m', 'reef_shim.engines.hf_server', '--model-path', model, '--host', '127.0.0.1', '--port', '0', ...args], {
    env: pythonEnv(),
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`hf engine exited with code ${code} before it was ready`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const j = JSON.parse(line) as { event?: string; url?: string };
        if (j.event === 'ready' && j.url) resolve(j.url);
      } catch {
        // an ordinary log line
      }
    });
  });
  return { url, child };
}

async function stopEngine(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  await exited;
}

const TOPICS = ['the tides', 'a binary heap', 'photosynthesis', 'the French revolution', 'TCP slow start', 'compound interest', 'how bees dance', 'prime numbers'];

function prompt(i: number): string {
  const topic = TOPICS[i % TOPICS.length]!;
  return `<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nRequest ${i}: explain ${topic} to a curious student, step by step.<|im_end|>\n<|im_start|>assistant\n`;
}

async function generate(url: string, i: number): Promise<number> {
  const res = await request(`${url}/generate`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      text: prompt(i), return_logprob: true, top_logprobs_num: TOP_K,
      sampling_params: { max_new_tokens: NEW_TOKENS, temperature: 1.0, sampling_seed: i, ignore_eos: true },
    }),
    headersTimeout: 0,
    bodyTimeout: 0,
  });
  const body = (await res.body.json()) as { output_ids?: number[] };
  if (res.statusCode !== 200 || !body.output_ids) throw new Error(`/generate answered ${res.statusCode}: ${JSON.stringify(body).slice(0, 300)}`);
  return body.output_ids.length;
}

/** `concurrency` clients, each sending `rounds` requests in turn; tokens per second over the wall time. */
async function measure(url: string, concurrency: number, rounds: number): Promise<{ tokens: number; seconds: number; latenciesUs: number[] }> {
  let next = 0;
  let tokens = 0;
  const latenciesUs: number[] = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let r = 0; r < rounds; r++) {
      const started = performance.now();
      // Awaited first: `tokens += await …` reads `tokens` before the await and loses the other clients' counts.
      const generated = await generate(url, next++);
      tokens += generated;
      latenciesUs.push((performance.now() - started) * 1000);
    }
  }));
  return { tokens, seconds: (performance.now() - t0) / 1000, latenciesUs };
}

export const suite: BenchSuite = {
  name: 'engine',
  description: `hf CPU engine on SmolLM2-135M: generated tokens/s at concurrency 1-32, ${NEW_TOKENS}-token completions, batched (fp32, bf16) beside one at a time`,
  run: async (ctx) => {
    const model = modelDir();
    if (!existsSync(join(model, 'config.json'))) {
      ctx.log(`skipped: no model at ${model} (set REEF_BENCH_MODEL to a Hugging Face directory of SmolLM2-135M-Instruct)`);
      return [];
    }
    const roundsEnv = Number(process.env.REEF_BENCH_ENGINE_ROUNDS ?? 2);
    if (!(Number.isInteger(roundsEnv) && roundsEnv > 0)) throw new Error(`REEF_BENCH_ENGINE_ROUNDS must be a positive integer, got ${process.env.REEF_BENCH_ENGINE_ROUNDS}`);
    const rows: BenchRow[] = [];
    for (const setting of SETTINGS) {
      ctx.log(`${setting.name}: starting the engine on ${model}`);
      const engine = await startEngine(model, setting.args);
      try {
        await generate(engine.url, 10_000); // warm-up: the first forward pays for kernel set-up
        let baseline = 0;
        for (const c of setting.concurrency) {
          const rounds = c === 1 ? Math.max(roundsEnv, 4) : roundsEnv;
          const m = await measure(engine.url, c, rounds);
          const perSec = m.tokens / m.seconds;
          if (c === 1) baseline = perSec;
          const vs = c === 1 ? 'baseline' : `${(perSec / baseline).toFixed(2)}x concurrency 1`;
          ctx.log(`  concurrency ${c}: ${m.tokens} tokens in ${m.seconds.toFixed(1)} s = ${perSec.toFixed(1)} tokens/s (${vs})`);
          const row = toRow(`generated tokens/s, concurrency ${c}`, `${setting.name}, ${vs}`, { ops: m.tokens, seconds: m.seconds, latenciesUs: m.latenciesUs });
          rows.push({ ...row, opsPerSec: Math.round(perSec * 10) / 10 });
        }
      } finally {
        await stopEngine(engine.child);
      }
    }
    return rows;
  },
};
