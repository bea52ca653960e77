import { spawn } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '../../cluster/net.js';
import { repoRoot } from '../../cluster/paths.js';
import { readRunFile } from '../../cluster/run-file.js';
import { pidAlive, waitFor } from '../helpers/wait.js';
import { runReef, testConfig } from '../helpers/stack.js';
import { testKey } from '../helpers/api-keys.js';
import { fakeShimDir } from '../helpers/fake-shim-dir.js';
import { parse, stringify } from 'yaml';

/**
 * `reef up --detach` through the real CLI and actors, with REEF_PYTHON running the fake shim
 * (test/fixtures/fake-shim.mjs: the bridge protocol, no Ray, no engines behind the URLs).
 */
describe('reef up --detach with the data dir moved by an override and reef.port 0', () => {
  const A = testKey('detached-a');
  const B = testKey('detached-b');
  const cfg = testConfig((c) => (c.reef.api_keys = [{ key: A }]));
  const shim = fakeShimDir();
  const dataDir = join(cfg.dir, 'elsewhere');
  const env = shim.env;
  let gateway = '';
  let hint = '';

  afterAll(async () => {
    const rf = readRunFile(join(dataDir, 'run'));
    if (rf !== null) {
      await runReef(['down', '--data-dir', dataDir], { timeoutMs: 120_000 });
      if (pidAlive(rf.pid)) process.kill(rf.pid, 'SIGKILL');
    }
    shim.remove();
    rmSync(cfg.dir, { recursive: true, force: true });
  });

  // It said "stop with `reef down -c FILE`", which looked in the config's data dir and found nothing.
  it('shows its start-up steps and the down command that stops it', async () => {
    // Port 0: the stack picks one.
    const up = await runReef(['up', '-c', cfg.path, '--detach', '--reef.port=0', `--reef.data_dir=${dataDir}`], { timeoutMs: 300_000, env });
    expect(up.code, `${up.stdout}\n${up.stderr}`).toBe(0);
    // It said http://127.0.0.1:0: the gateway listened on a port nobody was told.
    gateway = /^reef is up: gateway (http:\S+)\/v1,/m.exec(up.stdout)?.[1] ?? '';
    expect(gateway, up.stdout).toMatch(/^http:\/\/127\.0\.0\.1:[1-9]\d*$/);
    expect(readRunFile(join(dataDir, 'run'))?.gateway).toBe(gateway);
    expect((await fetch(`${gateway}/healthz`)).status).toBe(200);
    for (const step of ['1/4: supervisor', '2/4: python shim', '3/4: Ray, placement groups, engines', '4/4: actors']) expect(up.stderr).toContain(`[reef] step ${step}`);
    hint = /^stop with `reef (down .*)`$/m.exec(up.stdout)?.[1] ?? '';
    expect(hint, up.stdout).toBe(`down --data-dir ${dataDir}`);
  });

  it('reloads its API keys with reef keys reload and on SIGHUP, and keeps them when the new ones are bad', async () => {
    const models = async (key: string) => (await fetch(`${gateway}/v1/models`, { headers: { 'x-api-key': key } })).status;
    const keys = (list: Array<Record<string, unknown>>) => {
      const c = parse(readFileSync(cfg.path, 'utf8')) as { reef: { api_keys: unknown } };
      c.reef.api_keys = list;
      writeFileSync(cfg.path, stringify(c));
    };
    expect([await models(A), await models(B)]).toEqual([200, 401]);
    keys([{ key: B }]);
    const reload = await runReef(['keys', 'reload', '--data-dir', dataDir], { timeoutMs: 60_000 });
    expect(reload.code, reload.stderr).toBe(0);
    expect(reload.stdout).toContain('gateway-0: 1 API key in force');
    expect([await models(A), await models(B)]).toEqual([401, 200]);
    // A key the config refuses: the reload says which entry and why, and the keys in force stay.
    keys([{ key: B }, { key: 'too-short' }]);
    const bad = await runReef(['keys', 'reload', '--data-dir', dataDir], { timeoutMs: 60_000 });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/REEF_ERR_CONFIG_INVALID.*\n.*reef\.api_keys\[1\]\.key: must be at least 32 characters/);
    expect([await models(A), await models(B)]).toEqual([401, 200]);
    // The detached stack is in a session of its own: a SIGHUP there is a reload, not a hang-up.
    keys([{ key: A }, { key: B }]);
    process.kill(readRunFile(join(dataDir, 'run'))!.pid, 'SIGHUP');
    await waitFor(async () => (await models(A)) === 200, { what: 'key A admitted after SIGHUP', timeoutMs: 30_000 });
    expect(await models(B)).toBe(200);
    await waitFor(() => readFileSync(join(dataDir, 'run', 'reef.log'), 'utf8').includes('[reef] SIGHUP: API keys reloaded (gateway-0: 2)'), { what: 'the SIGHUP reload in reef.log' });
  });

  it('stops with the down command it named', async () => {
    const down = await runReef(hint.split(' '), { timeoutMs: 120_000 });
    expect(down.code, down.stderr).toBe(0);
    expect(down.stdout).toContain('stopped');
    expect(readRunFile(join(dataDir, 'run'))).toBeNull();
  });
});

