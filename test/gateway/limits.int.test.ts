import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, describe, expect, it } from 'vitest';
import { testKey } from '../helpers/api-keys.js';
import { waitFor } from '../helpers/wait.js';
import { startGateway } from '../../actors/gateway/index.js';
import { CHAT, openAIError, postChat, readSse, startStack, testConfig, type Stack } from './harness.js';

/**
 * reef.limits and the per-key limits, over real sockets: what is refused before its body is read,
 * and with which status, Retry-After and error body. Slowloris and body floods against a gateway
 * process, with descriptor and memory bounds, are in slowloris.int.test.ts.
 */

const KEY = testKey('limits-test');
const AUTH = { authorization: `Bearer ${KEY}` };

let s: Stack | null = null;
const sockets: Socket[] = [];
afterEach(async () => {
  for (const c of sockets.splice(0)) c.destroy();
  await s?.close();
  s = null;
});

/** A raw connection that has sent `head` (request line and headers) and whatever body it is given. */
function rawRequest(url: string, head: string, body = ''): Promise<{ socket: Socket; received: () => string; closed: Promise<void> }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect({ host: hostname, port: Number(port) });
    sockets.push(socket);
    let data = '';
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => (data += d));
    // A reset (the server closing with the unread body in its buffer) is a close too.
    socket.on('error', () => {});
    const closed = new Promise<void>((r) => socket.once('close', () => r()));
    socket.once('connect', () => {
      socket.write(head + body);
      resolve({ socket, received: () => data, closed });
    });
    socket.once('error', reject);
  });
}

const chatHead = (declared: number, headers: Record<string, string> = {}) =>
  `POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${declared}\r\n${Object.entries(headers)
    .map(([k, v]) => `${k}: ${v}\r\n`)
    .join('')}\r\n`;

function statusOf(raw: string): number {
  return Number(/^HTTP\/1\.1 (\d{3})/.exec(raw)?.[1] ?? 0);
}

describe('connections and timeouts', () => {
  it('an unauthenticated request whose body was never sent is answered 401 and its connection closed at once, not kept to drain the body', async () => {
    // request_timeout_s stays at 120 s, past this test's own timeout: only the close after the
    // 401 can end the connection in time.
    s = await startStack({ apiKeys: [{ key: KEY }] });
    const c = await rawRequest(s.url, chatHead(50_000_000));
    await c.closed;
    expect(statusOf(c.received())).toBe(401);
    expect(c.received().toLowerCase()).toContain('connection: close');
    openAIError(JSON.parse(c.received().slice(c.received().indexOf('\r\n\r\n') + 4)));
  });

  it('a body that stops arriving is cut after body_idle_timeout_s, and its slot comes back', async () => {
    s = await startStack({ apiKeys: [{ key: KEY, max_concurrency: 1 }], limits: { body_idle_timeout_s: 0.3 } });
    const c = await rawRequest(s.url, chatHead(1_000_000, AUTH), '{"model":"tiny","messages":[');
    await c.closed;
    // Nothing was answered: the body never came, and no handler ran.
    expect(statusOf(c.received())).not.toBe(200);
    expect(s.engine.requests).toHaveLength(0);
    const res = await postChat(s.url, CHAT, AUTH);
    expect(res.status).toBe(200);
  });

  it('a stream that outlives request_timeout_s and body_idle_timeout_s is not cut: they time the request, not its response', async () => {
    // 40 tokens 100 ms apart: the stream runs ~4 s, past the 1 s request timeout and Node's check
    // of it every 250 ms, and past the idle bound of a body.
    s = await startStack({ engine: { tokenDelayMs: 100, respond: () => ({ pieces: Array.from({ length: 40 }, (_, i) => ` t${i}`) }) }, limits: { request_timeout_s: 1, headers_timeout_s: 1, body_idle_timeout_s: 0.5 } });
    const res = await postChat(s.url, { ...CHAT, stream: true });
    expect(res.status).toBe(200);
    const events = await readSse(res);
    expect(events.at(-1)).toBe('[DONE]');
    expect(events.some((e) => e.includes('agent_record_id'))).toBe(true);
  });

  it('a non-streamed completion that sends nothing for longer than every timeout is not cut either', async () => {
    s = await startStack({ engine: { delayMs: () => 2500 }, limits: { request_timeout_s: 1, headers_timeout_s: 1, body_idle_timeout_s: 0.5 } });
    const res = await postChat(s.url, CHAT);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-reef-agent-record-id')).toBeTruthy();
  });

  it('a body trickled a byte at a time, never idle long enough for body_idle_timeout_s, is cut by request_timeout_s with a 408', async () => {
    s = await startStack({ limits: { request_timeout_s: 1, headers_timeout_s: 1, body_idle_timeout_s: 5 } });
    const c = await rawRequest(s.url, chatHead(1_000_000), '{');
    const drip = setInterval(() => c.socket.write(' '), 100);
    try {
      await c.closed;
    } finally {
      clearInterval(drip);
    }
    expect(statusOf(c.received())).toBe(408);
    expect(s.engine.requests).toHaveLength(0);
  });

  it('headers that never end are cut by headers_timeout_s with a 408', async () => {
    s = await startStack({ limits: { request_timeout_s: 1, headers_timeout_s: 0.5 } });
    const c = await rawRequest(s.url, 'POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ');
    await c.closed;
    expect(statusOf(c.received())).toBe(408);
  });

  it('past max_connections a new connection is closed as it is accepted', async () => {
    s = await startStack({ limits: { max_connections: 3 } });
    const held = await Promise.all([1, 2, 3].map(() => rawRequest(s!.url, 'GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n')));
    // Accepted connections are counted once the server has taken them.
    await waitFor(() => new Promise<boolean>((r) => s!.gw.app.server.getConnections((_e, n) => r(n === 3))), { what: 'three connections accepted' });
    const extra = await rawRequest(s.url, 'GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n');
    await extra.closed;
    expect(extra.received()).toBe('');
    // The held ones still work.
    held[0]!.socket.write('\r\n');
    await waitFor(() => statusOf(held[0]!.received()) === 200, { what: 'a held connection answered' });
  });
});

