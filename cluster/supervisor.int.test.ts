import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { RpcClient } from '../actors/runtime/rpc.js';
import { pidAlive, waitFor } from '../test/helpers/wait.js';
import { repoRoot } from './paths.js';
import { scaleReply, statusReply, lookupReply } from './supervisor-messages.js';
import { nodeActorCommand, Supervisor, readyOnJsonLine } from './supervisor.js';

const root = repoRoot();
const fixture = join(root, 'test', 'fixtures', 'echo-actor.mjs');
const lines: string[] = [];
const seenPids = new Set<number>();
let sup: Supervisor;
const clients: RpcClient[] = [];

function client(endpoint: string): RpcClient {
  const rpc = new RpcClient(endpoint, { defaultTimeoutMs: 5000, log: () => {} });
  clients.push(rpc);
  return rpc;
}

function instance(id: string) {
  const found = sup.status().find((a) => a.id === id);
  if (found === undefined) throw new Error(`no instance ${id}`);
  return found;
}

function remember(): void {
  for (const a of sup.status()) if (a.pid !== null) seenPids.add(a.pid);
}

beforeAll(() => {
  // Children run the compiled runtime; other parts of the tree may not typecheck yet, which tsc
  // reports but still emits, so only the output file decides.
  try {
    execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], { cwd: root, stdio: 'pipe' });
  } catch {
    // reported below if the runtime did not compile
  }
  if (!existsSync(join(root, 'dist', 'actors', 'runtime', 'actor-host.js'))) throw new Error('dist/actors/runtime/actor-host.js was not built');
  sup = new Supervisor({
    actors: { echo: 2 },
    command: () => ({ command: process.execPath, args: [fixture] }),
    heartbeatMs: 250,
    // Generous: a loaded 2-core machine must not make a healthy actor look hung.
    missedHeartbeats: 12,
    backoff: { initialMs: 200 },
    log: (line) => lines.push(line),
  });
  return sup.start();
});

afterAll(async () => {
  for (const rpc of clients) await rpc.close();
  await sup?.stop();
  for (const pid of seenPids) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
});