describe('reef up --detach interrupted while the stack starts', () => {
  const root = repoRoot();
  const cfg = testConfig();
  const shim = fakeShimDir();
  const env = shim.env;
  let background = 0;

  afterAll(() => {
    if (background > 0 && pidAlive(background)) process.kill(background, 'SIGKILL');
    shim.remove();
    rmSync(cfg.dir, { recursive: true, force: true });
  });

  // Ctrl-C killed only the waiting command: the background stack went on coming up with nobody
  // told, before a script's `trap 'reef down' EXIT` was even set (examples/openclawrl/run.sh).
  it('stops the background stack and exits 130', async () => {
    shim.holdReady(); // the shim never gets ready: start-up waits
    const up = spawn(process.execPath, [join(root, 'bin', 'reef.js'), 'up', '-c', cfg.path, '--detach', `--reef.port=${await freePort()}`], {
      cwd: root,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    up.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    up.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
    background = Number(await waitFor(() => /in the background \(pid (\d+)\)/.exec(out)?.[1], { what: 'the background pid', timeoutMs: 60_000 }));
    await waitFor(() => shim.spawned().length > 0, { what: 'the background stack to start its shim', timeoutMs: 60_000 });
    up.kill('SIGINT');
    expect(await exited, err).toBe(130);
    expect(err).toContain('[reef] stopped before it was up');
    expect(pidAlive(background)).toBe(false);
    for (const pid of shim.spawned()) expect(pidAlive(pid)).toBe(false);
    expect(readRunFile(join(cfg.dir, 'data', 'run'))).toBeNull();
  });
});

describe('a foreground reef up whose terminal hangs up while it starts', () => {
  const root = repoRoot();
  const cfg = testConfig();
  const shim = fakeShimDir();
  const env = shim.env;
  let upPid = 0;

  afterAll(() => {
    if (upPid > 0 && pidAlive(upPid)) process.kill(upPid, 'SIGKILL');
    shim.remove();
    rmSync(cfg.dir, { recursive: true, force: true });
  });

  // SIGHUP's default action killed the supervisor alone: the shim, in a process group of its own,
  // was left running. A foreground stack drains on it, as on SIGTERM; only a detached one reloads.
  it('drains what it started and exits 130', async () => {
    shim.holdReady();
    const up = spawn(process.execPath, [join(root, 'bin', 'reef.js'), 'up', '-c', cfg.path, `--reef.port=${await freePort()}`], { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    upPid = up.pid!;
    let err = '';
    up.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((resolve) => up.once('exit', (code) => resolve(code)));
    await waitFor(() => shim.spawned().length > 0, { what: 'reef up to start the shim', timeoutMs: 60_000 });
    up.kill('SIGHUP');
    expect(await exited, err).toBe(130);
    expect(err).toContain('[reef] SIGHUP: draining');
    for (const pid of shim.spawned()) expect(pidAlive(pid)).toBe(false);
  });
});
