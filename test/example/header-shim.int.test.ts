import { spawn } from 'node:child_process';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { Client } from 'undici';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ensureDist } from './gateway-fixture.js';
import { forwards, parseSessionRule, startHeaderShim, type HeaderShim, type HeaderShimOptions } from '../../recipes/openclawrl/harness/header-shim.js';

/**
 * The header shim between the `openai` client and a recorder standing in for the gateway: the
 * recorder keeps every request's headers and body and answers with a fixed completion or SSE stream.
 */

interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}

const COMPLETION = { id: 'c1', object: 'chat.completion', created: 1, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'Four.' }, finish_reason: 'stop', logprobs: null }], usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } };
const chunk = (content: string, finish: string | null = null) => ({ id: 'c2', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: finish }] });
const EVENTS = [chunk('Two'), chunk(' plus'), chunk(' two.', 'stop')].map((c) => `data: ${JSON.stringify(c)}\n\n`);
const SSE = `${EVENTS.join('')}data: [DONE]\n\n`;

let recorder: Server;
let upstream: string;
const seen: Seen[] = [];
/** When set, the recorder holds the stream after its first event until this resolves. */
let hold: Promise<void> | null = null;

beforeAll(async () => {
  recorder = createServer(async (req, res) => {
    let body = '';
    for await (const c of req) body += String(c);
    seen.push({ method: req.method!, url: req.url!, headers: req.headers, body });
    if (req.url?.endsWith('/models')) return res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ object: 'list', data: [{ id: 'm', object: 'model', created: 0, owned_by: 'x' }] }));
    const stream = body !== '' && (JSON.parse(body) as { stream?: boolean }).stream === true;
    if (!stream) return res.writeHead(200, { 'content-type': 'application/json', 'x-reef-agent-record-id': 'rec-1' }).end(JSON.stringify(COMPLETION));
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    res.write(EVENTS[0]);
    if (hold) await hold;
    for (const e of EVENTS.slice(1)) res.write(e);
    res.end('data: [DONE]\n\n');
  });
  await new Promise<void>((r) => recorder.listen(0, '127.0.0.1', r));
  upstream = `http://127.0.0.1:${(recorder.address() as AddressInfo).port}`;
});

afterAll(async () => {
  recorder.closeAllConnections();
  await new Promise<void>((r) => recorder.close(() => r()));
});

const shims: HeaderShim[] = [];
async function shim(opts: Omit<HeaderShimOptions, 'upstream'>): Promise<HeaderShim> {
  const s = await startHeaderShim({ upstream, ...opts });
  shims.push(s);
  return s;
}
afterEach(async () => {
  await Promise.all(shims.splice(0).map((s) => s.close()));
  seen.length = 0;
  hold = null;
});

const REQUEST = { model: 'm', messages: [{ role: 'user' as const, content: 'What is 2 + 2?' }], temperature: 0.5 };

