import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../cluster/paths.js';
import { defaultTimeoutMs } from './client.js';

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
  });
});
