import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { join } from 'node:path';
import { freePort } from '../../cluster/net.js';
import { readRunFile } from '../../cluster/run-file.js';
import { pidAlive, waitFor } from '../helpers/wait.js';
import { commandOf, descendants, ensureTinyModel, runReef, testConfig } from '../helpers/stack.js';

/**
 * The foundation end to end: `reef up --detach` on the tiny model brings up Ray with the
 * placement groups, the engines and the actors; `status` shows them; `scale prm 3` changes only
 * the PRM actors; a killed shim is restarted and the layout replayed; `down` leaves no process.
 */

interface Status {
  supervisor: { pid: number };
  actors: Array<{ id: string; name: string; pid: number | null; state: string; restarts: number }>;
  groups: Array<{ name: string; strategy: string; state: string; bundles: unknown[] }>;
  engines: Array<{ name: string; healthy: boolean; url: string; pid: number | null }>;
  shim: { pid: number | null; state: string; restarts: number };
}

describe('reef up → status → scale → down', () => {
  let cfg: { path: string; dir: string };
  let port: number;
  let stackPid = 0;
  let tree: number[] = [];

  const status = async (): Promise<Status> => {
    const r = await runReef(['status', '--json', '-c', cfg.path]);
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout) as Status;
  };

  beforeAll(async () => {
    ensureTinyModel();
    port = await freePort();
    cfg = testConfig((c) => {
      c.reef.port = port;
    });
  });

  afterAll(async () => {
    // A failed test must not leave a stack running for the next one.
    const rf = readRunFile(join(cfg.dir, 'data', 'run'));
    if (rf) await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    for (const pid of tree) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
  });

  it('brings the stack up in the background', async () => {
    const r = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 600_000 });
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
    expect(r.stdout).toContain(`http://127.0.0.1:${port}`);
    const rf = readRunFile(join(cfg.dir, 'data', 'run'));
    expect(rf).not.toBeNull();
    stackPid = rf!.pid;
  });

  it('shows actors, placement groups and engines in status', async () => {
    const s = await status();
    expect(s.actors.map((a) => a.id).sort()).toEqual(['gateway-0', 'judge-0', 'prm-0', 'prm-1', 'trainer-controller-0']);
    expect(s.actors.every((a) => a.state === 'running' && a.pid !== null)).toBe(true);
    const groups = Object.fromEntries(s.groups.map((g) => [g.name, g]));
    expect(groups['reef-trainer']).toMatchObject({ strategy: 'STRICT_PACK', state: 'CREATED' });
    expect(groups['reef-trainer']!.bundles).toHaveLength(2);
    expect(groups['reef-rollout']).toMatchObject({ state: 'CREATED' });
    expect(groups['reef-prm-0']).toMatchObject({ state: 'CREATED' });
    expect(s.engines.map((e) => [e.name, e.healthy])).toEqual([['rollout', true], ['prm-0', true]]);
    // The gateway serves the model through the rollout engine.
    const res = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 }),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-reef-agent-record-id')).toMatch(/^[0-9A-Z]{26}$/);
    // The gateway's /reef/status (and the live page that polls it) shows the same actors and
    // engines, asked of the supervisor, without the actors' mailbox endpoints.
    const gw = (await (await fetch(`http://127.0.0.1:${port}/reef/status`)).json()) as { actors: Array<Record<string, unknown>>; engines: Array<{ name: string }>; stackError: string | null };
    expect(gw.stackError).toBeNull();
    expect(gw.actors.map((a) => a.id).sort()).toEqual(['gateway-0', 'judge-0', 'prm-0', 'prm-1', 'trainer-controller-0']);
    expect(gw.actors.every((a) => !('mailbox' in a))).toBe(true);
    expect(gw.engines.map((e) => e.name)).toEqual(['rollout', 'prm-0']);
    tree = descendants(stackPid);
  });

  it('scales the PRM actors live without restarting anything else', async () => {
    const before = await status();
    const others = (s: Status) => s.actors.filter((a) => a.name !== 'prm').map((a) => [a.id, a.pid]);
    const r = await runReef(['scale', 'prm', '3', '-c', cfg.path]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('2 → 3');
    const after = await status();
    expect(after.actors.filter((a) => a.name === 'prm').map((a) => a.id)).toEqual(['prm-0', 'prm-1', 'prm-2']);
    expect(others(after)).toEqual(others(before));
    expect(after.engines.map((e) => e.pid)).toEqual(before.engines.map((e) => e.pid));
  });

  it('restarts a killed shim and replays the layout', async () => {
    const before = await status();
    process.kill(before.shim.pid!, 'SIGKILL');
    const after = await waitFor(async () => {
      const s = await status();
      return s.shim.restarts === 1 && s.shim.state === 'running' && s.engines.length === 2 && s.engines.every((e) => e.healthy) && s.groups.length === 3 ? s : null;
    }, { what: 'the shim to be restarted with its engines healthy again', timeoutMs: 180_000, intervalMs: 1000 });
    expect(after.shim.pid).not.toBe(before.shim.pid);
    tree = [...new Set([...tree, ...descendants(stackPid)])];
  });

  it('stops everything on down and leaves no process behind', async () => {
    tree = [...new Set([...tree, ...descendants(stackPid)])];
    expect(tree.length).toBeGreaterThan(5);
    const r = await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    expect(r.code, r.stderr).toBe(0);
    expect(pidAlive(stackPid)).toBe(false);
    const left = await waitFor(() => tree.filter(pidAlive).length === 0 || null, { what: 'every process of the stack to exit', timeoutMs: 30_000 }).catch(() => null);
    const survivors = tree.filter(pidAlive).map((p) => `${p}: ${commandOf(p)}`);
    expect(survivors, `left running:\n${survivors.join('\n')}`).toEqual([]);
    expect(left).toBe(true);
    expect(readRunFile(join(cfg.dir, 'data', 'run'))).toBeNull();
  });
});
