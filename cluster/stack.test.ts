import { existsSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { testKey } from '../test/helpers/api-keys.js';
import { testConfig } from '../test/helpers/stack.js';
import { loadConfig } from './config/index.js';
import { freePort } from './net.js';
import { repoRoot } from './paths.js';
import { Stack, startUpLimitMs } from './stack.js';

const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

/** A port some other process holds for the length of the test. */
async function heldPort(): Promise<number> {
  const srv: Server = createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  cleanups.push(() => new Promise((resolve) => srv.close(resolve)));
  return (srv.address() as { port: number }).port;
}

describe('Stack.up with a configured port another process holds', () => {
  // The gateway binds last, after the engines (minutes on a GPU); its EADDRINUSE then showed only
  // as "gateway-0 not ready within 20000 ms" once the whole stack had been started and torn down.
  it.each([
    ['reef.port', (c: Record<string, any>, port: number) => (c.reef.port = port)],
    ['cluster.rollout.port', (c: Record<string, any>, port: number) => (c.cluster.rollout.port = port)],
  ])('fails before starting anything, naming %s, and frees the data dir', async (key, set) => {
    const port = await heldPort();
    const cfg = testConfig((c) => set(c, port));
    cleanups.push(() => rmSync(cfg.dir, { recursive: true, force: true }));
    let shimStarted = false;
    const up = Stack.up({
      config: await loadConfig(cfg.path, []),
      configPath: cfg.path,
      overrides: [],
      log: () => {},
      shimCommand: () => {
        shimStarted = true;
        return { command: 'false', args: [], env: {} };
      },
    });
    await expect(up).rejects.toMatchObject({ code: 'REEF_ERR_SUPERVISOR', message: expect.stringContaining(`${key} ${port} on 127.0.0.1: the port is in use by another process`) });
    expect(shimStarted).toBe(false);
    expect(existsSync(join(cfg.dir, 'data', 'run', 'supervisor.json'))).toBe(false);
  });
});

describe('Stack.up on a reef.host that is not this machine', () => {
  // The gateway's bind failed only after the engines had started, as an actor that never registered.
  it('fails before starting anything, naming the address', async () => {
    const cfg = testConfig((c) => {
      c.reef.host = '192.0.2.1'; // TEST-NET-1: assigned to no machine
      c.reef.api_keys = [{ key: testKey('stack-test') }];
    });
    cleanups.push(() => rmSync(cfg.dir, { recursive: true, force: true }));
    const up = Stack.up({ config: await loadConfig(cfg.path, []), configPath: cfg.path, overrides: [], log: () => {}, shimCommand: () => ({ command: 'false', args: [], env: {} }) });
    await expect(up).rejects.toMatchObject({ message: expect.stringContaining('reef.port 8600 on 192.0.2.1: 192.0.2.1 is not an address of this machine') });
    expect(existsSync(join(cfg.dir, 'data', 'run', 'supervisor.json'))).toBe(false);
  });
});

describe('Stack.up with an invalid REEF_ENGINE_START_TIMEOUT_S', () => {
  afterEach(() => vi.unstubAllEnvs());

  // A foreground reef up read it only at its first engine start, once the shim and Ray were up.
  it('fails before starting anything', async () => {
    const cfg = testConfig();
    cleanups.push(() => rmSync(cfg.dir, { recursive: true, force: true }));
    vi.stubEnv('REEF_ENGINE_START_TIMEOUT_S', '5m');
    let shimStarted = false;
    const up = Stack.up({
      config: await loadConfig(cfg.path, []),
      configPath: cfg.path,
      overrides: [],
      log: () => {},
      shimCommand: () => {
        shimStarted = true;
        return { command: 'false', args: [], env: {} };
      },
    });
    await expect(up).rejects.toMatchObject({ code: 'REEF_ERR_CONFIG_INVALID', message: expect.stringContaining('REEF_ENGINE_START_TIMEOUT_S must be a positive number of seconds, got "5m"') });
    expect(shimStarted).toBe(false);
    expect(existsSync(join(cfg.dir, 'data', 'run', 'supervisor.json'))).toBe(false);
  });
});

describe('Stack.up on an IPv6 reef.host', () => {
  // The run file (what reef status and up --detach print) and the endpoints said http://::1:8600.
  it('gives the gateway as a URL, the address in brackets', async () => {
    const port = await freePort();
    const cfg = testConfig((c) => {
      c.reef.host = '::1';
      c.reef.port = port;
    });
    cleanups.push(() => rmSync(cfg.dir, { recursive: true, force: true }));
    const stop = new AbortController();
    const up = Stack.up({
      config: await loadConfig(cfg.path, []),
      configPath: cfg.path,
      overrides: [],
      log: () => {},
      signal: stop.signal,
      // Never ready: the stack stays in start-up until it is stopped.
      shimCommand: () => ({ command: process.execPath, args: ['-e', 'setInterval(() => {}, 1000)'], env: {} }),
    });
    const runFile = join(cfg.dir, 'data', 'run', 'supervisor.json');
    const rf = JSON.parse(readFileSync(runFile, 'utf8')) as { gateway: string };
    stop.abort();
    await expect(up).rejects.toMatchObject({ code: 'REEF_ERR_SUPERVISOR' });
    expect(rf.gateway).toBe(`http://[::1]:${port}`);
    expect(new URL(rf.gateway).port).toBe(String(port));
    expect(existsSync(runFile)).toBe(false);
  });
});

describe('startUpLimitMs: how long up --detach waits', () => {
  afterEach(() => vi.unstubAllEnvs());

  // A fixed 600 s: the reference layout's three engines may take 350 s each (start-engine's own
  // limit), after up to 310 s of placement, so --detach stopped stacks that were still coming up.
  it('outlasts every engine start and the placement, and follows REEF_ENGINE_START_TIMEOUT_S', async () => {
    const path = join(repoRoot(), 'recipes/openclawrl/examples/openclawrl/serve.yaml');
    const ref = await loadConfig(path, []);
    const base = startUpLimitMs(ref);
    // Three sglang engines, each with SGLang's longer start budget.
    expect(base).toBeGreaterThan(3 * (900 + 60) * 1000 + (300 + 10) * 1000);
    expect(base - startUpLimitMs(await loadConfig(path, ['--cluster.prm.engine=hf']))).toBe((900 - 290) * 1000);
    vi.stubEnv('REEF_ENGINE_START_TIMEOUT_S', '1200');
    expect(startUpLimitMs(ref) - base).toBe(3 * (1200 - 900) * 1000);
  });
});
