import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../../cluster/paths.js';
import { pidAlive } from './wait.js';

/**
 * A directory for the fake shim (test/fixtures/fake-shim.mjs: the bridge protocol, no Ray, no
 * engines), which the real `reef up` runs when `env` (REEF_PYTHON, FAKE_SHIM_DIR) is in its
 * environment. `holdReady` keeps the shim from getting ready, so a stack stays in start-up.
 */
export interface FakeShimDir {
  dir: string;
  env: { REEF_PYTHON: string; FAKE_SHIM_DIR: string };
  /** Pids of every shim spawned so far (from its events.jsonl). */
  spawned(): number[];
  holdReady(): void;
  /** SIGKILLs every shim still alive, then removes the directory. */
  remove(): void;
}

export function fakeShimDir(): FakeShimDir {
  const dir = mkdtempSync(join(tmpdir(), 'reef-fake-shim-'));
  const env = { REEF_PYTHON: join(dir, 'python'), FAKE_SHIM_DIR: dir };
  writeFileSync(env.REEF_PYTHON, `#!/bin/sh\nexec "${process.execPath}" "${join(repoRoot(), 'test', 'fixtures', 'fake-shim.mjs')}" "$@"\n`);
  chmodSync(env.REEF_PYTHON, 0o755);
  const events = join(dir, 'events.jsonl');
  const spawned = (): number[] =>
    existsSync(events)
      ? readFileSync(events, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { pid: number; event: string }).filter((e) => e.event === 'spawned').map((e) => e.pid)
      : [];
  return {
    dir,
    env,
    spawned,
    holdReady: () => writeFileSync(join(dir, 'hold-ready'), ''),
    remove: () => {
      for (const pid of spawned()) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
