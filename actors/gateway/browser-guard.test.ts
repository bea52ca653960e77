import type { FastifyInstance } from 'fastify';
import { afterEach, describe, expect, it } from 'vitest';
import { Authenticator } from './auth.js';
import { BrowserGuard, isJsonContentType, parseHost, type GuardHeaders } from './browser-guard.js';
import type { ChatDeps } from './chat.js';
import { GatewayMetrics } from './metrics.js';
import { registerReefRoutes } from './routes/reef.js';
import { buildGatewayServer } from './server.js';
import type { RecordStore } from './store/types.js';

describe('BrowserGuard', () => {
  const guard = new BrowserGuard({ bindHost: '127.0.0.2', allowedHosts: ['reef.internal', 'My-Box'], allowedOrigins: ['http://localhost:3000'] });
  const code = (headers: GuardHeaders, localPort: number | null = 8600) => guard.check(headers, localPort)?.code ?? 'ok';

  it.each([
    ['localhost:8600'], ['localhost'], ['127.0.0.1:8600'], ['127.1.2.3'], ['[::1]:8600'], ['[::1]'], ['LOCALHOST:8600'],
    // The bind address and the configured names, in any case.
    ['127.0.0.2:8600'], ['reef.internal:8600'], ['my-box'],
  ])('lets Host %s through', (host) => {
    expect(code({ host })).toBe('ok');
  });

  it.each([['evil.example:8600'], ['evil.example'], ['127.0.0.1.evil.example'], ['localhost.evil.example:8600'], ['10.0.0.5:8600'], ['[fe80::1]:8600'], ['127.0.0.1@evil.example'], ['evil.example/127.0.0.1'], [''], ['localhost:99999']])(
    'refuses Host %j with 421 naming reef.allowed_hosts',
    (host) => {
      const err = guard.check({ host }, 8600);
      expect([err?.code, err?.status]).toEqual(['REEF_ERR_HOST_NOT_ALLOWED', 421]);
      expect(err?.message).toContain('add it to reef.allowed_hosts');
    },
  );

  it('lets a request without Host, Origin or Sec-Fetch-Site through (HTTP/1.0, an SDK, curl)', () => {
    expect(code({})).toBe('ok');
    expect(code({ host: 'localhost:8600', 'sec-fetch-site': 'none' })).toBe('ok');
  });

  it('takes an Origin of an allowed name on the port the request came in on', () => {
    for (const origin of ['http://localhost:8600', 'http://127.0.0.1:8600', 'http://[::1]:8600', 'https://reef.internal:8600', 'http://127.0.0.2:8600']) {
      expect(code({ host: 'localhost:8600', origin, 'sec-fetch-site': 'same-origin' }), origin).toBe('ok');
    }
    // The scheme's default port is written without one.
    expect(code({ host: 'localhost', origin: 'http://localhost' }, 80)).toBe('ok');
  });

  it.each([
    'https://evil.example', 'http://evil.example:8600', 'http://localhost:3001', 'http://localhost', 'http://127.0.0.1:8601',
    'null', 'file://', 'chrome-extension://abcdef', 'http://localhost:8600/', 'not an origin',
  ])('refuses Origin %s with 403 naming reef.allowed_origins', (origin) => {
    const err = guard.check({ host: 'localhost:8600', origin }, 8600);
    expect([err?.code, err?.status]).toEqual(['REEF_ERR_ORIGIN_NOT_ALLOWED', 403]);
    expect(err?.message).toContain('add the origin to reef.allowed_origins');
  });

  it('compares the Origin port with the port the request came in on, not the one Host names', () => {
    expect(code({ host: 'localhost:8600', origin: 'http://localhost:8600' }, 9000)).toBe('REEF_ERR_ORIGIN_NOT_ALLOWED');
    // Without a socket port (fastify's inject), the port Host names stands for it.
    expect(code({ host: 'localhost:8600', origin: 'http://localhost:8600' }, null)).toBe('ok');
  });

  it('takes an origin listed in reef.allowed_origins, cross-site included, and no other cross-site request', () => {
    expect(code({ host: 'localhost:8600', origin: 'http://localhost:3000', 'sec-fetch-site': 'same-site' })).toBe('ok');
    expect(code({ host: 'localhost:8600', origin: 'http://localhost:3000', 'sec-fetch-site': 'cross-site' })).toBe('ok');
    // A navigation or an <img> from another site sends no Origin, only Sec-Fetch-Site.
    expect(code({ host: 'localhost:8600', 'sec-fetch-site': 'cross-site' })).toBe('REEF_ERR_ORIGIN_NOT_ALLOWED');
    expect(code({ host: 'localhost:8600', origin: 'http://localhost:8600', 'sec-fetch-site': 'cross-site' })).toBe('REEF_ERR_ORIGIN_NOT_ALLOWED');
  });

  it('refuses Origin null even when it is listed (every sandboxed page and file sends it)', () => {
    const lax = new BrowserGuard({ bindHost: '127.0.0.1', allowedOrigins: ['null'] });
    expect(lax.check({ origin: 'null' }, 8600)?.code).toBe('REEF_ERR_ORIGIN_NOT_ALLOWED');
  });

  it('names the settings it was given (the header shim has flags instead)', () => {
    const shim = new BrowserGuard({ bindHost: '127.0.0.1', settings: { hosts: '--allow-host', origins: '--allow-origin' } });
    expect(shim.check({ host: 'evil.example' }, 8700)?.message).toContain('add it to --allow-host');
    expect(shim.check({ origin: 'null' }, 8700)?.message).toContain('add the origin to --allow-origin');
  });
});

