import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { f32ToBytes, i32ToBytes } from '../../actors/runtime/codec.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/index.js';
import { BridgeClient } from '../../bridge/client.js';
import type { Layout, TrainerSpec, TrainTask } from '../../bridge/messages.js';
import { type ShimProcess, spawnShim } from '../../bridge/shim-process.js';
import { EngineClient, type GenerateResponse } from '../../cluster/engine-client.js';
import { tinyModelDir } from '../../cluster/paths.js';
import { startFakeEngine } from '../helpers/fake-engine.js';

/**
 * The trainer driven from TypeScript through the real shim: Ray with 4 logical GPUs, the hf engine
 * in `reef-rollout`, 2 gloo ranks in `reef-trainer`. Tasks are built from the engine's replies the
 * way the trainer-controller builds them; the checkpoint goes back into the engine.
 */

const quiet = (): void => {};
const LAYOUT: Layout = { trainer: { gpus: 2 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 0 }, student: null, cpusPerBundle: 1, colocate: false };
const QUESTION = 'What is 12 + 7?';
const HINTS = ['Add the ones first.', 'The answer is a number below 20.'];

interface Sampling {
  temperature: number;
  topP: number;
  topK: number;
}

function taskFrom(id: string, prompt: Int32Array, reply: GenerateResponse, sampling: Sampling, k: number, teachers: Int32Array[], reward: number): TrainTask {
  const tokens = reply.meta_info.output_token_logprobs!;
  const top = reply.meta_info.output_top_logprobs!;
  return {
    taskId: id,
    promptIds: i32ToBytes(prompt),
    responseIds: i32ToBytes(reply.output_ids),
    logprobs: f32ToBytes(tokens.map((e) => e[0])),
    topK: k,
    topkIds: i32ToBytes(top.flatMap((row) => row.map((e) => e[1]))),
    topkLogprobs: f32ToBytes(top.flatMap((row) => row.map((e) => e[0]))),
    reward,
    teacherPromptIds: teachers.map((t) => i32ToBytes(t)),
    sampling,
    weightVersion: reply.meta_info.weight_version,
  };
}

