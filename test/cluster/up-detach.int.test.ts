import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cluster/paths.js';
import { readRunFile } from '../../cluster/run-file.js';
import { pidAlive } from '../helpers/wait.js';
import { runReef, testConfig } from '../helpers/stack.js';

/**
 * `reef up --detach` through the real CLI and actors, with REEF_PYTHON running the fake shim
 * (test/fixtures/fake-shim.mjs: the bridge protocol, no Ray, no engines behind the URLs).
 */
describe('reef up --detach with the data dir moved by an override and reef.port 0', () => {
  const root = repoRoot();
  const cfg = testConfig();
  const shimDir = mkdtempSync(join(tmpdir(), 'reef-fake-shim-'));
  const dataDir = join(cfg.dir, 'elsewhere');
  const env = { REEF_PYTHON: join(shimDir, 'python'), FAKE_SHIM_DIR: shimDir };

  afterAll(async () => {
    const rf = readRunFile(join(dataDir, 'run'));
    if (rf !== null) {
      await runReef(['down', '--data-dir', dataDir], { timeoutMs: 120_000 });
      if (pidAlive(rf.pid)) process.kill(rf.pid, 'SIGKILL');
    }
    const events = join(shimDir, 'events.jsonl');
    if (existsSync(events)) for (const l of readFileSync(events, 'utf8').trim().split('\n')) if (pidAlive((JSON.parse(l) as { pid: number }).pid)) process.kill((JSON.parse(l) as { pid: number }).pid, 'SIGKILL');
    rmSync(shimDir, { recursive: true, force: true });
    rmSync(cfg.dir, { recursive: true, force: true });
  });

  // It said "stop with `reef down -c FILE`", which looked in the config's data dir and found nothing.
  it('shows its start-up steps, then a down command that stops it', async () => {
    writeFileSync(env.REEF_PYTHON, `#!/bin/sh\nexec "${process.execPath}" "${join(root, 'test', 'fixtures', 'fake-shim.mjs')}" "$@"\n`);
    chmodSync(env.REEF_PYTHON, 0o755);
    // Port 0: the stack picks one.
    const up = await runReef(['up', '-c', cfg.path, '--detach', '--reef.port=0', `--reef.data_dir=${dataDir}`], { timeoutMs: 300_000, env });
    expect(up.code, `${up.stdout}\n${up.stderr}`).toBe(0);
    // It said http://127.0.0.1:0: the gateway listened on a port nobody was told.
    const gateway = /^reef is up: gateway (http:\S+)\/v1,/m.exec(up.stdout)?.[1];
    expect(gateway, up.stdout).toMatch(/^http:\/\/127\.0\.0\.1:[1-9]\d*$/);
    expect(readRunFile(join(dataDir, 'run'))?.gateway).toBe(gateway);
    expect((await fetch(`${gateway}/healthz`)).status).toBe(200);
    for (const step of ['1/4: supervisor', '2/4: python shim', '3/4: Ray, placement groups, engines', '4/4: actors']) expect(up.stderr).toContain(`[reef] step ${step}`);
    const hint = /^stop with `reef (down .*)`$/m.exec(up.stdout)?.[1];
    expect(hint, up.stdout).toBe(`down --data-dir ${dataDir}`);
    const down = await runReef(hint!.split(' '), { timeoutMs: 120_000 });
    expect(down.code, down.stderr).toBe(0);
    expect(down.stdout).toContain('stopped');
    expect(readRunFile(join(dataDir, 'run'))).toBeNull();
  });
});
