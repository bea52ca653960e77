import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterEach, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cluster/paths.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { waitFor } from '../helpers/wait.js';
import { CHAT, CPU_EXAMPLE, ensureBuilt, postChat, rawConfig } from './harness.js';

/**
 * Slow and flooding clients against a gateway in its own process (security review H6): whatever
 * they do, the process's open descriptors stay under the connection cap and its memory under what
 * its slots may hold, and every connection they open is closed by the server's timeouts. Bounds
 * are asserted, never how long anything took.
 */

interface Host {
  child: ChildProcess;
  url: string;
  engine: FakeEngine;
  dataDir: string;
}

let host: Host | null = null;
const clients: Socket[] = [];

afterEach(async () => {
  for (const c of clients.splice(0)) c.destroy();
  if (host) {
    const { child, engine, dataDir } = host;
    host = null;
    if (child.exitCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    }
    await engine.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
});

async function startHost(limits: Record<string, unknown>): Promise<Host> {
  ensureBuilt();
  const engine = await startFakeEngine();
  const dataDir = mkdtempSync(join(tmpdir(), 'reef-slowloris-'));
  const configPath = join(dataDir, 'config.json');
  writeFileSync(configPath, JSON.stringify(rawConfig(join(dataDir, 'data'), [], limits)));
  const child = spawn(process.execPath, [join(repoRoot(), 'test/fixtures/gateway-host.mjs'), configPath, dirname(CPU_EXAMPLE), engine.url], { stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise<string>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`gateway host exited with ${code}`)));
    createInterface({ input: child.stdout! }).once('line', (l) => resolve((JSON.parse(l) as { url: string }).url));
  });
  host = { child, url, engine, dataDir };
  return host;
}

const fds = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;
const rssBytes = (pid: number) => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]) * 1024;

/** Samples the process's descriptors and memory until stopped; the peaks are what is asserted. */
function sampler(pid: number) {
  const peak = { fds: fds(pid), rss: rssBytes(pid) };
  const tick = () => {
    try {
      peak.fds = Math.max(peak.fds, fds(pid));
      peak.rss = Math.max(peak.rss, rssBytes(pid));
    } catch {
      // The process is gone; the test's own assertions say so.
    }
  };
  const timer = setInterval(tick, 10);
  return {
    peak,
    stop: () => {
      clearInterval(timer);
      tick();
    },
  };
}

/** Opens a connection, writes `data` and keeps whatever comes back; `closed` resolves when the server ends it. */
function open(url: string, data: string | Buffer): Promise<{ received: () => string; closed: Promise<void> }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve) => {
    const socket = connect({ host: hostname, port: Number(port) });
    clients.push(socket);
    let got = '';
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => (got += d));
    socket.on('error', () => {});
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.once('connect', () => socket.write(data));
    // Resolved at once: a connection the server drops at accept may never report connect.
    resolve({ received: () => got, closed });
  });
}

const status = (raw: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0);