describe('Supervisor with real actor processes', () => {
  it('starts the configured instances, which register and answer ping on their mailbox', async () => {
    const actors = sup.status();
    expect(actors.map((a) => a.id)).toEqual(['echo-0', 'echo-1']);
    remember();
    for (const a of actors) {
      expect(a.mailbox).toMatch(/^tcp:\/\//);
      const pong = await client(a.mailbox!).call<{ pid: number; id: string }>({ type: 'ping' });
      expect(pong).toMatchObject({ type: 'ok', id: a.id, pid: a.pid, state: 'running' });
    }
    await waitFor(() => instance('echo-0').lastHeartbeat !== null && instance('echo-0').stats.received !== undefined, { what: 'a heartbeat with stats' });
  });

  it('restarts an actor killed with SIGKILL: new pid, registered again, answers ping', async () => {
    const before = instance('echo-1');
    const restarts: { id: string; reason: string }[] = [];
    sup.on('restart', (info: { id: string; reason: string }) => restarts.push(info));
    process.kill(before.pid!, 'SIGKILL');
    const after = await waitFor(
      () => {
        const now = instance('echo-1');
        return now.restarts === 1 && now.pid !== null && now.pid !== before.pid && now.state === 'running' && now.mailbox !== null ? now : null;
      },
      { what: 'echo-1 to be restarted and registered', timeoutMs: 20_000 },
    );
    remember();
    expect(pidAlive(before.pid!)).toBe(false);
    const pong = await client(after.mailbox!).call<{ pid: number }>({ type: 'ping' });
    expect(pong.pid).toBe(after.pid);
    expect(restarts).toEqual([expect.objectContaining({ id: 'echo-1', reason: 'exit signal SIGKILL', restarts: 1 })]);
    expect(after.lastExit).toBe('exit signal SIGKILL');
    expect(lines.some((l) => /^supervisor: restarted echo-1 \(exit signal SIGKILL\), restart #1 after \d+ ms$/.test(l))).toBe(true);
    expect(instance('echo-0').restarts).toBe(0);
  });

  it('kills and restarts an actor that stops heartbeating', async () => {
    const before = instance('echo-0');
    process.kill(before.pid!, 'SIGSTOP'); // frozen: alive, but silent
    await waitFor(
      () => {
        const now = instance('echo-0');
        return now.restarts === 1 && now.pid !== null && now.pid !== before.pid && now.state === 'running';
      },
      { what: 'the frozen echo-0 to be replaced', timeoutMs: 20_000 },
    );
    remember();
    await waitFor(() => !pidAlive(before.pid!), { what: 'the frozen process to be gone' });
    expect(lines.some((l) => l.includes('restarted echo-0 (missed 12 heartbeats), restart #1'))).toBe(true);
    expect(instance('echo-0').lastExit).toBe('missed 12 heartbeats');
  });

  it('scales 2 → 4 → 1 through the control socket, draining the highest ids', async () => {
    const control = client(sup.endpoint);
    expect(await control.call({ type: 'scale', actor: 'echo', count: 4 }, { timeoutMs: 30_000, schema: scaleReply })).toMatchObject({ before: 2, after: 4 });
    remember();
    const four = statusReply.parse(await control.call({ type: 'status' }));
    expect(four.actors.map((a) => a.id)).toEqual(['echo-0', 'echo-1', 'echo-2', 'echo-3']);
    const retired = four.actors.slice(1).map((a) => a.pid!);
    expect(await sup.scale('echo', 1)).toEqual({ before: 4, after: 1 });
    expect(sup.status().map((a) => a.id)).toEqual(['echo-0']);
    for (const pid of retired) expect(pidAlive(pid)).toBe(false);
    // Drained, not killed: each retired actor logged its own clean stop.
    for (const id of ['echo-1', 'echo-2', 'echo-3']) expect(lines).toContain(`supervisor: [${id}] actor ${id}: stopped`);
    expect(lines.some((l) => l.includes('sending SIGTERM'))).toBe(false);
    await expect(control.call({ type: 'scale', actor: 'echo', count: -1 })).rejects.toMatchObject({ code: 'REEF_ERR_BAD_MESSAGE' });
  });

  // The name became a path (dist/actors/<name>/main.js): a traversal ran any main.js as this user,
  // with every secret of the environment.
  it('refuses to scale a name that is a path, or an actor kind it does not run, and starts nothing', async () => {
    const control = client(sup.endpoint);
    const before = sup.status().map((a) => a.id);
    await expect(control.call({ type: 'scale', actor: '../../../tmp/x', count: 1 })).rejects.toMatchObject({ code: 'REEF_ERR_BAD_MESSAGE' });
    await expect(control.call({ type: 'scale', actor: 'gateway', count: 1 })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('"gateway" is not an actor this stack scales (it scales echo)') });
    expect(sup.status().map((a) => a.id)).toEqual(before);
    expect(() => nodeActorCommand('../x')).toThrow(/is not an actor kind/);
  });

  // A restarted instance kept its dead mailbox until it registered again: `lookup` handed it out,
  // and retiring the instance meanwhile sent `drain` there and waited drainTimeoutMs for nothing.
  it('forgets the mailbox of a restarted instance at once, so retiring it before it registers sends no drain', async () => {
    await sup.scale('echo', 2);
    remember();
    const victim = instance('echo-1');
    expect(victim.mailbox).not.toBeNull();
    let retired: Promise<unknown> = Promise.resolve();
    const atRestart = new Promise<{ mailbox: string | null; pid: number | null }>((resolve) => {
      const onRestart = (info: { id: string }): void => {
        if (info.id !== 'echo-1') return;
        sup.off('restart', onRestart);
        // Emitted right after the spawn: the new process cannot have registered yet.
        const now = instance('echo-1');
        resolve({ mailbox: now.mailbox, pid: now.pid });
        retired = sup.scale('echo', 1);
      };
      sup.on('restart', onRestart);
    });
    process.kill(victim.pid!, 'SIGKILL');
    const restarted = await atRestart;
    expect(restarted.mailbox).toBeNull();
    expect(restarted.pid).not.toBe(victim.pid);
    seenPids.add(restarted.pid!);
    await retired;
    expect(sup.status().map((a) => a.id)).toEqual(['echo-0']);
    expect(pidAlive(restarted.pid!)).toBe(false);
    expect(lines.filter((l) => l.includes('echo-1: drain failed'))).toEqual([]);
  });

  // The watchdog compared Date.now() stamps: a stalled supervisor (Ctrl-Z, then fg) found every
  // actor silent for the whole stall, its heartbeats still unread, and killed them all at once.
  it('does not kill actors for heartbeats it could not read while it was stalled', async () => {
    await sup.scale('echo', 2);
    remember();
    const before = sup.status().map((a) => [a.id, a.pid, a.restarts]);
    const stalledUntil = Date.now() + 12 * 250 + 1000; // past missedHeartbeats × heartbeatMs
    while (Date.now() < stalledUntil) {
      // The event loop is blocked: no timer, no socket read.
    }
    // Heartbeats sent after the stall are read only after the watchdog's late tick ran.
    await waitFor(() => sup.status().every((a) => a.lastHeartbeat !== null && a.lastHeartbeat > stalledUntil), { what: 'a heartbeat from each actor after the stall' });
    expect(sup.status().map((a) => [a.id, a.pid, a.restarts])).toEqual(before);
    expect(lines.some((l) => /^supervisor: watchdog ran \d+ ms late; not judging heartbeats missed meanwhile$/.test(l))).toBe(true);
  });

  it('does not take a wall-clock step for silence', async () => {
    const before = sup.status().map((a) => [a.id, a.pid, a.restarts]);
    const logged = lines.length;
    const realNow = Date.now.bind(Date);
    let steps = 0;
    // Each read is an hour later than the one before: a watchdog on the wall clock sees every
    // actor silent for an hour on its next tick. (waitFor reads Date.now too, hence a plain sleep.)
    const spy = vi.spyOn(Date, 'now').mockImplementation(() => realNow() + ++steps * 3_600_000);
    try {
      await new Promise((resolve) => setTimeout(resolve, 8 * 250));
    } finally {
      spy.mockRestore();
    }
    expect(steps).toBeGreaterThan(0);
    await waitFor(() => sup.status().every((a) => a.state === 'running'), { what: 'the actors to be running' });
    expect(sup.status().map((a) => [a.id, a.pid, a.restarts])).toEqual(before);
    expect(lines.slice(logged).filter((l) => l.includes('sent no heartbeat for'))).toEqual([]);
  });

  it("tells an actor where another actor's mailboxes are (lookup)", async () => {
    const control = client(sup.endpoint);
    const reply = lookupReply.parse(await control.call({ type: 'lookup', actor: 'echo' }));
    const live = sup.status().filter((a) => a.name === 'echo');
    expect(reply.instances.map((i) => [i.id, i.mailbox])).toEqual(live.map((a) => [a.id, a.mailbox]));
    expect(reply.instances.every((i) => i.mailbox?.startsWith('tcp://127.0.0.1:'))).toBe(true);
    expect(lookupReply.parse(await control.call({ type: 'lookup', actor: 'nobody' })).instances).toEqual([]);
  });

  it('refuses a register from an unknown actor', async () => {
    const control = client(sup.endpoint);
    await expect(control.call({ type: 'register', id: 'ghost-0', name: 'ghost', pid: 1, mailbox: 'tcp://127.0.0.1:1', secret: 'x' })).rejects.toMatchObject({
      code: 'REEF_ERR_NOT_FOUND',
    });
  });

  // The pid is public (ps, /proc, the status reply): a register with it rebound the instance, and
  // `lookup` then handed the attacker's endpoint to every caller.
  it('refuses a register with the real id, name and pid but not the instance secret, and keeps its mailbox', async () => {
    const control = client(sup.endpoint);
    const before = instance('echo-0');
    const forged = { type: 'register', id: 'echo-0', name: 'echo', pid: before.pid, mailbox: 'tcp://127.0.0.1:9' };
    await expect(control.call({ ...forged, secret: '' })).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    await expect(control.call({ ...forged, secret: 'guessed' })).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    for (const mailbox of ['tcp://evil.example:5555', 'tcp://0.0.0.0:5555', 'ipc:///tmp/x', 'tcp://127.0.0.1:99999']) {
      await expect(control.call({ ...forged, mailbox, secret: 'guessed' })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    }
    expect(instance('echo-0').mailbox).toBe(before.mailbox);
    expect(lookupReply.parse(await control.call({ type: 'lookup', actor: 'echo' })).instances.find((i) => i.id === 'echo-0')?.mailbox).toBe(before.mailbox);
  });

  it('keeps a non-node child alive with the same policy, ready on its JSON line', async () => {
    const script = 'console.log("booting"); console.log(JSON.stringify({event: "ready", pid: process.pid})); setInterval(() => {}, 1000);';
    const proc = sup.manage({ id: 'shim', command: process.execPath, args: ['-e', script], ready: readyOnJsonLine() });
    await proc.start();
    const first = proc.pid!;
    seenPids.add(first);
    expect(proc.readyInfo).toEqual({ event: 'ready', pid: first });
    process.kill(first, 'SIGKILL');
    await waitFor(() => proc.restarts === 1 && proc.state === 'running' && proc.pid !== first, { what: 'the shim to be restarted', timeoutMs: 20_000 });
    seenPids.add(proc.pid!);
  });

  it('stop() drains everything and leaves no child process', async () => {
    remember();
    expect(seenPids.size).toBeGreaterThanOrEqual(7);
    await sup.stop();
    expect(sup.status()).toEqual([]);
    for (const pid of seenPids) expect(pidAlive(pid)).toBe(false);
  });
});