describe('parseHost and isJsonContentType', () => {
  it('split Host into a lower-case name and a port', () => {
    expect(parseHost('LocalHost:8600')).toEqual({ name: 'localhost', port: 8600 });
    expect(parseHost('[::1]')).toEqual({ name: '::1', port: null });
    expect(parseHost('a b')).toBeNull();
    expect(parseHost('::1')).toBeNull();
  });

  it('take application/json with parameters, in any case, and nothing else', () => {
    for (const t of ['application/json', 'application/json; charset=utf-8', 'Application/JSON;charset=UTF-8', ' application/json ']) expect(isJsonContentType(t), t).toBe(true);
    for (const t of [undefined, '', 'text/plain', 'text/plain;charset=UTF-8', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/jsonp', 'application/json-patch+json']) expect(isJsonContentType(t), String(t)).toBe(false);
  });
});

/** The gateway's server with the Reef routes on a store that holds one record, and a rollback that says whether it ran. */
async function gateway(keys: string[] = []): Promise<{ app: FastifyInstance; rollbacks: unknown[] }> {
  const rollbacks: unknown[] = [];
  const store = { list: async () => ({ items: [{ id: 'rec-1' }], next: null }) } as unknown as RecordStore;
  const chat = { metrics: new GatewayMetrics(), modelName: 'tiny', tokenizer: { contextLength: 64 } } as unknown as ChatDeps;
  const app = buildGatewayServer({
    chat,
    auth: new Authenticator(keys.map((key) => ({ key, scenarios: null, maxConcurrency: 4 }))),
    defaultScenario: 'default',
    browser: { bindHost: '127.0.0.1' },
    registerReefRoutes: (a, principalOf) =>
      registerReefRoutes(a, {
        store,
        defaultScenario: 'default',
        status: () => ({}),
        rollback: async (_s, body) => {
          rollbacks.push(body);
          return { id: 'rollback-1' };
        },
      }, principalOf),
  });
  await app.ready();
  apps.push(app);
  return { app, rollbacks };
}
const apps: FastifyInstance[] = [];
afterEach(async () => {
  await Promise.all(apps.splice(0).map((a) => a.close()));
});

const ROLLBACK = '/reef/scenarios/default/releases/rollback';

describe('keyless gateway in a browser\'s neighbourhood (security review H4)', () => {
  it('answers Host: evil.example:8600 with 421 and the error body, on reads and writes', async () => {
    const { app, rollbacks } = await gateway();
    for (const [method, url] of [['GET', '/reef/scenarios/default/records'], ['GET', '/v1/models'], ['POST', ROLLBACK]] as const) {
      const res = await app.inject({ method, url, headers: { host: 'evil.example:8600', 'content-type': 'application/json' }, ...(method === 'POST' ? { payload: '{}' } : {}) });
      expect(res.statusCode, `${method} ${url}`).toBe(421);
      expect(res.json().error).toMatchObject({ code: 'REEF_ERR_HOST_NOT_ALLOWED', type: 'invalid_request_error', param: null });
      expect(res.json().error.message).toMatch(/reef\.allowed_hosts/);
    }
    expect(rollbacks).toEqual([]);
  });

  it('answers a body-less POST from Origin https://evil.example with 403 and does not roll back', async () => {
    const { app, rollbacks } = await gateway();
    const res = await app.inject({ method: 'POST', url: ROLLBACK, headers: { host: '127.0.0.1:8600', origin: 'https://evil.example', 'sec-fetch-site': 'cross-site' } });
    expect(res.statusCode).toBe(403);
    expect(res.json().error).toMatchObject({ code: 'REEF_ERR_ORIGIN_NOT_ALLOWED', type: 'permission_error' });
    expect(rollbacks).toEqual([]);
  });

  it('answers Origin: null with 403', async () => {
    const { app, rollbacks } = await gateway();
    for (const [method, url] of [['GET', '/reef/scenarios/default/records'], ['POST', ROLLBACK]] as const) {
      const res = await app.inject({ method, url, headers: { host: 'localhost:8600', origin: 'null', 'content-type': 'application/json' }, ...(method === 'POST' ? { payload: '{}' } : {}) });
      expect(res.statusCode, `${method} ${url}`).toBe(403);
      expect(res.json().error.code).toBe('REEF_ERR_ORIGIN_NOT_ALLOWED');
    }
    expect(rollbacks).toEqual([]);
  });

  it('serves its own origin (a page the gateway would serve itself)', async () => {
    const { app, rollbacks } = await gateway();
    const headers = { host: '127.0.0.1:8600', origin: 'http://127.0.0.1:8600', 'sec-fetch-site': 'same-origin' };
    const records = await app.inject({ method: 'GET', url: '/reef/scenarios/default/records', headers });
    expect(records.statusCode).toBe(200);
    expect(records.json().data).toEqual([{ id: 'rec-1' }]);
    const rollback = await app.inject({ method: 'POST', url: ROLLBACK, headers: { ...headers, 'content-type': 'application/json' }, payload: '{}' });
    expect(rollback.statusCode).toBe(200);
    expect(rollbacks).toEqual([{}]);
  });

  it('does not guard /healthz', async () => {
    const { app } = await gateway();
    const res = await app.inject({ method: 'GET', url: '/healthz', headers: { host: 'evil.example:8600', origin: 'null' } });
    expect(res.statusCode).toBe(200);
  });
});

describe('state-changing requests need a JSON content type', () => {
  it('answers a body-less POST without a content type with 415, before the handler (regression: it rolled the weights back)', async () => {
    const { app, rollbacks } = await gateway();
    const res = await app.inject({ method: 'POST', url: ROLLBACK });
    expect(res.statusCode).toBe(415);
    expect(res.json().error).toMatchObject({ code: 'REEF_ERR_BODY', type: 'invalid_request_error' });
    expect(res.json().error.message).toMatch(/needs content-type: application\/json, got none/);
    expect(rollbacks).toEqual([]);
  });

  it.each(['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x'])('answers %s (what a form or a no-cors fetch sends) with 415', async (type) => {
    const { app, rollbacks } = await gateway();
    for (const url of [ROLLBACK, '/reef/report', '/reef/scenarios', '/v1/chat/completions']) {
      const res = await app.inject({ method: 'POST', url, headers: { 'content-type': type }, payload: 'a=b' });
      expect(res.statusCode, url).toBe(415);
    }
    expect(rollbacks).toEqual([]);
  });

  it('takes application/json with a charset, in any case; an unknown route stays 404', async () => {
    const { app, rollbacks } = await gateway();
    const res = await app.inject({ method: 'POST', url: ROLLBACK, headers: { 'content-type': 'Application/JSON; charset=UTF-8' }, payload: '{}' });
    expect(res.statusCode).toBe(200);
    expect(rollbacks).toEqual([{}]);
    expect((await app.inject({ method: 'POST', url: '/v1/completions', payload: 'x', headers: { 'content-type': 'text/plain' } })).statusCode).toBe(404);
  });

  it('holds with keys too, after the key is checked', async () => {
    const { app, rollbacks } = await gateway(['sk-admin']);
    expect((await app.inject({ method: 'POST', url: ROLLBACK })).statusCode).toBe(401);
    expect((await app.inject({ method: 'POST', url: ROLLBACK, headers: { authorization: 'Bearer sk-admin' } })).statusCode).toBe(415);
    expect(rollbacks).toEqual([]);
  });
});

describe('keyed gateway', () => {
  it('does not check Host or Origin: a proxy in front sends its clients\' Host, and a browser holds no key', async () => {
    const { app, rollbacks } = await gateway(['sk-admin']);
    const headers = { host: 'evil.example:8600', origin: 'https://evil.example', 'sec-fetch-site': 'cross-site' };
    expect((await app.inject({ method: 'GET', url: '/reef/scenarios/default/records', headers })).statusCode).toBe(401);
    const res = await app.inject({ method: 'GET', url: '/reef/scenarios/default/records', headers: { ...headers, authorization: 'Bearer sk-admin' } });
    expect(res.statusCode).toBe(200);
    expect(rollbacks).toEqual([]);
  });
});
