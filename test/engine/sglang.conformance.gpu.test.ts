import { afterAll, beforeAll, describe } from 'vitest';
import { freePort } from '../../cluster/net.js';
import { pythonBin, pythonEnv } from '../../cluster/paths.js';
import { engineConformance, type EngineTarget, type WeightSyncOptions } from './conformance.js';
import { runQuietly, startWithHealth, type EngineChild } from './launch.js';

// SGLang against the same suite. Needs a GPU, an importable sglang, and REEF_SGLANG_MODEL naming a
// checkpoint (an HF directory or hub id SGLang can load); REEF_SGLANG_PYTHON picks the interpreter.
const python = process.env.REEF_SGLANG_PYTHON ?? pythonBin();
const model = process.env.REEF_SGLANG_MODEL ?? '';

function skipReason(): string | null {
  if (!runQuietly('nvidia-smi', ['-L'], undefined, 15_000).ok) return 'nvidia-smi does not work (no GPU)';
  if (!runQuietly(python, ['-c', 'import sglang'], pythonEnv(), 120_000).ok) return `"import sglang" fails with ${python}`;
  if (!model) return 'REEF_SGLANG_MODEL is not set';
  return null;
}

const reason = skipReason();
if (reason) console.warn(`[sglang conformance] skipped: ${reason}`);

/**
 * The test's rank 0 for the distributed weight update. NCCL refuses two ranks of one group on the
 * same GPU, so it sends over NCCL from a second GPU when there is one; on a single GPU it sends
 * over gloo (CPU tensors; SGLang receives them into its CUDA buffers, which gloo's broadcast
 * supports). REEF_SGLANG_WEIGHT_BACKEND=gloo|nccl forces the choice.
 */
function weightSync(): WeightSyncOptions {
  const visible = process.env.CUDA_VISIBLE_DEVICES?.split(',').filter(Boolean)
    ?? runQuietly('nvidia-smi', ['-L'], undefined, 15_000).output.split('\n').filter((l) => l.startsWith('GPU ')).map((_, i) => String(i));
  const forced = process.env.REEF_SGLANG_WEIGHT_BACKEND;
  const backend = forced === 'gloo' || forced === 'nccl' ? forced : visible.length >= 2 ? 'nccl' : 'gloo';
  // SGLang (tp 1) runs on the first visible GPU; the sender takes the second.
  const env = backend === 'nccl' ? pythonEnv({ CUDA_VISIBLE_DEVICES: visible[1] ?? '1' }) : pythonEnv();
  // SGLang documents a failed update as "partially updated", and its logprobs vary slightly run to run.
  return { backend, python, env, atomic: false, exact: false };
}

describe.skipIf(reason !== null)(`sglang engine conformance${reason ? ` (skipped: ${reason})` : ''}`, () => {
  const target: EngineTarget = { baseUrl: '', modelPath: model };
  let engine: EngineChild | null = null;

  beforeAll(async () => {
    const port = await freePort();
    const baseUrl = `http://127.0.0.1:${port}`;
    engine = await startWithHealth(python, [
      '-m', 'sglang.launch_server', '--model-path', model, '--host', '127.0.0.1', '--port', String(port),
      '--mem-fraction-static', '0.5', '--log-level', 'warning',
      // As the shim launches it (engine_process.engine_env): /health without a generation, so it
      // stays 200 while paused.
    ], pythonEnv({ SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION: process.env.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION ?? '0' }), baseUrl, 900_000);
    target.baseUrl = baseUrl;
  }, 960_000);

  afterAll(async () => {
    await engine?.stop(30_000);
  }, 60_000);

  engineConformance(target, { weightSync: weightSync() });
});
