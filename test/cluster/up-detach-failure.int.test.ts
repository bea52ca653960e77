import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../cluster/net.js';
import { runReef, testConfig } from '../helpers/stack.js';

/**
 * `reef up --detach` whose background stack fails to start, run through the real CLI (dist/):
 * a shim interpreter that does not exist fails step 2 at once.
 */
describe('reef up --detach that fails to start', () => {
  const cfg = testConfig();
  afterAll(() => rmSync(cfg.dir, { recursive: true, force: true }));

  // It printed only "start-up failed (exit 1); see <log>", after the background process had
  // respawned the missing interpreter for the shim's whole 60 s ready timeout.
  it('shows the steps it got through and the error itself, exit 1, and leaves no run file', async () => {
    const port = await freePort();
    const r = await runReef(['up', '-c', cfg.path, '--detach', `--reef.port=${port}`], { timeoutMs: 120_000, env: { REEF_PYTHON: '/nonexistent/reef-python' } });
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(1);
    const err = r.stderr.split('\n');
    expect(err).toContain('[reef] step 1/4: supervisor');
    expect(err).toContain('[reef] step 2/4: python shim');
    expect(err).toContain('reef: REEF_ERR_SUPERVISOR: supervisor: shim cannot be started: spawn failed: spawn /nonexistent/reef-python ENOENT');
    expect(err).toContain(`reef: start-up failed (exit 1); see ${join(cfg.dir, 'data', 'run', 'reef.log')}`);
    expect(err.some((l) => l.includes('step 3/4'))).toBe(false);
    expect(existsSync(join(cfg.dir, 'data', 'run', 'supervisor.json'))).toBe(false);
  });

  // The background stack read it only once it got to its engines, minutes later.
  it('refuses an invalid REEF_ENGINE_START_TIMEOUT_S before starting anything (exit 2)', async () => {
    const r = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 60_000, env: { REEF_ENGINE_START_TIMEOUT_S: '5m' } });
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(2);
    expect(r.stderr).toContain('REEF_ENGINE_START_TIMEOUT_S must be a positive number of seconds, got "5m"');
    expect(r.stdout).not.toContain('starting in the background');
  });
});
