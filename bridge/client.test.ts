import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../cluster/paths.js';
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
    expect(engineStartTimeoutS({})).toBe(shimDefault);
    // Launch and health share the budget, then up to 30 s for the weight version.
    expect(defaultTimeoutMs('start-engine', { spec: {} as never })).toBeGreaterThanOrEqual((engineStartTimeoutS() + 30) * 1000);
    expect(engineStartTimeoutS({ REEF_ENGINE_START_TIMEOUT_S: '900' })).toBe(900);
    expect(() => engineStartTimeoutS({ REEF_ENGINE_START_TIMEOUT_S: '5m' })).toThrow(/REEF_ENGINE_START_TIMEOUT_S must be a positive number of seconds, got "5m"/);
  });
});
