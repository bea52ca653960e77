import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { keyIdOf } from '../../actors/gateway/auth.js';
import { startGateway } from '../../actors/gateway/index.js';
import { startFakeEngine } from '../helpers/fake-engine.js';
import { Correlator } from '../../actors/judge/correlate/index.js';
import { testKey } from '../helpers/api-keys.js';
import { waitFor } from '../helpers/wait.js';
import { CHAT, openAIError, postChat, readSse, startStack, testConfig, type Stack } from './harness.js';

/**
 * API keys: every route but /healthz needs one; keys may be limited to scenarios (others are
 * invisible to them) and to a number of concurrent requests. That a non-loopback bind without keys
 * is refused is checked by the config tests (cluster/config/config.test.ts).
 */

const ADMIN = testKey('admin');
const ALPHA = testKey('alpha-only');
const ONE = testKey('one-at-a-time');
const FROM_ENV = testKey('from-environment');

describe('gateway auth', () => {
  let s: Stack;
  let betaRecord = '';
  const rollbacks: string[] = [];

  beforeAll(async () => {
    process.env.REEF_TEST_GATEWAY_KEY = FROM_ENV;
    s = await startStack({
      engine: { respond: () => ({ pieces: Array.from({ length: 30 }, (_, i) => ` p${i}`) }) },
      apiKeys: [
        { key: ADMIN },
        { key: ALPHA, scenarios: ['alpha'] },
        { key: ONE, max_concurrency: 1 },
        { key_env: 'REEF_TEST_GATEWAY_KEY', scenarios: ['beta'] },
      ],
      // Dozens of wrong keys go out from this one address, each to see its 401, followed by right
      // ones: the bound on failures (auth-throttle.int.test.ts) would refuse those.
      limits: { auth_failures_per_minute: null },
      // The trainer-controller's side: what reaches it is who asked, which it keeps on the release.
      rollback: async (_scenario, releaseId, keyId) => {
        rollbacks.push(keyId);
        return { release: { id: `release-${rollbacks.length}`, rollbackOf: releaseId ?? 'previous', keyId } };
      },
    });
    const res = await postChat(s.url, CHAT, { authorization: `Bearer ${ADMIN}`, 'x-reef-scenario': 'beta' });
    expect(res.status).toBe(200);
    betaRecord = res.headers.get('x-reef-agent-record-id')!;
  });
  afterAll(async () => {
    delete process.env.REEF_TEST_GATEWAY_KEY;
    await s?.close();
  });

  const routes: Array<[string, string]> = [
    ['GET', '/v1/models'],
    ['POST', '/v1/chat/completions'],
    ['GET', '/metrics'],
    ['GET', '/reef/status'],
    ['GET', '/reef/scenarios'],
    ['POST', '/reef/scenarios'],
    ['POST', '/reef/report'],
    ['GET', '/reef/scenarios/beta/records'],
    ['GET', '/reef/scenarios/beta/records/x'],
    ['GET', '/reef/scenarios/beta/reports'],
    ['GET', '/reef/scenarios/beta/judged'],
    ['GET', '/reef/scenarios/beta/curves'],
    ['GET', '/reef/key'],
    ['POST', '/reef/ui'],
    ['GET', '/no/such/route'],
    ['HEAD', '/metrics'],
    ['HEAD', '/reef/status'],
    ['OPTIONS', '/v1/chat/completions'],
    ['OPTIONS', '/healthz'],
    ['POST', '/healthz'],
  ];

  it('a missing or wrong key is 401 on every route but /healthz and the live page\'s own files', async () => {
    for (const [method, path] of routes) {
      for (const headers of [{}, { authorization: 'Bearer wrong' }, { 'x-api-key': 'wrong' }, { authorization: `Basic ${ADMIN}` }] as Array<Record<string, string>>) {
        const res = await fetch(`${s.url}${path}`, { method, headers: { 'content-type': 'application/json', ...headers }, ...(method === 'POST' ? { body: JSON.stringify(CHAT) } : {}) });
        expect(res.status, `${method} ${path} ${JSON.stringify(headers)}`).toBe(401);
        expect(res.headers.get('www-authenticate')).toBe('Bearer');
        if (method !== 'HEAD') expect(openAIError(await res.json()).type).toBe('authentication_error');
      }
    }
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    expect((await fetch(`${s.url}/healthz`, { method: 'HEAD' })).status).toBe(200);
    // Code only, no data: the page loads so that it can ask for the key its data calls need.
    for (const path of ['/reef/ui', '/reef/ui/app.js', '/reef/ui/app.css']) expect((await fetch(`${s.url}${path}`)).status, path).toBe(200);
  });

  it('/healthz with a query string still needs no key (regression: auth compared the raw URL)', async () => {
    const res = await fetch(`${s.url}/healthz?probe=1`);
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true });
  });

  it('Bearer and x-api-key both work, and so does a key from the environment', async () => {
    expect((await postChat(s.url, CHAT, { authorization: `Bearer ${ADMIN}` })).status).toBe(200);
    expect((await postChat(s.url, CHAT, { 'x-api-key': ADMIN })).status).toBe(200);
    expect((await postChat(s.url, CHAT, { authorization: `bearer  ${ADMIN} ` })).status).toBe(200);
    expect((await postChat(s.url, CHAT, { 'x-api-key': FROM_ENV, 'x-reef-scenario': 'beta' })).status).toBe(200);
    expect((await postChat(s.url, CHAT, { authorization: `Bearer ${ADMIN}`, 'x-api-key': ADMIN })).status).toBe(200);
  });

  it('with both headers the Bearer key is used, and a wrong one is a 401 that says so', async () => {
    const limited = await fetch(`${s.url}/reef/scenarios`, { headers: { authorization: `Bearer ${ALPHA}`, 'x-api-key': ADMIN } });
    expect(((await limited.json()) as { data: Array<{ name: string }> }).data.map((x) => x.name)).not.toContain('beta');
    const res = await fetch(`${s.url}/reef/scenarios`, { headers: { authorization: 'Bearer wrong', 'x-api-key': ADMIN } });
    expect(res.status).toBe(401);
    expect(openAIError(await res.json()).message).toMatch(/in Authorization: Bearer, which is used rather than the x-api-key/);
  });

  it('each record says which key made it (its id, never the key), in the record and in the listing', async () => {
    const alpha = await postChat(s.url, CHAT, { authorization: `Bearer ${ALPHA}`, 'x-reef-scenario': 'alpha' });
    expect(alpha.status).toBe(200);
    const alphaRecord = alpha.headers.get('x-reef-agent-record-id')!;
    const get = async (path: string) => (await fetch(`${s.url}${path}`, { headers: { authorization: `Bearer ${ADMIN}` } })).json() as Promise<Record<string, unknown>>;
    expect(keyIdOf(ADMIN)).not.toBe(keyIdOf(ALPHA));
    expect((await get(`/reef/scenarios/beta/records/${betaRecord}`)).keyId).toBe(keyIdOf(ADMIN));
    expect((await get(`/reef/scenarios/alpha/records/${alphaRecord}`)).keyId).toBe(keyIdOf(ALPHA));
    const listed = (await get('/reef/scenarios/alpha/records')).data as Array<{ id: string; keyId: string }>;
    expect(listed.find((r) => r.id === alphaRecord)?.keyId).toBe(keyIdOf(ALPHA));
    expect(JSON.stringify(await get(`/reef/scenarios/alpha/records/${alphaRecord}`))).not.toContain(ALPHA);
  });

  it('a session tag is bound to its key: another key sending the same tag, transcript and all, does not become the turn\'s next state', async () => {
    const tag = { 'x-reef-tag-session': 'shared-tag', 'x-reef-scenario': 'tags' };
    const first = [{ role: 'user', content: 'Draft my letter' }];
    const a1 = await postChat(s.url, { ...CHAT, messages: first }, { authorization: `Bearer ${ADMIN}`, ...tag });
    const a1Id = a1.headers.get('x-reef-agent-record-id')!;
    const reply = (await s.gw.store.get(a1Id))!.response as { content: string };
    const after = (text: string) => ({ ...CHAT, messages: [...first, { role: 'assistant', content: reply.content }, { role: 'user', content: text }] });
    const b = await postChat(s.url, after('Perfect, well done'), { authorization: `Bearer ${ONE}`, ...tag });
    const a2 = await postChat(s.url, after('Too formal, redo it'), { authorization: `Bearer ${ADMIN}`, ...tag });
    expect([a1.status, b.status, a2.status]).toEqual([200, 200, 200]);
    const a2Id = a2.headers.get('x-reef-agent-record-id')!;

    // The judge's correlation over what the gateway stored.
    const c = new Correlator();
    const finished = (await s.gw.store.readFrom(0, 1000)).filter((r) => r.scenario === 'tags').flatMap((r) => c.observe(r)).filter((e) => e.kind === 'turn-finished');
    expect(finished.map((e) => e.kind === 'turn-finished' && [e.turnRecordId, e.nextStateRecordId, e.nextState.content])).toEqual([[a1Id, a2Id, 'Too formal, redo it']]);
  });

  it('a report and a rollback say which key asked: A\'s id for A\'s, never B\'s', async () => {
    const alpha = await postChat(s.url, CHAT, { authorization: `Bearer ${ALPHA}`, 'x-reef-scenario': 'alpha' });
    const ref = alpha.headers.get('x-reef-agent-record-id')!;
    const post = (key: string, path: string, body: unknown) =>
      fetch(`${s.url}${path}`, { method: 'POST', headers: { 'x-api-key': key, 'content-type': 'application/json', 'x-reef-scenario': 'alpha' }, body: JSON.stringify(body) });
    const a = await post(ALPHA, '/reef/report', { score: 1, references: [ref], agent_record_id: 'audit-a' });
    expect(a.status).toBe(201);
    expect(((await a.json()) as { keyId: string }).keyId).toBe(keyIdOf(ALPHA));
    expect((await post(ADMIN, '/reef/report', { score: 0, references: [ref] })).status).toBe(201);
    // The listing is the audit: each report with the id of the key that filed it.
    const listed = (await (await fetch(`${s.url}/reef/scenarios/alpha/reports`, { headers: { 'x-api-key': ADMIN } })).json()) as { data: Array<{ agent_record_id: string; score: number; keyId: string }> };
    expect(listed.data.map((r) => [r.score, r.keyId])).toEqual([[1, keyIdOf(ALPHA)], [0, keyIdOf(ADMIN)]]);
    expect(listed.data[0]!.agent_record_id).toBe('audit-a');
    expect(JSON.stringify(listed)).not.toContain(ALPHA);
    // A key limited to other scenarios does not see alpha's reports at all.
    expect((await fetch(`${s.url}/reef/scenarios/alpha/reports`, { headers: { 'x-api-key': FROM_ENV } })).status).toBe(404);
    expect((await fetch(`${s.url}/reef/scenarios/alpha/reports?order=newest`, { headers: { 'x-api-key': ADMIN } })).status).toBe(400);

    const one = await post(ONE, '/reef/scenarios/alpha/releases/rollback', {});
    expect(one.status).toBe(200);
    expect(((await one.json()) as { release: { keyId: string } }).release.keyId).toBe(keyIdOf(ONE));
    expect((await post(ADMIN, '/reef/scenarios/alpha/releases/rollback', { release_id: 'base' })).status).toBe(200);
    expect(rollbacks).toEqual([keyIdOf(ONE), keyIdOf(ADMIN)]);
  });

  it('a key limited to scenario alpha gets 403 on beta and cannot see beta or its records', async () => {
    const h = { 'x-api-key': ALPHA };
    const ok = await postChat(s.url, CHAT, { ...h, 'x-reef-scenario': 'alpha' });
    expect(ok.status).toBe(200);
    const alphaRecord = ok.headers.get('x-reef-agent-record-id')!;
    const forbidden = await postChat(s.url, CHAT, { ...h, 'x-reef-scenario': 'beta' });
    expect(forbidden.status).toBe(403);
    expect(openAIError(await forbidden.json()).type).toBe('permission_error');
    // Without a scenario header the request goes to `default`, which this key may not use either.
    expect((await postChat(s.url, CHAT, h)).status).toBe(403);

    expect((await fetch(`${s.url}/reef/scenarios/beta/records`, { headers: h })).status).toBe(404);
    expect((await fetch(`${s.url}/reef/scenarios/beta/records/${betaRecord}`, { headers: h })).status).toBe(404);
    // A beta record asked for under alpha is not there either.
    expect((await fetch(`${s.url}/reef/scenarios/alpha/records/${betaRecord}`, { headers: h })).status).toBe(404);
    expect((await fetch(`${s.url}/reef/scenarios/alpha/records/${alphaRecord}`, { headers: h })).status).toBe(200);
    const listed = (await (await fetch(`${s.url}/reef/scenarios`, { headers: h })).json()) as { data: Array<{ name: string }> };
    expect(listed.data.map((x) => x.name)).toEqual(['alpha']);
    const report = await fetch(`${s.url}/reef/report`, { method: 'POST', headers: { ...h, 'content-type': 'application/json', 'x-reef-scenario': 'beta' }, body: JSON.stringify({ score: 1, references: [betaRecord] }) });
    expect(report.status).toBe(403);
    // Weights are shared by every scenario: a limited key may not roll them back, even in its own.
    const rollback = await fetch(`${s.url}/reef/scenarios/alpha/releases/rollback`, { method: 'POST', headers: { ...h, 'content-type': 'application/json' }, body: '{}' });
    expect(rollback.status).toBe(403);
    expect(openAIError(await rollback.json()).message).toMatch(/not limited to scenarios/);
    // Metrics too: the beta series, and so beta's name, are left out of this key's scrape.
    const scraped = await (await fetch(`${s.url}/metrics`, { headers: h })).text();
    expect(scraped).toContain('scenario="alpha"');
    expect(scraped).not.toContain('scenario="beta"');
    expect(await (await fetch(`${s.url}/metrics`, { headers: { 'x-api-key': ADMIN } })).text()).toContain('scenario="beta"');
    // The admin key sees both.
    const all = (await (await fetch(`${s.url}/reef/scenarios`, { headers: { 'x-api-key': ADMIN } })).json()) as { data: Array<{ name: string }> };
    expect(all.data.map((x) => x.name)).toEqual(expect.arrayContaining(['alpha', 'beta']));
  });

  it('a key over its concurrency limit gets 429 with Retry-After, and its slot comes back', async () => {
    s.engine.options.tokenDelayMs = 20;
    const h = { 'x-api-key': ONE };
    let firstChunk!: () => void;
    const sawFirst = new Promise<void>((r) => (firstChunk = r));
    const held = postChat(s.url, { ...CHAT, stream: true }, h).then((res) => readSse(res, () => firstChunk()));
    await sawFirst;
    const refused = await postChat(s.url, CHAT, h);
    expect(refused.status).toBe(429);
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(openAIError(await refused.json()).type).toBe('rate_limit_error');
    // Another key is not affected.
    expect((await postChat(s.url, CHAT, { 'x-api-key': ADMIN })).status).toBe(200);
    expect((await held).at(-1)).toBe('[DONE]');
    s.engine.options.tokenDelayMs = 0;
    await waitFor(async () => (await postChat(s.url, CHAT, h)).status === 200, { what: 'the key to get its slot back' });
  });

  it('a request that fails, or whose client leaves (waiting out a weight swap, generating, streaming), gives its slot back', async () => {
    const h = { 'x-api-key': ONE };
    const idle = () => waitFor(() => s.gw.metrics.inflightCount === 0 && s.gw.gate.inflight === 0, { what: 'no chat completion in flight' });
    /** The one slot is free: a request now is served, not refused with 429. */
    const slotFree = async (what: string) => {
      await idle();
      const res = await postChat(s.url, CHAT, h);
      expect(res.status, what).toBe(200);
      await res.arrayBuffer();
    };

    // Refused by the engine (503) and as a bad request (400): the slot comes back both times.
    s.engine.options.failWith = 503;
    expect((await postChat(s.url, CHAT, h)).status).toBe(503);
    s.engine.options.failWith = null;
    expect((await postChat(s.url, { ...CHAT, stop: [''] }, h)).status).toBe(400);
    await slotFree('after a 503 and a 400');

    // Refused with 429 while another request holds the slot: the refusal takes no slot of its own.
    s.engine.options.delayMs = () => 60_000;
    try {
      const ac = new AbortController();
      const held = fetch(`${s.url}/v1/chat/completions`, { method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json', ...h }, body: JSON.stringify(CHAT) }).catch(() => null);
      await waitFor(() => s.gw.metrics.inflightCount === 1 && s.gw.gate.inflight === 1, { what: 'the held request to reach the engine' });
      for (let i = 0; i < 3; i++) expect((await postChat(s.url, CHAT, h)).status).toBe(429);
      // Its client leaves while the engine generates.
      ac.abort();
      await held;
    } finally {
      s.engine.options.delayMs = undefined;
    }
    await slotFree('after a client left a non-streamed request');

    // A client that leaves mid-stream.
    s.engine.options.tokenDelayMs = 1000;
    try {
      const ac = new AbortController();
      const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json', ...h }, body: JSON.stringify({ ...CHAT, stream: true }) });
      expect(res.status).toBe(200);
      ac.abort();
      await res.arrayBuffer().catch(() => null);
    } finally {
      s.engine.options.tokenDelayMs = 0;
    }
    await slotFree('after a client left mid-stream');

    // A client that leaves while its request waits out a weight swap.
    void s.gw.gate.pause(1000, 60_000);
    try {
      const ac = new AbortController();
      const waiting = fetch(`${s.url}/v1/chat/completions`, { method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json', ...h }, body: JSON.stringify(CHAT) }).catch(() => null);
      await waitFor(() => s.gw.metrics.inflightCount === 1, { what: 'the request to wait at the paused gate' });
      expect(s.gw.gate.inflight).toBe(0);
      ac.abort();
      await waiting;
      await idle();
    } finally {
      s.gw.gate.resume(null);
    }
    await slotFree('after a client left during a weight swap');
  });
});

describe('a key shorter than 32 characters', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'reef-gw-short-key-'));
  afterAll(() => {
    delete process.env.REEF_TEST_SHORT_KEY;
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('in the config is refused, naming its entry', async () => {
    await expect(testConfig(dataDir, [{ key: ADMIN }, { key: 'sk-short-key' }])).rejects.toThrow(/reef\.api_keys\[1\]\.key: must be at least 32 characters, got 12/);
  });

  it('in a key_env variable stops the gateway before it listens, naming the entry and the variable', async () => {
    process.env.REEF_TEST_SHORT_KEY = 'sk-short-key';
    const engine = await startFakeEngine({});
    try {
      const config = await testConfig(dataDir, [{ key: ADMIN }, { key_env: 'REEF_TEST_SHORT_KEY' }]);
      const started = startGateway({ config, engineUrl: engine.url, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: 1 });
      await expect(started).rejects.toThrow(/reef\.api_keys\[1\]\.key_env: the key in environment variable REEF_TEST_SHORT_KEY must be at least 32 characters, got 12/);
      await expect(started).rejects.not.toThrow(/sk-short/);
    } finally {
      await engine.close();
    }
  });
});
