import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BUS_KEY_FILE, readBusKeyFile } from '../actors/runtime/bus-key.js';
import { RpcClient } from '../actors/runtime/rpc.js';
import { runReef, testConfig } from '../test/helpers/stack.js';
import { pidAlive, waitFor } from '../test/helpers/wait.js';
import { repoRoot } from './paths.js';
import { readRunFile } from './run-file.js';

/**
 * The stack in a real `reef up` process (test/fixtures/stack-host.mjs: the up command with a fake
 * shim that speaks the bridge protocol, no Ray, and stand-in actors): shim restarts replay the
 * layout once, a failed replay restarts the shim, the process exits once the stack is down, and a
 * stack that is still starting holds its data dir and can be seen and stopped.
 */

interface Status {
  shim: { pid: number | null; state: string; restarts: number };
  engines: Array<{ name: string; healthy?: boolean }>;
}

interface Host {
  child: ChildProcess;
  pid: number;
  exited: Promise<number | null>;
  stdout: string[];
  stderr: string[];
}

const root = repoRoot();
const hosts: Host[] = [];
const shimDirs: string[] = [];

function startHost(configPath: string, shimDir: string): Host {
  const child = spawn(process.execPath, [join(root, 'test', 'fixtures', 'stack-host.mjs'), configPath, shimDir], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
  const host: Host = { child, pid: child.pid!, exited: new Promise((resolve) => child.once('exit', (code) => resolve(code))), stdout: [], stderr: [] };
  createInterface({ input: child.stdout! }).on('line', (line) => host.stdout.push(line));
  createInterface({ input: child.stderr! }).on('line', (line) => host.stderr.push(line));
  hosts.push(host);
  return host;
}

function newShimDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'reef-fake-shim-'));
  shimDirs.push(dir);
  return dir;
}

const eventsIn = (dir: string): Array<{ pid: number; event: string }> =>
  existsSync(join(dir, 'events.jsonl'))
    ? readFileSync(join(dir, 'events.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { pid: number; event: string })
    : [];
const shimsIn = (dir: string): number[] => eventsIn(dir).filter((e) => e.event === 'spawned').map((e) => e.pid);

beforeAll(() => {
  // The host runs the compiled stack; other parts of the tree may not typecheck yet, which tsc
  // reports but still emits, so only the output file decides.
  try {
    execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], { cwd: root, stdio: 'pipe' });
  } catch {
    // reported below if the stack did not compile
  }
  if (!existsSync(join(root, 'dist', 'cluster', 'commands', 'up.js'))) throw new Error('dist/cluster/commands/up.js was not built');
});

