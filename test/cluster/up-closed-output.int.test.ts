import { spawn } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../cluster/net.js';
import { repoRoot } from '../../cluster/paths.js';
import { pidAlive, waitFor } from '../helpers/wait.js';
import { runReef, testConfig } from '../helpers/stack.js';
import { fakeShimDir } from '../helpers/fake-shim-dir.js';

/**
 * The real `reef up` (bin/reef.js) whose output pipes are closed by their reader, as in
 * `reef up 2>&1 | grep -m1 'reef is up'`. REEF_PYTHON runs the fake shim, held before it is
 * ready, so the stack stays in start-up.
 */
describe('reef up whose stdout and stderr readers went away', () => {
  const root = repoRoot();
  const cfg = testConfig();
  const shim = fakeShimDir();
  let upPid = 0;

  afterAll(() => {
    if (upPid > 0 && pidAlive(upPid)) process.kill(upPid, 'SIGKILL');
    shim.remove();
    rmSync(cfg.dir, { recursive: true, force: true });
  });

  // The first log line after that threw EPIPE: reef up died at once, without draining what it had
  // started, and left its run file behind.
  it('keeps running, and drains and exits 130 when stopped', async () => {
    shim.holdReady();
    const port = await freePort();
    const up = spawn(process.execPath, [join(root, 'bin', 'reef.js'), 'up', '-c', cfg.path, `--reef.port=${port}`], {
      cwd: root,
      env: { ...process.env, ...shim.env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    upPid = up.pid!;
    const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
    await waitFor(() => shim.spawned().length > 0, { what: 'reef up to start the shim', timeoutMs: 60_000 });
    up.stdout!.destroy();
    up.stderr!.destroy();
    // `down` signals the starting stack, which logs that it is draining: a write to the closed pipe.
    const down = await runReef(['down', '--data-dir', join(cfg.dir, 'data')], { timeoutMs: 120_000 });
    expect(down.code, down.stderr).toBe(0);
    expect(await exited).toBe(130);
    for (const pid of shim.spawned()) expect(pidAlive(pid)).toBe(false);
    expect(existsSync(join(cfg.dir, 'data', 'run', 'supervisor.json'))).toBe(false);
  });
});
