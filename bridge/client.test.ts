import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { pythonBin, pythonEnv, repoRoot } from '../cluster/paths.js';
import { defaultTimeoutMs, engineStartTimeoutS } from './client.js';

/** A constant of the shim's trainer group, in seconds, as group.py defines it. */
function shimSeconds(name: string): number {
  const src = readFileSync(join(repoRoot(), 'python_shim', 'reef_shim', 'trainer', 'group.py'), 'utf8');
  const m = new RegExp(`^${name} = ([0-9.]+)`, 'm').exec(src);
  if (!m) throw new Error(`group.py defines no ${name}`);
  return Number(m[1]);
}

describe('bridge client timeouts', () => {
  // A client that gives up before the shim does retries into a worker still busy with the first call.
  it('outlast the shim trainer group waits on its ranks', () => {
    expect(defaultTimeoutMs('trainer-load', { checkpointPath: '/c' })).toBeGreaterThanOrEqual(shimSeconds('SETUP_TIMEOUT_S') * 1000);
    expect(defaultTimeoutMs('trainer-push-weights', { engineUrl: 'http://e', weightVersion: 'v1' })).toBeGreaterThanOrEqual((shimSeconds('PUSH_TIMEOUT_S') + 60) * 1000);
    // The start's phases share one SETUP_TIMEOUT_S; replacing a running group first takes up to 15 s.
    expect(defaultTimeoutMs('trainer-start', { spec: {} as never })).toBeGreaterThanOrEqual((shimSeconds('SETUP_TIMEOUT_S') + 15) * 1000);
  });

  it('outlast the shim engine start, also when REEF_ENGINE_START_TIMEOUT_S changes it', () => {
    const src = readFileSync(join(repoRoot(), 'python_shim', 'reef_shim', 'engine_process.py'), 'utf8');
    const shimDefault = Number(/^DEFAULT_ENGINE_START_TIMEOUT_S = ([0-9.]+)/m.exec(src)![1]);
    const shimSglang = Number(/^SGLANG_ENGINE_START_TIMEOUT_S = ([0-9.]+)/m.exec(src)![1]);
    expect(engineStartTimeoutS({})).toBe(shimDefault);
    expect(engineStartTimeoutS({}, 'hf')).toBe(shimDefault);
    // A first SGLang start also captures CUDA graphs and JIT-compiles kernels.
    expect(engineStartTimeoutS({}, 'sglang')).toBe(shimSglang);
    expect(shimSglang).toBeGreaterThan(shimDefault);
    // Launch and health share the budget, then up to 30 s for the weight version.
    expect(defaultTimeoutMs('start-engine', { spec: {} as never })).toBeGreaterThanOrEqual((engineStartTimeoutS() + 30) * 1000);
    expect(defaultTimeoutMs('start-engine', { spec: { kind: 'sglang' } as never })).toBeGreaterThanOrEqual((shimSglang + 30) * 1000);
    expect(engineStartTimeoutS({ REEF_ENGINE_START_TIMEOUT_S: '900' })).toBe(900);
    expect(engineStartTimeoutS({ REEF_ENGINE_START_TIMEOUT_S: '60' }, 'sglang')).toBe(60);
    expect(() => engineStartTimeoutS({ REEF_ENGINE_START_TIMEOUT_S: '5m' })).toThrow(/REEF_ENGINE_START_TIMEOUT_S must be a positive number of seconds, got "5m"/);
  });

  it('read REEF_ENGINE_START_TIMEOUT_S as the shim does, value by value (Python\'s float() in engine_process.py)', () => {
    // What the shim takes and what it refuses, checked against the real Python reader below.
    const values = ['900', ' 12.5 ', '1e3', '.5', '+7', '0x10', '0b11', '1_0', 'inf', 'nan', '-3', '0', '5m'];
    const script = `
import json, sys
from reef_shim.engine_process import engine_start_timeout_s
from reef_shim.errors import ShimError
out = []
for v in json.loads(sys.argv[1]):
    try:
        out.append(engine_start_timeout_s({"REEF_ENGINE_START_TIMEOUT_S": v}))
    except ShimError:
        out.append(None)
print(json.dumps(out))
`;
    const py = spawnSync(pythonBin(), ['-c', script, JSON.stringify(values)], { env: pythonEnv(), encoding: 'utf8' });
    expect(py.status, py.stderr).toBe(0);
    const shim = JSON.parse(py.stdout) as (number | null)[];
    const client = values.map((v) => {
      try {
        return engineStartTimeoutS({ REEF_ENGINE_START_TIMEOUT_S: v });
      } catch {
        return null;
      }
    });
    expect(client).toEqual(shim);
    expect(shim.filter((x) => x !== null)).toEqual([900, 12.5, 1000, 0.5, 7]);
  });
});
