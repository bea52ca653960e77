import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { BridgeClient } from '../../bridge/client.js';
import type { TrainingOptions } from '../../bridge/messages.js';
import { spawnShim } from '../../bridge/shim-process.js';
import { loadConfig } from '../../cluster/config/index.js';
import { EngineClient } from '../../cluster/engine-client.js';
import { pythonBin, pythonEnv, repoRoot, tinyModelDir } from '../../cluster/paths.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/index.js';
import { toWire } from '../../actors/trainer-controller/index.js';
import type { Task } from '../../recipes/openclawrl/record2task.js';
import { type BenchRow, type BenchSuite, toRow } from '../lib.js';

/**
 * Training on the CPU with the tiny model: the time of one hybrid RL + OPD step on 2 gloo ranks
 * (FSDP2) and of putting the new weights into the hf engine, per release, both ways: loading the
 * step's checkpoint (`update_weights_from_disk`) and rank 0 pushing them over gloo
 * (`trainer-push-weights`: a gather of the full weights on both ranks, then SGLang's
 * `update_weights_from_distributed`). The baseline, measured in the same run, is the engine
 * generating the same batch: what a step costs relative to producing its data.
 *
 * With `REEF_BENCH_SMOL=1`, `bench/cpu_train.py` adds the rows of a real model on this CPU: one
 * trainer rank (2 threads) stepping the realistic batch `bench/cpu_train.py batch` builds (16 turns
 * of ~300 + ~200 tokens, one hint each; docs/training.md, "ℓold") in fp32 and bf16, with its peak RSS
 * (`REEF_BENCH_SMOL_MODEL`, default `.cache/smollm2-135m-instruct`; about 15 minutes, so opt-in).
 *
 * Where `nvidia-smi` finds a GPU, `bench/gpu_train.py` adds the GPU rows: one trainer rank on
 * Qwen3-shaped models, beside that GPU's matrix product rate in the trainer's dtype
 * (`REEF_BENCH_GPU_SIZES`, default `0.6b,1.7b,4b`; `REEF_BENCH_GPU_DTYPE`, default fp32;
 * `REEF_BENCH_GPU_BUDGET_S`, default 300).
 */

const TASKS = 8;
const NEW_TOKENS = 48;
const STEPS = 4;

async function startEngine(): Promise<{ url: string; stop: () => void }> {
  const child = spawn(pythonBin(), ['-m', 'reef_shim.engines.hf_server', '--model-path', tinyModelDir(), '--host', '127.0.0.1', '--port', '0'], { env: pythonEnv(), stdio: ['ignore', 'pipe', 'ignore'] });
  const url = await new Promise<string>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`hf engine exited with code ${code}`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const j = JSON.parse(line) as { event?: string; url?: string };
        if (j.event === 'ready' && j.url) resolve(j.url);
      } catch {
        // an ordinary log line
      }
    });
  });
  return { url, stop: () => child.kill('SIGTERM') };
}

