import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BUS_KEY_FILE, readBusKeyFile } from '../../actors/runtime/bus-key.js';
import { RpcClient } from '../../actors/runtime/rpc.js';
import { freePort } from '../../cluster/net.js';
import { repoRoot } from '../../cluster/paths.js';
import { ensureTinyModel, testConfig } from '../helpers/stack.js';
import { pidAlive, waitFor } from '../helpers/wait.js';

/**
 * Security review M6, port squatting during restarts: a stack (test/fixtures/stack-host.mjs: the
 * real `reef up` and the real gateway actor, with the fake shim and stand-ins for the other actors)
 * whose gateway is killed with SIGKILL. An attacker process tries to bind 127.0.0.1:<reef.port>
 * every couple of milliseconds from before the kill until the new gateway serves. When the gateway
 * bound the port itself, the attacker got it during the restart backoff and the agents' next
 * requests (Authorization headers, transcripts) went to it. The supervisor now holds the socket,
 * so the bind never succeeds, and a request sent while no gateway runs is answered by the next one.
 */

const root = repoRoot();

/** Binds host:port whenever it can; counts attempts, binds and the connections it would have stolen. */
const ATTACKER = `
const net = require('node:net');
const [host, port] = process.argv.slice(1);
const stats = { attempts: 0, bound: 0, stolen: 0, errors: {} };
let srv = null;
const tryBind = () => {
  if (srv !== null) return;
  stats.attempts++;
  const s = net.createServer((sock) => { stats.stolen++; sock.destroy(); });
  s.once('error', (err) => { stats.errors[err.code] = (stats.errors[err.code] ?? 0) + 1; });
  s.listen({ host, port: Number(port), exclusive: true }, () => { stats.bound++; srv = s; });
};
setInterval(tryBind, 2);
process.stdout.write('trying\\n');
process.on('SIGTERM', () => { process.stdout.write(JSON.stringify(stats) + '\\n'); process.exit(0); });
`;

interface Status {
  actors: Array<{ id: string; name: string; pid: number | null; state: string; restarts: number }>;
}

describe('a gateway killed under reef up (port squatting, M6)', () => {
  const shimDir = mkdtempSync(join(tmpdir(), 'reef-fake-shim-'));
  let cfg: { path: string; dir: string };
  let port: number;
  let host: ChildProcess;
  const hostErr: string[] = [];
  let control: RpcClient;
  let attacker: ChildProcess | null = null;

  const status = async (): Promise<Status> => (await control.call({ type: 'status' }, { timeoutMs: 10_000 })) as unknown as Status;
  const gateway = async () => (await status()).actors.find((a) => a.name === 'gateway')!;
  const healthz = () => fetch(`http://127.0.0.1:${port}/healthz`, { signal: AbortSignal.timeout(20_000) });

  beforeAll(async () => {
    try {
      execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], { cwd: root, stdio: 'pipe' });
    } catch {
      // reported below if the stack did not compile
    }
    if (!existsSync(join(root, 'dist', 'actors', 'gateway', 'main.js'))) throw new Error('dist/actors/gateway/main.js was not built');
    ensureTinyModel();
    port = await freePort();
    cfg = testConfig((c) => {
      c.reef.port = port;
      c.cluster.prm_actors = 1;
    });
    host = spawn(process.execPath, [join(root, 'test', 'fixtures', 'stack-host.mjs'), cfg.path, shimDir], {
      cwd: root,
      env: { ...process.env, FAKE_SHIM_DIR: shimDir, STACK_HOST_REAL_ACTORS: 'gateway' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const out: string[] = [];
    createInterface({ input: host.stdout! }).on('line', (l) => out.push(l));
    createInterface({ input: host.stderr! }).on('line', (l) => hostErr.push(l));
    const endpoint = await waitFor(
      () => {
        if (host.exitCode !== null) throw new Error(`stack host exited:\n${hostErr.join('\n')}`);
        return out.map((l) => /^\s+control\s+(tcp:\S+)$/.exec(l)?.[1]).find((e) => e !== undefined);
      },
      { what: 'the stack to be up', timeoutMs: 60_000, intervalMs: 100 },
    );
    control = new RpcClient(endpoint, { name: 'test→stack', busKey: readBusKeyFile(join(cfg.dir, 'data', 'run', BUS_KEY_FILE)), log: () => {} });
  }, 90_000);

  afterAll(async () => {
    if (attacker !== null && attacker.exitCode === null) attacker.kill('SIGKILL');
    await control?.close();
    if (host !== undefined && host.exitCode === null) {
      host.kill('SIGTERM');
      await waitFor(() => host.exitCode !== null, { what: 'the stack host to exit', timeoutMs: 30_000 }).catch(() => host.kill('SIGKILL'));
    }
    const events = join(shimDir, 'events.jsonl');
    if (existsSync(events)) for (const l of readFileSync(events, 'utf8').trim().split('\n')) if (pidAlive((JSON.parse(l) as { pid: number }).pid)) process.kill((JSON.parse(l) as { pid: number }).pid, 'SIGKILL');
    rmSync(shimDir, { recursive: true, force: true });
    if (cfg) rmSync(cfg.dir, { recursive: true, force: true });
  });

  it('never lets another process bind reef.port, and answers a request sent while no gateway runs', async () => {
    expect((await healthz()).status).toBe(200);
    const before = await gateway();
    expect(before.pid).not.toBeNull();

    attacker = spawn(process.execPath, ['-e', ATTACKER, '127.0.0.1', String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
    const lines: string[] = [];
    createInterface({ input: attacker.stdout! }).on('line', (l) => lines.push(l));
    await waitFor(() => lines.includes('trying'), { what: 'the attacker to start' });

    process.kill(before.pid!, 'SIGKILL');
    await waitFor(() => !pidAlive(before.pid!), { what: 'the killed gateway to be gone' });
    // Sent into the restart backoff: no gateway process exists now.
    const during = healthz();
    const res = await during;
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true });
    const after = await waitFor(
      async () => {
        const g = await gateway();
        return g.pid !== null && g.pid !== before.pid && g.state === 'running' ? g : null;
      },
      { what: 'the new gateway to register', timeoutMs: 30_000 },
    );
    expect(after.restarts).toBe(before.restarts + 1);
    // The new gateway serves fresh connections too, while the attacker still tries.
    expect((await healthz()).status).toBe(200);

    attacker.kill('SIGTERM');
    await waitFor(() => lines.length > 1, { what: "the attacker's report" });
    const stats = JSON.parse(lines[1]!) as { attempts: number; bound: number; stolen: number; errors: Record<string, number> };
    // The control: it kept trying the whole time, and each try failed on the port being held.
    expect(stats.attempts).toBeGreaterThan(100);
    expect(stats).toMatchObject({ bound: 0, stolen: 0 });
    expect(Object.keys(stats.errors)).toEqual(['EADDRINUSE']);
  }, 60_000);

  it('frees the port once the stack is down', async () => {
    if (attacker !== null && attacker.exitCode === null) attacker.kill('SIGKILL');
    host.kill('SIGTERM');
    await waitFor(() => host.exitCode !== null, { what: 'the stack host to exit', timeoutMs: 30_000 });
    await new Promise<void>((resolve, reject) => {
      const srv = createServer();
      srv.once('error', reject);
      srv.listen({ host: '127.0.0.1', port, exclusive: true }, () => srv.close(() => resolve()));
    });
  }, 40_000);
});
