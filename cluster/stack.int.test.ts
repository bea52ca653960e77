import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RpcClient } from '../actors/runtime/rpc.js';
import { testConfig } from '../test/helpers/stack.js';
import { pidAlive, waitFor } from '../test/helpers/wait.js';
import { repoRoot } from './paths.js';

/**
 * The stack's handling of its shim, in a real `reef up`-like process (test/fixtures/stack-host.mjs)
 * with a fake shim that speaks the bridge protocol (no Ray) and stand-in actors: restarts replay
 * the layout once, a failed replay restarts the shim, and the process exits once the stack is down.
 */

interface Status {
  shim: { pid: number | null; state: string; restarts: number };
  engines: Array<{ name: string; healthy?: boolean }>;
}

const root = repoRoot();
const shimDir = mkdtempSync(join(tmpdir(), 'reef-fake-shim-'));
let host: ChildProcess;
let hostExit: Promise<number | null>;
let control: RpcClient;
const stderr: string[] = [];

const events = (): Array<{ pid: number; event: string }> =>
  existsSync(join(shimDir, 'events.jsonl'))
    ? readFileSync(join(shimDir, 'events.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { pid: number; event: string })
    : [];
/** What the stack asked a shim, leaving out this test's own status polls. */
const asked = (pid: number): string[] => events().filter((e) => e.pid === pid && e.event !== 'status').map((e) => e.event);
const shims = (): number[] => events().filter((e) => e.event === 'spawned').map((e) => e.pid);
const status = async (): Promise<Status> => (await control.call({ type: 'status' }, { timeoutMs: 15_000 })) as unknown as Status;
const upAgain = (pid: number) => async () => {
  const s = await status();
  return s.shim.pid === pid && s.shim.state === 'running' && s.engines.length === 2 && s.engines.every((e) => e.healthy === true) ? s : null;
};

beforeAll(async () => {
  // The host runs the compiled stack; other parts of the tree may not typecheck yet, which tsc
  // reports but still emits, so only the output file decides.
  try {
    execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], { cwd: root, stdio: 'pipe' });
  } catch {
    // reported below if the stack did not compile
  }
  if (!existsSync(join(root, 'dist', 'cluster', 'stack.js'))) throw new Error('dist/cluster/stack.js was not built');
  const cfg = testConfig((c) => {
    c.cluster.prm_actors = 1;
  });
  host = spawn(process.execPath, [join(root, 'test', 'fixtures', 'stack-host.mjs'), cfg.path, shimDir], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
  hostExit = new Promise((resolve) => host.once('exit', (code) => resolve(code)));
  createInterface({ input: host.stderr! }).on('line', (line) => stderr.push(line));
  const up = await new Promise<{ control: string }>((resolve, reject) => {
    createInterface({ input: host.stdout! }).on('line', (line) => resolve(JSON.parse(line) as { control: string }));
    void hostExit.then((code) => reject(new Error(`stack host exited (${code}) before it was up:\n${stderr.join('\n')}`)));
  });
  control = new RpcClient(up.control, { name: 'test→stack', log: () => {} });
});

afterAll(async () => {
  await control?.close();
  if (host?.pid !== undefined && pidAlive(host.pid)) host.kill('SIGKILL');
  for (const pid of shims()) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
  rmSync(shimDir, { recursive: true, force: true });
});

describe('a stack whose shim restarts (fake shim, real processes)', () => {
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
    const failed = await waitFor(() => events().find((e) => e.event === 'start-engine failed')?.pid, { what: 'a replay to fail', timeoutMs: 30_000 });
    const next = await waitFor(() => shims()[shims().indexOf(failed) + 1], { what: 'the shim whose replay failed to be restarted', timeoutMs: 30_000 });
    rmSync(join(shimDir, 'fail-start-engine'));
    await waitFor(async () => upAgain(shims().at(-1)!)(), { what: 'a later shim to run both engines', timeoutMs: 90_000, intervalMs: 200 });
    expect(next).not.toBe(failed);
    expect(pidAlive(failed)).toBe(false);
    expect(stderr.some((l) => l.includes('replay after shim restart failed: engine rollout failed to start: told to fail; restarting the shim'))).toBe(true);
  });

  // An RpcClient left open keeps Node running: `reef up` never returned after `reef down`.
  it('exits once the stack is down, leaving no shim behind', async () => {
    await control.call({ type: 'down' });
    const code = await hostExit;
    expect(code, stderr.slice(-20).join('\n')).toBe(0);
    for (const pid of shims()) expect(pidAlive(pid)).toBe(false);
    expect(events().at(-1)).toMatchObject({ pid: shims().at(-1), event: 'shutdown' });
  });
});