export const suite: BenchSuite = {
  name: 'train',
  description: `tiny-model training step (2 gloo ranks, ${TASKS} tasks × ${NEW_TOKENS} tokens) and weight sync per release (disk and gloo push), beside the engine generating the same batch`,
  run: async (ctx) => {
    const cfg = await loadConfig(join(repoRoot(), 'recipes/openclawrl/examples/cpu/serve.yaml'));
    const tok = ChatTokenizer.load(tinyModelDir());
    const engine = await startEngine();
    const client = new EngineClient(engine.url);
    const shim = await spawnShim({ logLevel: 'warning', log: () => {} });
    const bridge = await BridgeClient.forProcess(shim);
    try {
      // The baseline: generating the batch the trainer will learn from.
      const gen: number[] = [];
      const tasks: Task[] = [];
      for (let i = 0; i < TASKS; i++) {
        const ids = tok.render([{ role: 'user', content: `Question ${i}: what is ${i} + ${i * 3}?` }], null, { addGenerationPrompt: true }).ids;
        const t0 = performance.now();
        const res = await client.generate({ input_ids: Array.from(ids), sampling_params: { max_new_tokens: NEW_TOKENS, temperature: 1.0, sampling_seed: i, ignore_eos: true }, return_logprob: true, top_logprobs_num: 4 });
        gen.push((performance.now() - t0) * 1000);
        const T = res.output_ids.length;
        const topIds = new Int32Array(T * 4);
        const topLps = new Float32Array(T * 4);
        res.meta_info.output_top_logprobs!.forEach((row, t) => row.forEach(([lp, id], k) => ((topIds[t * 4 + k] = id), (topLps[t * 4 + k] = lp))));
        tasks.push({
          taskId: `bench-${i}`, scenario: 'bench', promptIds: ids, responseIds: Int32Array.from(res.output_ids),
          logprobs: Float32Array.from(res.meta_info.output_token_logprobs!.map((e) => e[0])), topK: 4, topkIds: topIds, topkLogprobs: topLps,
          reward: i % 2 ? 1 : -1, teacherPromptIds: [ids], sampling: { temperature: 1.0, topP: 1.0, topK: -1 }, weightVersion: null,
        });
      }
      await bridge.initRay({ numGpus: 3, numCpus: 6 });
      await bridge.createPlacement({ trainer: { gpus: 2 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 0 }, student: null, cpusPerBundle: 1, colocate: false }, 120);
      const spec = { modelPath: tinyModelDir(), ranks: 2, backend: 'fsdp2' as const, options: cfg.training.resolved as unknown as TrainingOptions, engineLogprobs: cfg.training.engine_logprobs, checkpointDir: mkdtempSync(join(tmpdir(), 'reef-bench-train-')), seed: 0, group: 'reef-trainer' as const };
      ctx.log('  starting the trainer group (2 ranks)…');
      await bridge.trainerStart(spec);
      const steps: number[] = [];
      const syncs: number[] = [];
      const pushes: number[] = [];
      const wire = tasks.map(toWire);
      for (let s = 1; s <= STEPS; s++) {
        const t0 = performance.now();
        const r = await bridge.trainerStep(`bench:openclawrl:${s}`, wire);
        steps.push((performance.now() - t0) * 1000);
        const t1 = performance.now();
        const u = await client.updateWeightsFromDisk(r.checkpointPath, r.weightVersion);
        syncs.push((performance.now() - t1) * 1000);
        if (!u.success) throw new Error(`weight sync failed: ${u.message}`);
        const t2 = performance.now();
        const p = await bridge.trainerPushWeights(engine.url, r.weightVersion);
        pushes.push((performance.now() - t2) * 1000);
        ctx.log(`  step ${s}: ${Math.round(steps.at(-1)! / 1000)} ms, disk sync ${Math.round(syncs.at(-1)! / 1000)} ms, gloo push ${Math.round(pushes.at(-1)! / 1000)} ms (${(p.bytes / 1e6).toFixed(2)} MB), loss ${r.metrics.loss?.toFixed(4)}`);
      }
      await bridge.trainerStop();
      const row = (name: string, impl: string, lat: number[]) => toRow(name, impl, { ops: lat.length, seconds: lat.reduce((a, b) => a + b, 0) / 1e6, latenciesUs: lat });
      const rows: BenchRow[] = [
        row('one batch', `train step, 2 gloo ranks (${TASKS}×${NEW_TOKENS} tokens)`, steps),
        row('one batch', `engine generates the batch (baseline)`, [gen.reduce((a, b) => a + b, 0)]),
        row('per release', 'weight sync: update_weights_from_disk', syncs),
        row('per release', 'weight sync: update_weights_from_distributed (gloo)', pushes),
      ];
      rows.push(...gpuRows(ctx.log));
      rows.push(...smolRows(ctx.log));
      return rows;
    } finally {
      await bridge.shutdown().catch(() => {});
      await bridge.close();
      await shim.stop();
      await client.close();
      engine.stop();
    }
  },
};

interface GpuRow { size: string; params: number; tasks: number; steps: number; step_s: number; tokens_per_s: number; of_baseline: number; gather_s: number; save_s: number; peak_gib: number }

