import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, describe, expect, it } from 'vitest';
import { HANDOFF_DIR_ENV, HeldListener } from '../../cluster/held-listener.js';
import { repoRoot } from '../../cluster/paths.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { waitFor } from '../helpers/wait.js';
import { CPU_EXAMPLE, ensureBuilt, rawConfig } from './harness.js';

/**
 * The gateway serving connections its supervisor's held listener hands over (M6): the limits of a
 * gateway that listens itself hold for handed connections too. A connection that arrived while no
 * gateway ran is served by the one that comes up; past `reef.limits.max_connections` one more is
 * closed as it arrives; a client that never finishes its headers gets 408 (the slowloris defense,
 * which Node runs only for a server that listens: see actors/gateway/handoff.ts). With no gateway,
 * held connections past the bound or the wait are answered 503, not left hanging.
 */

interface Raw {
  socket: Socket;
  data: string;
  closed: Promise<void>;
}

const raws: Raw[] = [];
function open(port: number, send: string): Raw {
  const socket = connect(port, '127.0.0.1');
  const raw: Raw = { socket, data: '', closed: new Promise((resolve) => socket.once('close', () => resolve())) };
  socket.on('data', (d: Buffer) => (raw.data += d.toString()));
  socket.on('error', () => {});
  socket.write(send);
  raws.push(raw);
  return raw;
}

const cleanups: Array<() => unknown> = [];
afterAll(async () => {
  for (const r of raws) r.socket.destroy();
  while (cleanups.length > 0) await cleanups.pop()!();
});

describe('a gateway fed by a held listener', () => {
  it('serves a connection held while it started, caps connections, and times out slow headers', async () => {
    ensureBuilt();
    const engine: FakeEngine = await startFakeEngine();
    cleanups.push(() => engine.close());
    const dir = mkdtempSync(join(tmpdir(), 'reef-handoff-test-'));
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    const configPath = join(dir, 'config.json');
    writeFileSync(configPath, JSON.stringify(rawConfig(join(dir, 'data'), [], { max_connections: 4, headers_timeout_s: 2, request_timeout_s: 2 })));
    const listener = await HeldListener.bind({ host: '127.0.0.1', port: 0, maxQueued: 4, queueTimeoutMs: 60_000, log: () => {} });
    cleanups.push(() => listener.close());

    // Before any gateway process exists.
    const early = open(listener.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
    await waitFor(() => listener.counts.queued === 1, { what: 'the connection to be held' });

    const child: ChildProcess = spawn(process.execPath, [join(repoRoot(), 'test/fixtures/gateway-host.mjs'), configPath, dirname(CPU_EXAMPLE), engine.url], {
      env: { ...process.env, [HANDOFF_DIR_ENV]: listener.socketDir },
      stdio: ['ignore', 'pipe', 'inherit', 'ipc'],
    });
    cleanups.push(async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    });
    listener.attach(child);
    await new Promise<void>((resolve, reject) => {
      child.once('exit', (code) => reject(new Error(`gateway host exited with ${code}`)));
      createInterface({ input: child.stdout! }).once('line', () => resolve());
    });

    await early.closed;
    expect(early.data).toMatch(/^HTTP\/1\.1 200 /);
    expect(early.data).toContain('{"ok":true}');

    // Four connections stuck in their headers fill the cap; the fifth is closed unanswered.
    const slow = Array.from({ length: 4 }, () => open(listener.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n'));
    await waitFor(() => listener.counts.handed === 5, { what: 'the slow connections to be handed over' });
    const over = open(listener.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
    await over.closed;
    expect(over.data).toBe('');
    // The headers timeout ends each slow one.
    await Promise.all(slow.map((s) => s.closed));
    for (const s of slow) expect(s.data).toMatch(/^HTTP\/1\.1 408 /);
    // With the slow ones gone there is room again. The gateway counts a connection gone at its own
    // 'close', which may come just after the client saw the socket close: a connection opened in
    // between is one past the cap, and closed as the fifth was. Room comes back within moments.
    const after = await waitFor(async () => {
      const again = open(listener.port, 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n');
      await again.closed;
      return again.data === '' ? null : again;
    }, { what: 'a connection to be served once the slow ones are gone', timeoutMs: 5_000 });
    expect(after.data).toMatch(/^HTTP\/1\.1 200 /);
  }, 30_000);

  it('answers 503 to connections past its bound or its wait while no gateway serves', async () => {
    const listener = await HeldListener.bind({ host: '127.0.0.1', port: 0, maxQueued: 1, queueTimeoutMs: 300, log: () => {} });
    cleanups.push(() => listener.close());
    const request = 'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}';
    const waits = open(listener.port, request);
    await waitFor(() => listener.counts.queued === 1, { what: 'the first connection to be held' });
    const past = open(listener.port, request);
    for (const [raw, why] of [[past, 'restarting (1 connections already wait for it, reef.limits.max_connections)'], [waits, 'restarting (not back within 0.3 s, reef.limits.headers_timeout_s)']] as const) {
      await raw.closed;
      expect(raw.data).toMatch(/^HTTP\/1\.1 503 /);
      expect(raw.data.toLowerCase()).toContain('retry-after: 1');
      const body = JSON.parse(raw.data.slice(raw.data.indexOf('\r\n\r\n') + 4)) as { error: { code: string; message: string } };
      expect(body.error).toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED', message: `actor gateway is ${why}` });
    }
  });
});