describe('per-key slots and bodies', () => {
  it('beyond max_concurrency a request is refused with 429 before its body is read, and its connection closed', async () => {
    s = await startStack({ apiKeys: [{ key: KEY, max_concurrency: 2 }] });
    // Two uploads that have sent part of their body hold the key's two slots.
    const uploads = await Promise.all([1, 2].map(() => rawRequest(s!.url, chatHead(10_000_000, AUTH), '{"model":"tiny",')));
    await waitFor(() => s!.gw.app.server.listenerCount('request') > 0, { what: 'server ready' });
    const third = await rawRequest(s.url, chatHead(10_000_000, AUTH));
    await third.closed;
    expect(statusOf(third.received())).toBe(429);
    expect(third.received().toLowerCase()).toMatch(/retry-after: 1\r\n/);
    expect(third.received().toLowerCase()).toContain('connection: close');
    expect(openAIError(JSON.parse(third.received().slice(third.received().indexOf('\r\n\r\n') + 4))).code).toBe('REEF_ERR_RATE_LIMITED');
    // The two uploads are still waiting for their bodies, unanswered.
    for (const u of uploads) expect(u.received()).toBe('');
    // Clients that leave give their slots back, though no handler ever ran for them.
    for (const u of uploads) u.socket.destroy();
    await waitFor(async () => (await postChat(s!.url, CHAT, AUTH)).status === 200, { what: 'the slots given back' });
    expect(s.engine.requests.length).toBeGreaterThan(0);
  });

  it('a body declared past body_bytes is 413 before it is read, naming the key', async () => {
    s = await startStack({ limits: { body_bytes: 1000 } });
    const c = await rawRequest(s.url, chatHead(2000));
    await c.closed;
    expect(statusOf(c.received())).toBe(413);
    expect(c.received()).toContain('reef.limits.body_bytes');
  });
});