describe('header shim', () => {
  it('adds scenario, session and key to a plain completion; passes body and reply through', async () => {
    const s = await shim({ scenario: 'homework', session: { mode: 'fixed', value: 'homework-s1' }, apiKey: 'reef-key' });
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'client-key', maxRetries: 0 });
    const { data, response } = await client.chat.completions.create(REQUEST).withResponse();
    expect(data).toEqual(COMPLETION);
    expect(response.headers.get('x-reef-agent-record-id')).toBe('rec-1');
    expect(seen).toHaveLength(1);
    expect(seen[0]!.url).toBe('/v1/chat/completions');
    expect(seen[0]!.headers).toMatchObject({ 'x-reef-scenario': 'homework', 'x-reef-tag-session': 'homework-s1', authorization: 'Bearer client-key' });
    expect(JSON.parse(seen[0]!.body)).toEqual(REQUEST);
  });

  it('passes an SSE stream through unchanged and unbuffered', async () => {
    const s = await shim({ scenario: 'homework', session: { mode: 'fixed', value: 'homework-s2' } });
    let release!: () => void;
    hold = new Promise<void>((r) => (release = r));
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'k', maxRetries: 0 });
    const stream = await client.chat.completions.create({ ...REQUEST, stream: true });
    const got: string[] = [];
    for await (const c of stream) {
      got.push(c.choices[0]!.delta.content ?? '');
      // The recorder sends the rest only after the first event reached the client through the shim.
      if (got.length === 1) release();
    }
    expect(got).toEqual(['Two', ' plus', ' two.']);
    expect(seen[0]!.headers).toMatchObject({ 'x-reef-scenario': 'homework', 'x-reef-tag-session': 'homework-s2' });
    expect(JSON.parse(seen[0]!.body)).toEqual({ ...REQUEST, stream: true });

    const raw = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...REQUEST, stream: true }) });
    expect(raw.headers.get('content-type')).toBe('text/event-stream');
    expect(await raw.text()).toBe(SSE);
  });

  it('replaces the client Authorization only when configured, and adds it when absent', async () => {
    const keep = await shim({ apiKey: 'reef-key' });
    const replace = await shim({ apiKey: 'reef-key', replaceAuthorization: true });
    const none = await shim({});
    for (const s of [keep, replace, none]) await new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'client-key', maxRetries: 0 }).chat.completions.create(REQUEST);
    await fetch(`${keep.url}/v1/models`);
    expect(seen.map((x) => x.headers.authorization)).toEqual(['Bearer client-key', 'Bearer reef-key', 'Bearer client-key', 'Bearer reef-key']);
    expect(seen[3]!.method).toBe('GET');
    expect(seen.every((x) => x.headers['x-reef-tag-session'] === undefined && x.headers['x-reef-scenario'] === undefined)).toBe(true);
  });

  it('changes the fixed tag at run time and keeps a tag the client set', async () => {
    const s = await shim({ session: { mode: 'fixed', value: 'hw-s1' } });
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create(REQUEST);
    s.setSession('hw-s2');
    await client.chat.completions.create(REQUEST);
    const put = await fetch(`${s.url}/_reef_shim/session`, { method: 'PUT', body: 'hw-s3' });
    expect(await put.json()).toEqual({ session: 'hw-s3' });
    await client.chat.completions.create(REQUEST);
    await client.chat.completions.create(REQUEST, { headers: { 'x-reef-tag-session': 'mine' } });
    expect(seen.map((x) => x.headers['x-reef-tag-session'])).toEqual(['hw-s1', 'hw-s2', 'hw-s3', 'mine']);
  });

  it.each(['a\nb', '', 'caf\u00e9'])('refuses the fixed tag %j with a 400 and keeps the one it had', async (value) => {
    const s = await shim({ session: { mode: 'fixed', value: 'hw-s1' } });
    expect(() => s.setSession(value)).toThrow(/expected printable ASCII/);
    const put = await fetch(`${s.url}/_reef_shim/session`, { method: 'PUT', body: value });
    expect(put.status).toBe(400);
    expect(await put.json()).toMatchObject({ error: { code: 'REEF_ERR_INVALID_ARGUMENT' } });
    // Regression: a tag with a newline was taken, and every later request failed as a down gateway.
    const res = await fetch(`${s.url}/v1/models`);
    expect(res.status).toBe(200);
    expect(seen.map((x) => x.headers['x-reef-tag-session'])).toEqual(['hw-s1']);
  });

  it('tags per connection', async () => {
    const s = await shim({ session: { mode: 'per-connection', prefix: 'hermes' } });
    const a = new Client(s.url);
    const b = new Client(s.url);
    try {
      for (const c of [a, a, b]) {
        const r = await c.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body: JSON.stringify(REQUEST) });
        await r.body.text();
      }
    } finally {
      await a.close();
      await b.close();
    }
    expect(seen.map((x) => x.headers['x-reef-tag-session'])).toEqual(['hermes-c1', 'hermes-c1', 'hermes-c2']);
  });

  it('takes the tag from the base URL path and strips it', async () => {
    const s = await shim({ session: { mode: 'path' }, scenario: 'homework' });
    const client = new OpenAI({ baseURL: `${s.url}/t/homework-s7/v1`, apiKey: 'k', maxRetries: 0 });
    await client.chat.completions.create(REQUEST);
    await fetch(`${s.url}/v1/models`);
    expect(seen.map((x) => [x.url, x.headers['x-reef-tag-session']])).toEqual([['/v1/chat/completions', 'homework-s7'], ['/v1/models', undefined]]);
  });

  it.each(['%E0%A4%A', 'a%0D%0Ax-injected:%201', '%20'])('answers 400 for the path tag %j, forwarding nothing', async (tag) => {
    const s = await shim({ session: { mode: 'path' } });
    // Regression: a bad %-escape was a 500; a CR/LF tag failed in the proxy's request and was
    // answered as the gateway being down (503), which an agent retries.
    const res = await fetch(`${s.url}/t/${tag}/v1/models`);
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ error: { code: 'REEF_ERR_INVALID_ARGUMENT', type: 'invalid_request_error' } });
    expect(seen).toEqual([]);
  });

  it('refuses a scenario or key that cannot go out in a header, without showing the key', async () => {
    await expect(startHeaderShim({ upstream, scenario: 'home\nwork' })).rejects.toThrow(/scenario "home\\nwork": expected printable ASCII/);
    const err = await startHeaderShim({ upstream, apiKey: 'sk-secret\n' }).catch((e: Error) => e);
    expect((err as Error).message).toMatch(/API key is not printable ASCII/);
    expect((err as Error).message).not.toContain('sk-secret');
  });

  it('answers 503 with an OpenAI error body when the gateway is down', async () => {
    const s = await startHeaderShim({ upstream: 'http://127.0.0.1:1' });
    shims.push(s);
    const res = await fetch(`${s.url}/v1/models`);
    expect(res.status).toBe(503);
    expect(await res.json()).toMatchObject({ error: { code: 'REEF_ERR_ENGINE_DOWN', type: 'service_unavailable' } });
  });

  // Security review H4: the shim adds the gateway key to whatever reaches it, which opened a keyed
  // gateway's Reef API (records, rollback) to any local process or web page on the shim's port.
  it('forwards only /v1/*, with its key: the Reef API and anything else is a 404 that reaches nothing', async () => {
    const s = await shim({ apiKey: 'reef-key', session: { mode: 'path' } });
    const c = new Client(s.url);
    try {
      for (const [method, path] of [
        ['GET', '/reef/scenarios/default/records'], ['POST', '/reef/scenarios/default/releases/rollback'], ['POST', '/reef/report'], ['GET', '/metrics'], ['GET', '/'],
        ['GET', '/v1/../reef/scenarios'], ['GET', '/v1/%2e%2e/reef/scenarios'], ['GET', '//v1/models'], ['GET', '/v1x/models'], ['GET', '/t/s1/reef/scenarios'], ['GET', '/t/s1/v1/../reef/status'],
      ] as const) {
        const r = await c.request({ method, path, headers: { 'content-type': 'application/json' }, ...(method === 'POST' ? { body: '{}' } : {}) });
        expect(r.statusCode, `${method} ${path}`).toBe(404);
        expect(await r.body.json(), path).toMatchObject({ error: { code: 'REEF_ERR_NOT_FOUND', type: 'not_found_error' } });
      }
      expect(seen).toEqual([]);
      await (await c.request({ method: 'GET', path: '/t/s1/v1/models?x=1' })).body.text();
      await (await c.request({ method: 'GET', path: '/v1/models' })).body.text();
    } finally {
      await c.close();
    }
    expect(seen.map((x) => [x.url, x.headers.authorization])).toEqual([['/v1/models?x=1', 'Bearer reef-key'], ['/v1/models', 'Bearer reef-key']]);
  });

  it('refuses a browser as a keyless gateway does: another Host (DNS rebinding), another Origin, Origin null, cross-site', async () => {
    const s = await shim({ apiKey: 'reef-key', session: { mode: 'fixed', value: 'hw-s1' } });
    const port = new URL(s.url).port;
    const c = new Client(s.url);
    const ask = async (headers: Record<string, string>, method: 'GET' | 'PUT' = 'GET', path = '/v1/models') => {
      const r = await c.request({ method, path, headers, ...(method === 'PUT' ? { body: 'hw-evil' } : {}) });
      const body = (await r.body.json()) as { error?: { code: string; message: string } };
      return [r.statusCode, body.error?.code ?? 'ok'];
    };
    try {
      expect(await ask({ host: `evil.example:${port}` })).toEqual([421, 'REEF_ERR_HOST_NOT_ALLOWED']);
      expect(await ask({ host: `evil.example:${port}` }, 'PUT', '/_reef_shim/session')).toEqual([421, 'REEF_ERR_HOST_NOT_ALLOWED']);
      expect(await ask({ origin: 'https://evil.example' })).toEqual([403, 'REEF_ERR_ORIGIN_NOT_ALLOWED']);
      expect(await ask({ origin: 'null' }, 'PUT', '/_reef_shim/session')).toEqual([403, 'REEF_ERR_ORIGIN_NOT_ALLOWED']);
      expect(await ask({ 'sec-fetch-site': 'cross-site' })).toEqual([403, 'REEF_ERR_ORIGIN_NOT_ALLOWED']);
      expect(seen).toEqual([]);
      // Its own origin, and a client that sends no Origin, are served.
      expect(await ask({ host: `localhost:${port}`, origin: `http://localhost:${port}`, 'sec-fetch-site': 'same-origin' })).toEqual([200, 'ok']);
      expect(await ask({})).toEqual([200, 'ok']);
    } finally {
      await c.close();
    }
    expect(seen).toHaveLength(2);
  });

  it('takes the names and origins it is told to, and says how in a refusal', async () => {
    const s = await shim({ allowedHosts: ['agent-box'], allowedOrigins: ['http://localhost:3000'] });
    const c = new Client(s.url);
    try {
      const ok = await c.request({ method: 'GET', path: '/v1/models', headers: { host: 'agent-box:8700', origin: 'http://localhost:3000', 'sec-fetch-site': 'cross-site' } });
      expect(ok.statusCode).toBe(200);
      await ok.body.text();
      const host = await c.request({ method: 'GET', path: '/v1/models', headers: { host: 'other-box' } });
      expect(((await host.body.json()) as { error: { message: string } }).error.message).toMatch(/--allow-host/);
      const origin = await c.request({ method: 'GET', path: '/v1/models', headers: { origin: 'http://localhost:3001' } });
      expect(((await origin.body.json()) as { error: { message: string } }).error.message).toMatch(/--allow-origin/);
    } finally {
      await c.close();
    }
  });

  it.each([
    ['/v1/chat/completions', true], ['/v1/models?limit=1', true], ['/v1', true],
    ['/reef/report', false], ['/v1/../reef/report', false], ['/v1/./models', false], ['/v1/%2E%2E/reef', false], ['/v10', false], ['v1/models', false],
  ])('forwards(%j) is %s', (path, want) => {
    expect(forwards(path)).toBe(want);
  });

  it.each([
    ['none', { mode: 'none' }],
    ['path', { mode: 'path' }],
    ['per-connection', { mode: 'per-connection', prefix: 'conn' }],
    ['per-connection:hermes', { mode: 'per-connection', prefix: 'hermes' }],
    ['fixed:hw-s1', { mode: 'fixed', value: 'hw-s1' }],
  ])('parses --session %s', (spec, rule) => {
    expect(parseSessionRule(spec)).toEqual(rule);
  });

  it.each(['fixed:', 'sometimes', '', 'fixed:a\nb', 'fixed: ', 'per-connection:h\u00e9'])('rejects --session %j', (spec) => {
    expect(() => parseSessionRule(spec)).toThrow(/expected none, path/);
  });
});

