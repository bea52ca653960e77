import { afterAll, beforeAll, describe, expect } from 'vitest';
import { pythonBin, pythonEnv, tinyModelDir } from '../../cluster/paths.js';
import { engineConformance, type EngineTarget } from './conformance.js';
import { runQuietly, startWithReadyLine, type EngineChild } from './launch.js';

// The hf CPU engine (python_shim/reef_shim/engines/hf_server.py) on the tiny model, as a real child.
describe('hf engine conformance', () => {
  const target: EngineTarget = { baseUrl: '', modelPath: tinyModelDir() };
  let engine: EngineChild | null = null;

  beforeAll(async () => {
    // A no-op when the model is up to date (it checks reef_build.json).
    const built = runQuietly(pythonBin(), ['-m', 'reef_shim.tiny_model', '--out', tinyModelDir(), '--quiet'], pythonEnv(), 300_000);
    expect(built.ok, built.output).toBe(true);
    engine = await startWithReadyLine(pythonBin(), [
      '-m', 'reef_shim.engines.hf_server', '--model-path', tinyModelDir(), '--host', '127.0.0.1', '--port', '0',
      '--seed', '0', '--weight-version', 'conformance-1',
    ], pythonEnv(), 120_000);
    target.baseUrl = engine.baseUrl;
  });

  afterAll(async () => {
    const code = await engine?.stop();
    // A clean SIGTERM exit is part of the engine's contract with the shim.
    expect(code, engine?.output().slice(-2000)).toBe(0);
  });

  engineConformance(target, {
    hfExtras: true,
    // The hf engine keeps its weights on the CPU and joins weight groups over gloo only.
    weightSync: { backend: 'gloo', python: pythonBin(), env: pythonEnv(), atomic: true, exact: true },
  });
});
