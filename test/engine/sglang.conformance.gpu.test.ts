import { createServer } from 'node:net';
import { afterAll, beforeAll, describe } from 'vitest';
import { pythonBin, pythonEnv } from '../../cluster/paths.js';
import { engineConformance, type EngineTarget } from './conformance.js';
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

async function freePort(): Promise<number> {
  return await new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
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
    ], pythonEnv(), baseUrl, 900_000);
    target.baseUrl = baseUrl;
  }, 960_000);

  afterAll(async () => {
    await engine?.stop(30_000);
  }, 60_000);

  engineConformance(target);
});