describe('slow and flooding clients, gateway process bounds', () => {
  it('slowloris: 2000 connections that send headers declaring 64 MiB (or half their headers) and then nothing are all closed, with descriptors under the cap and memory bounded', { timeout: 120_000 }, async () => {
    const maxConnections = 300;
    const h = await startHost({ max_connections: maxConnections, keyless_max_concurrency: 16, request_timeout_s: 3, headers_timeout_s: 1, body_idle_timeout_s: 1 });
    const pid = h.child.pid!;
    // Warm: tokenizer worker, store and engine pool are open before the baseline is read.
    expect((await postChat(h.url, CHAT)).status).toBe(200);
    const base = { fds: fds(pid), rss: rssBytes(pid) };
    const s = sampler(pid);
    const head = 'POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 67108864\r\n\r\n';
    const partial = 'POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: appl';
    const conns = await Promise.all(Array.from({ length: 2000 }, (_, i) => open(h.url, i % 2 === 0 ? head : partial)));
    await Promise.all(conns.map((c) => c.closed));
    s.stop();
    // The cap holds descriptors: the accepted connections, plus a few accepted and at once closed.
    expect(s.peak.fds).toBeLessThanOrEqual(base.fds + maxConnections + 32);
    // 16 slots with at most their first 64 KiB buffer each; everything else is answered or dropped
    // from its headers. 64 MiB would be one declared body.
    expect(s.peak.rss - base.rss).toBeLessThan(64 * 1024 * 1024);
    const statuses = conns.map((c) => status(c.received()));
    // Nothing was ever generated, and some were refused outright (the key's slots were taken).
    expect(statuses.filter((x) => x >= 200 && x < 300)).toHaveLength(0);
    expect(statuses.filter((x) => x === 429).length).toBeGreaterThan(0);
    // Half-sent headers end with the headers timeout's 408.
    expect(statuses.filter((x) => x === 408).length).toBeGreaterThan(0);
    expect(h.engine.requests).toHaveLength(1);
    await waitFor(() => fds(pid) <= base.fds + 4, { what: `descriptors back to ${base.fds} (now ${fds(pid)})`, timeoutMs: 20_000 });
    // Still serving.
    expect((await postChat(h.url, CHAT)).status).toBe(200);
  });

  it('body flood: 100 clients each sending most of a body as fast as they can, then stalling, hold no more memory than the slots allow and are all closed', { timeout: 120_000 }, async () => {
    const bodyBytes = 4 * 1024 * 1024;
    const slots = 8;
    const h = await startHost({ body_bytes: bodyBytes, keyless_max_concurrency: slots, request_timeout_s: 5, headers_timeout_s: 1, body_idle_timeout_s: 1 });
    const pid = h.child.pid!;
    expect((await postChat(h.url, CHAT)).status).toBe(200);
    const base = { fds: fds(pid), rss: rssBytes(pid) };
    const s = sampler(pid);
    const head = Buffer.from(`POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${bodyBytes}\r\n\r\n`);
    const most = Buffer.concat([head, Buffer.alloc(bodyBytes - 1024, 0x20)]);
    const conns = await Promise.all(Array.from({ length: 100 }, () => open(h.url, most)));
    await Promise.all(conns.map((c) => c.closed));
    s.stop();
    // Each admitted body costs at most twice its size while it grows; the refused ones nothing.
    expect(s.peak.rss - base.rss).toBeLessThan(slots * 2 * bodyBytes + 64 * 1024 * 1024);
    expect(s.peak.fds).toBeLessThanOrEqual(base.fds + 100 + 8);
    const statuses = conns.map((c) => status(c.received()));
    expect(statuses.filter((x) => x >= 200 && x < 300)).toHaveLength(0);
    expect(statuses.filter((x) => x === 429).length).toBeGreaterThan(0);
    expect(h.engine.requests).toHaveLength(1);
    await waitFor(() => fds(pid) <= base.fds + 4, { what: `descriptors back to ${base.fds} (now ${fds(pid)})`, timeoutMs: 20_000 });
    expect((await postChat(h.url, CHAT)).status).toBe(200);
  });

  it('listing flood: 100 concurrent 1000-record pages of a store of large records stay within the page and /reef slot bounds', { timeout: 180_000 }, async () => {
    const pageBytes = 1024 * 1024;
    const reefSlots = 8;
    const h = await startHost({ page_bytes: pageBytes, reef_concurrency: reefSlots });
    const pid = h.child.pid!;
    // 40 records of ~500 KB each (unknown request fields are kept with the record): 20 MB of requests.
    const blob = 'z'.repeat(500_000);
    for (let i = 0; i < 40; i++) expect((await postChat(h.url, { ...CHAT, max_tokens: 4, reef_bench_blob: blob })).status).toBe(200);
    const base = { fds: fds(pid), rss: rssBytes(pid) };
    const s = sampler(pid);
    const pages = await Promise.all(
      Array.from({ length: 100 }, async () => {
        const res = await fetch(`${h.url}/reef/scenarios/default/records?limit=1000`);
        return { status: res.status, bytes: (await res.arrayBuffer()).byteLength };
      }),
    );
    s.stop();
    const served = pages.filter((p) => p.status === 200);
    expect(served.length).toBeGreaterThan(0);
    // Those past the key's /reef slots, if the pages overlapped enough, are 429; nothing else.
    expect(served.length + pages.filter((p) => p.status === 429).length).toBe(100);
    // A page ends once it passes page_bytes, so it holds at most one record beyond it.
    for (const p of served) expect(p.bytes).toBeLessThan(pageBytes + 2 * blob.length);
    // At most 8 pages in flight, each built and serialised whole: a few times 1.5 MB each. The whole
    // store listed by 100 requests at once would be 2 GB.
    expect(s.peak.rss - base.rss).toBeLessThan(reefSlots * 8 * (pageBytes + blob.length) + 64 * 1024 * 1024);
  });
});