describe('header shim process', () => {
  it('starts from dist, says where it listens, forwards, and stops on SIGTERM', async () => {
    const main = ensureDist('recipes/openclawrl/harness/header-shim-main');
    const child = spawn(process.execPath, [main, '--upstream', upstream, '--port', '0', '--scenario', 'homework', '--session', 'fixed:hw-s9', '--api-key-env', 'SHIM_TEST_KEY'], { env: { ...process.env, SHIM_TEST_KEY: 'from-env' }, stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const ready = await new Promise<{ url: string }>((resolve, reject) => {
        let out = '';
        child.stdout.on('data', (d: Buffer) => {
          out += d.toString();
          if (out.includes('\n')) resolve(JSON.parse(out.split('\n')[0]!) as { url: string });
        });
        child.once('exit', (code) => reject(new Error(`shim exited ${code}`)));
      });
      await fetch(`${ready.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(REQUEST) }).then((r) => r.json());
      expect(seen[0]!.headers).toMatchObject({ 'x-reef-scenario': 'homework', 'x-reef-tag-session': 'hw-s9', authorization: 'Bearer from-env' });
    } finally {
      const exited = new Promise<number | null>((r) => child.once('exit', r));
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
    }
  });

  it('exits 2, pointing at --help, on an option it does not know', async () => {
    const main = ensureDist('recipes/openclawrl/harness/header-shim-main');
    const child = spawn(process.execPath, [main, '--upstream', upstream, '--prot', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    expect(await new Promise<number | null>((r) => child.once('exit', r))).toBe(2);
    expect(err).toMatch(/--prot/);
    expect(err).toMatch(/see --help/);
  });
});