describe('trainer over the bridge', () => {
  let shim: ShimProcess;
  let client: BridgeClient;
  let engine: EngineClient;
  let tok: ChatTokenizer;
  let dir: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'reef-train-'));
    shim = await spawnShim({ log: quiet });
    client = await BridgeClient.forProcess(shim);
    await client.initRay({ numCpus: 4, numGpus: 4 });
    await client.createPlacement(LAYOUT, 60);
    const info = await client.startEngine({
      name: 'rollout-0',
      role: 'rollout',
      kind: 'hf',
      modelPath: tinyModelDir(),
      group: 'reef-rollout',
      bundleIndex: 0,
      host: '127.0.0.1',
      port: 0,
      extraArgs: ['--seed', '5', '--weight-version', 'v0'],
    });
    engine = new EngineClient(info.url);
    tok = ChatTokenizer.load(tinyModelDir());
  }, 240_000);

  afterAll(async () => {
    await engine?.close();
    await client?.close();
    await shim?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  const render = (user: string): Int32Array => tok.render([{ role: 'user', content: user }], null).ids;
  const generate = (ids: Int32Array, s: Sampling, k: number, seed: number): Promise<GenerateResponse> =>
    engine.generate({
      input_ids: ids,
      sampling_params: { max_new_tokens: 16, temperature: s.temperature, top_p: s.topP, top_k: s.topK, sampling_seed: seed },
      return_logprob: true,
      top_logprobs_num: k,
    });

  it('trains one batch of real engine replies, once, and the engine serves the result', async () => {
    const prompt = render(QUESTION);
    const teachers = HINTS.map((h) => render(`${QUESTION}\n\n[hint]\n${h}`));
    const sampled: Sampling = { temperature: 0.8, topP: 0.9, topK: -1 };
    const greedy: Sampling = { temperature: 0, topP: 1, topK: -1 };
    const tasks = [
      taskFrom('sampled', prompt, await generate(prompt, sampled, 4, 1), sampled, 4, teachers, 1),
      taskFrom('greedy', prompt, await generate(prompt, greedy, 4, 2), greedy, 4, teachers.slice(0, 1), -1),
    ];
    const spec: TrainerSpec = {
      modelPath: tinyModelDir(),
      ranks: 2,
      backend: 'fsdp2',
      options: { wRl: 1, wOpd: 1, clipC: 1, hintSelection: 'sequence_optimal', lr: 1e-3, epsLow: 0.2, epsHigh: 0.28, weightDecay: 0.1, betas: [0.9, 0.98], topK: 4, dtype: 'fp32', oldLogprobs: 'trainer', tisCap: 2, klCoef: 0, clipGrad: 1, microBatchTokens: 2048, gradCheckpointing: 'off' },
      engineLogprobs: 'tempered',
      checkpointDir: join(dir, 'ckpt'),
      seed: 0,
      group: 'reef-trainer',
    };
    const started = await client.trainerStart(spec);
    expect(started).toMatchObject({ worldSize: 2, device: 'cpu', weightVersion: 'v0' });
    expect(started.pids).toHaveLength(2);

    const step = await client.trainerStep('bridge:openclawrl:1', tasks);
    expect(step).toMatchObject({ batchId: 'bridge:openclawrl:1', weightVersion: 'v1', trained: true });
    expect(step.metrics.train_rollout_logprob_abs_diff).toBeLessThan(1e-3);
    expect(Number.isFinite(step.metrics.loss)).toBe(true);
    expect(step.metrics.grad_norm).toBeGreaterThan(0);
    expect(existsSync(join(step.checkpointPath, 'model.safetensors'))).toBe(true);

    const again = await client.trainerStep('bridge:openclawrl:1', tasks);
    expect(again).toMatchObject({ weightVersion: 'v1', checkpointPath: step.checkpointPath, trained: false });
    expect(again.metrics).toEqual(step.metrics);

    const before = await generate(prompt, greedy, 4, 3);
    const swapped = await engine.updateWeightsFromDisk(step.checkpointPath, step.weightVersion);
    expect(swapped).toMatchObject({ success: true, weight_version: 'v1' });
    const after = await generate(prompt, greedy, 4, 3);
    expect(after.meta_info.weight_version).toBe('v1');
    expect(after.meta_info.output_token_logprobs!.map((e) => e[0])).not.toEqual(before.meta_info.output_token_logprobs!.map((e) => e[0]));

    expect(await client.trainerLoad(step.checkpointPath)).toBe('v1');

    // A push into an engine the shim did not start is refused before any weight leaves (rank 0
    // would broadcast the whole model to whoever joins there), and the ranks live on: the next
    // push, into the real engine, serves exactly what the disk load of v1 served. (A push the
    // engine refuses is the retryable REEF_ERR_WEIGHT_SYNC: python_shim/tests/test_trainer.py.)
    const foreign = await startFakeEngine();
    try {
      const refused = await client.trainerPushWeights(foreign.url, 'v1').then(() => null, (e: unknown) => e);
      expect(refused).toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', retryable: false });
      expect((refused as Error).message).toContain('not an engine this shim started');
    } finally {
      await foreign.close();
    }
    await engine.updateWeightsFromDisk(tinyModelDir(), 'v0');
    const pushed = await client.trainerPushWeights(engine.baseUrl, 'v1');
    expect(pushed).toMatchObject({ weightVersion: 'v1', backend: 'gloo' });
    expect(pushed.bytes).toBeGreaterThan(0);
    const viaPush = await generate(prompt, greedy, 4, 3);
    expect(viaPush.meta_info.weight_version).toBe('v1');
    expect(viaPush.output_ids).toEqual(after.output_ids);
    expect(viaPush.meta_info.output_token_logprobs!.map((e) => e[0])).toEqual(after.meta_info.output_token_logprobs!.map((e) => e[0]));

    await client.trainerStop();
    const stopped = await client.trainerStep('bridge:openclawrl:2', tasks).then(
      () => null,
      (e: unknown) => e,
    );
    expect(stopped).toMatchObject({ code: 'REEF_ERR_TRAINER', retryable: false });
  }, 300_000);
});
