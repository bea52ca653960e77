import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cluster/paths.js';

/** scripts/setup.sh's step lines, from its preamble (everything before the npm step) run alone. */
function stepLine(env: NodeJS.ProcessEnv = {}): string {
  const script = join(repoRoot(), 'scripts', 'setup.sh');
  const text = readFileSync(script, 'utf8');
  const preamble = text.slice(0, text.indexOf('# --- npm'));
  // stdout is a pipe here, as in CI or `npm test > log`.
  const r = spawnSync('bash', ['-c', `${preamble}\nstep "building TypeScript"`, script], { encoding: 'utf8', env: { ...process.env, NO_COLOR: '', ...env } });
  expect(r.status, r.stderr).toBe(0);
  return r.stdout;
}

describe('scripts/setup.sh output', () => {
  // Every step line carried bold escape codes into CI logs and files.
  it('writes no escape codes when stdout is not a terminal', () => {
    expect(stepLine()).toBe('[setup] building TypeScript\n');
  });
});