describe('rate limits', () => {
  it('requests_per_minute: the request after N is 429 with Retry-After and an OpenAI error naming the key', async () => {
    s = await startStack({ apiKeys: [{ key: KEY, requests_per_minute: 3 }, { key: `${KEY}-other` }] });
    const get = (key = KEY) => fetch(`${s!.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
    // /reef routes count too.
    expect((await fetch(`${s.url}/reef/status`, { headers: AUTH })).status).toBe(200);
    expect((await get()).status).toBe(200);
    expect((await postChat(s.url, CHAT, AUTH)).status).toBe(200);
    const refused = await get();
    expect(refused.status).toBe(429);
    // One request a 20 s at 3 a minute.
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(Number(refused.headers.get('retry-after'))).toBeLessThanOrEqual(20);
    const e = openAIError(await refused.json());
    expect(e.code).toBe('REEF_ERR_RATE_LIMIT');
    expect(e.type).toBe('rate_limit_error');
    expect(e.message).toContain('reef.api_keys[0].requests_per_minute');
    // Another key has its own bucket.
    expect((await get(`${KEY}-other`)).status).toBe(200);
  });

  it('tokens_per_minute charges prompt plus completion budget; past it 429, and a request that can never fit is 400', async () => {
    s = await startStack({ apiKeys: [{ key: KEY, tokens_per_minute: 200 }] });
    const tooBig = await postChat(s.url, { ...CHAT, max_tokens: 500 }, AUTH);
    expect(tooBig.status).toBe(400);
    expect(openAIError(await tooBig.json()).param).toBe('max_tokens');
    // ~10 prompt tokens + 120: one fits in 200, a second does not.
    expect((await postChat(s.url, { ...CHAT, max_tokens: 120 }, AUTH)).status).toBe(200);
    const refused = await postChat(s.url, { ...CHAT, max_tokens: 120 }, AUTH);
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const e = openAIError(await refused.json());
    expect(e.code).toBe('REEF_ERR_RATE_LIMIT');
    expect(e.message).toContain('reef.api_keys[0].tokens_per_minute');
    // The refused one never reached the engine.
    expect(s.engine.requests).toHaveLength(1);
  });

  it('keyless mode takes its limits from reef.limits.keyless_*', async () => {
    s = await startStack({ limits: { keyless_requests_per_minute: 1 } });
    expect((await fetch(`${s.url}/v1/models`)).status).toBe(200);
    const refused = await fetch(`${s.url}/v1/models`);
    expect(refused.status).toBe(429);
    expect(openAIError(await refused.json()).message).toContain('reef.limits.keyless_requests_per_minute');
  });
});

describe('/reef limits and the scenario cap', () => {
  it('a /reef body past reef_body_bytes is 413 naming the key, while a chat body of that size is fine', async () => {
    s = await startStack({ limits: { reef_body_bytes: 4096 } });
    const big = { score: 1, feedback: 'x'.repeat(8000) };
    const res = await fetch(`${s.url}/reef/report`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(big) });
    expect(res.status).toBe(413);
    expect(openAIError(await res.json()).message).toContain('reef.limits.reef_body_bytes');
    const chat = await postChat(s.url, { ...CHAT, max_tokens: 8, messages: [{ role: 'user', content: 'hello '.repeat(1000) }] });
    const text = await chat.text();
    expect(chat.status, text).toBe(200);
  });

  it('/reef requests in flight past reef_concurrency are 429', async () => {
    s = await startStack({ limits: { reef_concurrency: 1 } });
    // A report whose body is still coming holds the one /reef slot.
    const held = await rawRequest(s.url, 'POST /reef/report HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n', '{"score":');
    await waitFor(() => s!.gw.app.server.listenerCount('request') > 0, { what: 'server ready' });
    let res: Response | null = null;
    await waitFor(async () => (res = await fetch(`${s!.url}/reef/status`)).status === 429, { what: '/reef/status refused while the slot is held' });
    expect(openAIError(await res!.json()).message).toContain('reef.limits.reef_concurrency');
    // Chat completions do not share those slots.
    expect((await postChat(s.url, CHAT)).status).toBe(200);
    held.socket.destroy();
    await waitFor(async () => (await fetch(`${s!.url}/reef/status`)).status === 200, { what: 'the /reef slot given back' });
  });

  it('past max_scenarios a new scenario is refused with 403 naming the cap and the key; known ones still work', async () => {
    s = await startStack({ limits: { max_scenarios: 3 } });
    const chat = (scenario: string) => postChat(s!.url, CHAT, { 'x-reef-scenario': scenario });
    const existing = ((await (await fetch(`${s.url}/reef/scenarios`)).json()) as { data: unknown[] }).data.length;
    const names = Array.from({ length: 3 - existing }, (_, i) => `cap-${i}`);
    for (const n of names) expect((await chat(n)).status).toBe(200);
    const refused = await chat('one-too-many');
    expect(refused.status).toBe(403);
    const e = openAIError(await refused.json());
    expect(e.code).toBe('REEF_ERR_SCENARIO_LIMIT');
    expect(e.message).toContain('reef.limits.max_scenarios');
    expect(e.message).toContain('(3)');
    expect(e.param).toBe('x-reef-scenario');
    const created = await fetch(`${s.url}/reef/scenarios`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: 'another-one' }) });
    expect(created.status).toBe(403);
    expect(openAIError(await created.json()).code).toBe('REEF_ERR_SCENARIO_LIMIT');
    if (names.length > 0) expect((await chat(names[0]!)).status).toBe(200);
    // Refused scenarios add no metric series: /metrics names no more scenarios than the cap.
    const labelled = async () => new Set([...(await (await fetch(`${s!.url}/metrics`)).text()).matchAll(/scenario="([^"]*)"/g)].map((m) => m[1]));
    const before = await labelled();
    for (let i = 0; i < 20; i++) expect((await chat(`flood-${i}`)).status).toBe(403);
    expect(await labelled()).toEqual(before);
    expect(before.size).toBeLessThanOrEqual(3);
    expect(((await (await fetch(`${s.url}/reef/scenarios`)).json()) as { data: unknown[] }).data.length).toBeLessThanOrEqual(3);
  });

  it('a scenario cap counts the scenarios already in the store when the gateway starts', async () => {
    s = await startStack();
    expect((await postChat(s.url, CHAT, { 'x-reef-scenario': 'from-before' })).status).toBe(200);
    const before = ((await (await fetch(`${s.url}/reef/scenarios`)).json()) as { data: unknown[] }).data.length;
    await s.gw.close();
    // The same store, under a cap it already fills.
    const again = await startGateway({ config: await testConfig(s.dataDir, [], { max_scenarios: before }), engineUrl: s.engine.url, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: 1 });
    try {
      expect((await postChat(again.url, CHAT, { 'x-reef-scenario': 'from-before' })).status).toBe(200);
      const refused = await postChat(again.url, CHAT, { 'x-reef-scenario': 'after-restart' });
      expect(refused.status).toBe(403);
      expect(openAIError(await refused.json()).message).toContain(`already has ${before} scenarios`);
    } finally {
      await again.close();
    }
  });
});

describe('disk full', () => {
  it('below min_free_disk_mb a completion is 503 with Retry-After before the engine generates', async () => {
    // More free space than any disk has: the check always finds too little.
    s = await startStack({ limits: { min_free_disk_mb: 1e12 } });
    const res = await postChat(s.url, CHAT);
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBe('30');
    const e = openAIError(await res.json());
    expect(e.code).toBe('REEF_ERR_DISK_FULL');
    expect(e.type).toBe('service_unavailable');
    expect(e.message).toContain('reef.limits.min_free_disk_mb');
    expect(s.engine.requests).toHaveLength(0);
    const report = await fetch(`${s.url}/reef/report`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ score: 1 }) });
    expect(report.status).toBe(503);
    // Reads still work.
    expect((await fetch(`${s.url}/reef/status`)).status).toBe(200);
  });

  it('min_free_disk_mb 0 never refuses', async () => {
    s = await startStack({ limits: { min_free_disk_mb: 0 } });
    expect((await postChat(s.url, CHAT)).status).toBe(200);
  });
});

describe('record store locked by another process', () => {
  it('past store_lock_wait_ms a completion is 503 with Retry-After and nothing is recorded; streams meanwhile get no receipt; the lock gone, all is served again', async () => {
    s = await startStack({ limits: { store_lock_wait_ms: 100 } });
    // The judge or the trainer-controller, in the middle of a commit that outlasts the budget.
    const holder = new Database(join(s.dataDir, 'records.sqlite'));
    holder.exec('BEGIN IMMEDIATE');
    try {
      const res = await postChat(s.url, CHAT);
      expect(res.status).toBe(503);
      expect(res.headers.get('retry-after')).toBe('1');
      const e = openAIError(await res.json());
      expect(e.code).toBe('REEF_ERR_STORE_BUSY');
      expect(e.type).toBe('service_unavailable');
      expect(e.message).toMatch(/the append of record \w+ waited \d+ ms \(reef\.limits\.store_lock_wait_ms\) for its write lock/);
      // A stream has sent its 200: it ends with the error event, without a receipt.
      const events = await readSse(await postChat(s.url, { ...CHAT, stream: true }));
      expect(events.some((d) => d.includes('agent_record_id'))).toBe(false);
      expect(openAIError(JSON.parse(events.find((d) => d.includes('"error"'))!)).code).toBe('REEF_ERR_STORE_BUSY');
      const report = await fetch(`${s.url}/reef/report`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ score: 1 }) });
      expect(report.status).toBe(503);
      expect(report.headers.get('retry-after')).toBe('1');
      expect(openAIError(await report.json()).code).toBe('REEF_ERR_STORE_BUSY');
    } finally {
      holder.exec('ROLLBACK');
      holder.close();
    }
    expect(await s.gw.store.headOffset()).toBe(0);
    const ok = await postChat(s.url, CHAT);
    expect(ok.status).toBe(200);
    expect(await s.gw.store.headOffset()).toBe(1);
  });
});