afterAll(() => {
  for (const host of hosts) if (pidAlive(host.pid)) host.child.kill('SIGKILL');
  for (const dir of shimDirs) {
    for (const pid of shimsIn(dir)) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
});

describe('a stack whose shim restarts (fake shim, real processes)', () => {
  const shimDir = newShimDir();
  let host: Host;
  let control: RpcClient;
  /** What the stack asked a shim, leaving out this test's own status polls. */
  const asked = (pid: number): string[] => eventsIn(shimDir).filter((e) => e.pid === pid && e.event !== 'status').map((e) => e.event);
  const shims = (): number[] => shimsIn(shimDir);
  const status = async (): Promise<Status> => (await control.call({ type: 'status' }, { timeoutMs: 15_000 })) as unknown as Status;
  const upAgain = (pid: number) => async () => {
    const s = await status();
    return s.shim.pid === pid && s.shim.state === 'running' && s.engines.length === 2 && s.engines.every((e) => e.healthy === true) ? s : null;
  };

  beforeAll(async () => {
    const cfg = testConfig((c) => {
      c.cluster.prm_actors = 1;
    });
    host = startHost(cfg.path, shimDir);
    const endpoint = await waitFor(
      () => {
        if (!pidAlive(host.pid)) throw new Error(`stack host exited before it was up:\n${host.stderr.join('\n')}`);
        return host.stdout.map((l) => /^\s+control\s+(tcp:\S+)$/.exec(l)?.[1]).find((e) => e !== undefined);
      },
      { what: 'the stack to be up', timeoutMs: 60_000, intervalMs: 100 },
    );
    // The control socket takes only a client holding the key `reef up` made for this stack.
    const busKey = readBusKeyFile(join(cfg.dir, 'data', 'run', BUS_KEY_FILE));
    control = new RpcClient(endpoint, { name: 'test→stack', busKey, log: () => {} });
  });

  afterAll(async () => {
    await control?.close();
  });

  // Each restart event used to start its own replay: both replays ran on the shim that finally got
  // ready, and the bridge of one was overwritten without being closed.
  it('replays the layout once for a shim that died twice before it was ready', async () => {
    const [first] = shims();
    expect(asked(first!)).toEqual(['spawned', 'ping', 'init-ray', 'create-placement', 'start-engine', 'start-engine']);
    writeFileSync(join(shimDir, 'hold-ready'), '');
    process.kill(first!, 'SIGKILL');
    const second = await waitFor(() => shims()[1], { what: 'the shim to be restarted', timeoutMs: 30_000 });
    process.kill(second, 'SIGKILL');
    const third = await waitFor(() => shims()[2], { what: 'the shim to be restarted again', timeoutMs: 30_000 });
    rmSync(join(shimDir, 'hold-ready'));
    await waitFor(upAgain(third), { what: 'the third shim to run both engines', timeoutMs: 60_000, intervalMs: 200 });
    expect(asked(second)).toEqual(['spawned']);
    expect(asked(third)).toEqual(['spawned', 'ping', 'init-ray', 'create-placement', 'start-engine', 'start-engine']);
  });

  // A failed replay was only logged: the shim showed running with no engines, for good.
  it('restarts a shim whose replay failed, until a replay succeeds', async () => {
    writeFileSync(join(shimDir, 'fail-start-engine'), '');
    process.kill(shims().at(-1)!, 'SIGKILL');
    const failed = await waitFor(() => eventsIn(shimDir).find((e) => e.event === 'start-engine failed')?.pid, { what: 'a replay to fail', timeoutMs: 30_000 });
    const next = await waitFor(() => shims()[shims().indexOf(failed) + 1], { what: 'the shim whose replay failed to be restarted', timeoutMs: 30_000 });
    rmSync(join(shimDir, 'fail-start-engine'));
    await waitFor(async () => upAgain(shims().at(-1)!)(), { what: 'a later shim to run both engines', timeoutMs: 90_000, intervalMs: 200 });
    expect(next).not.toBe(failed);
    expect(pidAlive(failed)).toBe(false);
    expect(host.stderr.some((l) => l.includes('replay after shim restart failed: engine rollout failed to start: told to fail; restarting the shim'))).toBe(true);
  });

  // An RpcClient left open keeps Node running: `reef up` never returned after `reef down`.
  it('exits once the stack is down, leaving no shim behind', async () => {
    await control.call({ type: 'down' });
    const code = await host.exited;
    expect(code, host.stderr.slice(-20).join('\n')).toBe(0);
    for (const pid of shims()) expect(pidAlive(pid)).toBe(false);
    expect(eventsIn(shimDir).at(-1)).toMatchObject({ pid: shims().at(-1), event: 'shutdown' });
  });
});

// supervisor.json used to be written only once everything was up (minutes with real engines):
// until then a second `reef up` on the same data dir started a second stack, and `reef status` /
// `reef down` said nothing was running.
describe('a stack that is still starting', () => {
  const shimDir = newShimDir();
  const cfg = testConfig((c) => {
    c.cluster.prm_actors = 1;
  });
  const runDir = join(cfg.dir, 'data', 'run');
  let first: Host;

  beforeAll(async () => {
    writeFileSync(join(shimDir, 'hold-ready'), ''); // the shim never gets ready: start-up waits
    first = startHost(cfg.path, shimDir);
    await waitFor(() => shimsIn(shimDir).length > 0, { what: 'the first stack to start its shim', timeoutMs: 30_000 });
  });

  it('holds its data dir from the start: a second reef up fails at once', async () => {
    expect(readRunFile(runDir)).toMatchObject({ pid: first.pid, state: 'starting', control: null });
    const second = startHost(cfg.path, newShimDir());
    expect(await second.exited).toBe(1);
    expect(second.stderr.join('\n')).toContain(`reef: REEF_ERR_ALREADY_RUNNING: a reef stack is already running (pid ${first.pid}`);
    // The loser neither started anything nor removed the winner's file.
    expect(shimDirs.slice(-1).flatMap(shimsIn)).toEqual([]);
    expect(readRunFile(runDir)).toMatchObject({ pid: first.pid, state: 'starting' });
  });

  it('shows as starting in reef status', async () => {
    const text = await runReef(['status', '-c', cfg.path]);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toContain(`reef is starting (pid ${first.pid}`);
    const json = await runReef(['status', '--json', '-c', cfg.path]);
    expect(JSON.parse(json.stdout)).toMatchObject({ supervisor: { pid: first.pid, state: 'starting', control: null } });
  });

  it("keeps its data dir the owner's alone from the start (stat)", () => {
    const dataDir = join(cfg.dir, 'data');
    const mode = (p: string) => statSync(p).mode & 0o777;
    expect([mode(dataDir), mode(runDir), mode(join(runDir, 'supervisor.json'))]).toEqual([0o700, 0o700, 0o600]);
  });

  it('is stopped by reef down, shim included', async () => {
    const r = await runReef(['down', '-c', cfg.path], { timeoutMs: 120_000 });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`stopping reef (pid ${first.pid}), which was still starting`);
    expect(await first.exited).toBe(130);

    expect(first.stderr).toContain('[reef] stopped before it was up');
    for (const pid of shimsIn(shimDir)) expect(pidAlive(pid)).toBe(false);
    expect(existsSync(join(runDir, 'supervisor.json'))).toBe(false);
  });
});