/** The GPU rows from `bench/gpu_train.py`, or none (logged why) on a machine without a GPU. */
function gpuRows(log: (line: string) => void): BenchRow[] {
  if (spawnSync('nvidia-smi', ['-L'], { stdio: 'ignore' }).status !== 0) {
    log('  GPU rows: skipped, nvidia-smi finds no GPU (bench/gpu_train.py measures the trainer on one)');
    return [];
  }
  const json = join(mkdtempSync(join(tmpdir(), 'reef-bench-gpu-')), 'gpu_train.json');
  const args = [join(repoRoot(), 'bench/gpu_train.py'), '--sizes', process.env.REEF_BENCH_GPU_SIZES ?? '0.6b,1.7b,4b', '--dtype', process.env.REEF_BENCH_GPU_DTYPE ?? 'fp32', '--budget-s', process.env.REEF_BENCH_GPU_BUDGET_S ?? '300', '--json', json];
  log(`  GPU: ${pythonBin()} ${args.join(' ')}`);
  const run = spawnSync(pythonBin(), args, { env: pythonEnv({ PYTHONUNBUFFERED: '1' }), stdio: ['ignore', 'inherit', 'inherit'] });
  if (run.status !== 0) throw new Error(`bench/gpu_train.py exited with ${run.status ?? run.signal}`);
  const out = JSON.parse(readFileSync(json, 'utf8')) as { dtype: string; baseline_tflops: number; rows: GpuRow[] };
  const rows: BenchRow[] = [];
  for (const r of out.rows) {
    const steps = Array.from({ length: r.steps }, () => r.step_s * 1e6);
    rows.push(toRow(`GPU step, Qwen3-${r.size} shape, ${r.tasks} tasks`, `1 rank ${out.dtype}: ${Math.round(r.tokens_per_s)} tokens/s, ${Math.round(r.of_baseline * 100)}% of ${out.dtype} matmul (${out.baseline_tflops.toFixed(1)} TFLOP/s, baseline), peak ${r.peak_gib.toFixed(0)} GiB`, { ops: r.steps, seconds: r.step_s * r.steps, latenciesUs: steps }));
    rows.push(toRow(`GPU per release, Qwen3-${r.size} shape`, `full-weight gather + checkpoint write`, { ops: 1, seconds: r.gather_s + r.save_s, latenciesUs: [(r.gather_s + r.save_s) * 1e6] }));
  }
  return rows;
}

interface SmolRow { ranks: number; threads: number; micro_batch_tokens: number; dtype: string; tasks: number; policy_tokens: number; step_s: number; steady_s: number[]; rss_peak_gib: number[] }

/** The SmolLM2-135M rows from `bench/cpu_train.py` (REEF_BENCH_SMOL=1), or none, logged why. */
function smolRows(log: (line: string) => void): BenchRow[] {
  if (process.env.REEF_BENCH_SMOL !== '1') {
    log('  SmolLM2 rows: skipped (REEF_BENCH_SMOL=1 runs bench/cpu_train.py on the real model, ~15 min)');
    return [];
  }
  const model = process.env.REEF_BENCH_SMOL_MODEL ?? join(repoRoot(), '.cache/smollm2-135m-instruct');
  if (!existsSync(join(model, 'config.json'))) {
    log(`  SmolLM2 rows: skipped, no model at ${model} (REEF_BENCH_SMOL_MODEL)`);
    return [];
  }
  const script = join(repoRoot(), 'bench/cpu_train.py');
  const batch = join(mkdtempSync(join(tmpdir(), 'reef-bench-smol-')), 'batch.pt');
  const py = (args: string[]) => {
    log(`  SmolLM2: ${pythonBin()} bench/cpu_train.py ${args.join(' ')}`);
    const run = spawnSync(pythonBin(), [script, ...args, '--model', model], { env: pythonEnv({ PYTHONUNBUFFERED: '1' }), encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
    if (run.status !== 0) throw new Error(`bench/cpu_train.py exited with ${run.status ?? run.signal}`);
    return run.stdout;
  };
  py(['batch', '--out', batch]);
  const rows: BenchRow[] = [];
  for (const dtype of ['fp32', 'bf16']) {
    const line = py(['step', '--batch', batch, '--ranks', '1', '--threads', '2', '--micro-batch-tokens', '2048', '--dtype', dtype, '--steps', '3']).trim().split('\n').at(-1)!;
    const r = JSON.parse(line) as SmolRow;
    rows.push(toRow(`SmolLM2-135M step, ${r.tasks} tasks (${r.policy_tokens} policy tokens)`, `1 rank × ${r.threads} threads ${r.dtype}, micro-batches of ${r.micro_batch_tokens} tokens, peak RSS ${Math.max(...r.rss_peak_gib).toFixed(1)} GiB`, { ops: r.steady_s.length, seconds: r.steady_s.reduce((a, b) => a + b, 0), latenciesUs: r.steady_s.map((x) => x * 1e6) }));
  }
  return rows;
}
