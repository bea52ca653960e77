import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { resolveConfig } from '../../cluster/config/index.js';
import { Authenticator } from '../../actors/gateway/auth.js';
import type { ChatDeps } from '../../actors/gateway/chat.js';
import { browserOptions, resolveApiKeys } from '../../actors/gateway/index.js';
import { GatewayMetrics } from '../../actors/gateway/metrics.js';
import { registerReefRoutes } from '../../actors/gateway/routes/reef.js';
import { buildGatewayServer } from '../../actors/gateway/server.js';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { Chromium, findChromium, type Page } from '../helpers/chromium.js';

/**
 * Security review H4, in a real browser: headless Chromium against a real, listening gateway
 * without API keys (the examples' setup). Its server is built from source as the gateway wires
 * it (server, Reef routes, SQLite store); chat completions are left out, since no request here
 * gets that far, and so are the tokenizer workers, which run from dist/.
 *
 * Chromium maps the attacker's names to 127.0.0.1 (`--host-resolver-rules`), which is exactly
 * where a DNS-rebinding attack leaves the victim's browser.
 */

const CHROMIUM = findChromium();
const NO_BROWSER = process.env.REEF_NO_BROWSER === '1';

if (CHROMIUM === null && NO_BROWSER) {
  it.skip('browser attacks on a keyless gateway (skipped: REEF_NO_BROWSER=1 and no chromium on PATH)', () => {});
} else {
  describe('browser attacks on a keyless gateway', () => {
    let dir: string;
    let store: SqliteStore;
    let app: FastifyInstance;
    let gw: string;
    let gwPort: number;
    let attacker: Server;
    let attackerPort: number;
    let browser: Chromium;
    /** Every rollback that reached the trainer-controller's side. */
    const rollbacks: unknown[] = [];
    /** What the gateway answered, so that a refusal is known to be the gateway's and not the browser's. */
    const answered: string[] = [];

    beforeAll(async () => {
      if (CHROMIUM === null) {
        throw new Error('no chromium on PATH: install it (apt-get install -y chromium; scripts/test.sh does this), or set REEF_NO_BROWSER=1 to skip the browser attack tests');
      }
      dir = mkdtempSync(join(tmpdir(), 'reef-browser-'));
      const config = await resolveConfig({ cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p' } }, reef: { data_dir: dir } }, { baseDir: dir, overrides: [] });
      store = SqliteStore.open(join(dir, 'records.sqlite'));
      await store.append(sampleRecord(1));
      const chat = { metrics: new GatewayMetrics(), modelName: 'tiny', tokenizer: { contextLength: 64 } } as unknown as ChatDeps;
      app = buildGatewayServer({
        chat,
        auth: new Authenticator(resolveApiKeys(config)),
        defaultScenario: config.reef.default_scenario,
        browser: browserOptions(config),
        registerReefRoutes: (a, principalOf) =>
          registerReefRoutes(a, {
            store,
            defaultScenario: config.reef.default_scenario,
            status: () => ({}),
            rollback: async (_s, body) => {
              rollbacks.push(body ?? null);
              return { id: 'rollback-1' };
            },
          }, principalOf),
      });
      app.addHook('onResponse', (request, reply, done) => {
        answered.push(`${request.method} ${request.url} ${reply.statusCode}`);
        done();
      });
      gw = await app.listen({ host: '127.0.0.1', port: 0 });
      gwPort = (app.server.address() as AddressInfo).port;

      // The attacker's own site, on another origin: a blank page to run script in.
      attacker = createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><title>attacker</title><body></body>'));
      await new Promise<void>((r) => attacker.listen(0, '127.0.0.1', r));
      attackerPort = (attacker.address() as AddressInfo).port;

      browser = await Chromium.launch(CHROMIUM, { hostResolverRules: 'MAP evil.example 127.0.0.1, MAP attacker.test 127.0.0.1' });
    });

    afterAll(async () => {
      await browser?.close();
      await app?.close();
      await new Promise<void>((r) => (attacker ? attacker.close(() => r()) : r()));
      await store?.close();
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    /** What the page's `fetch` got: status, or the error a refused response is to a no-cors read. */
    const fetchIn = (page: Page, url: string, init: string = '{}') =>
      page.evaluate<{ status: number; type: string; body: string } | { error: string }>(
        `fetch(${JSON.stringify(url)}, ${init}).then(async (r) => ({ status: r.status, type: r.type, body: await r.text() }), (e) => ({ error: String(e) }))`,
      );

    it('the gateway itself answers a client that is no browser (the records and the rollback are there to take)', async () => {
      const res = await fetch(`${gw}/reef/scenarios/default/records`);
      expect(res.status).toBe(200);
      expect(((await res.json()) as { data: unknown[] }).data).toHaveLength(1);
    });

    it('DNS rebinding: a page on http://evil.example:<gateway port> reads no record and rolls nothing back', async () => {
      const page = await browser.newPage();
      const status = await page.navigate(`http://evil.example:${gwPort}/`);
      // The page is same-origin with the gateway under the attacker's name, as after a rebinding.
      expect(await page.origin()).toBe(`http://evil.example:${gwPort}`);

      const records = await fetchIn(page, '/reef/scenarios/default/records');
      expect(records).toMatchObject({ status: 421, type: 'basic' });
      expect((records as { body: string }).body).toContain('REEF_ERR_HOST_NOT_ALLOWED');
      expect((records as { body: string }).body).not.toContain(sampleRecord(1).request.messages[0]!.content as string);
      // Same-origin, so the page may send JSON: the Host check is what stops it.
      const rollback = await fetchIn(page, '/reef/scenarios/default/releases/rollback', `{ method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' }`);
      expect(rollback).toMatchObject({ status: 421 });
      const bare = await fetchIn(page, '/reef/scenarios/default/releases/rollback', `{ method: 'POST' }`);
      expect(bare).toMatchObject({ status: 421 });
      expect(rollbacks).toEqual([]);
      // Each reached the gateway, which refused it. Chromium sends a request refused 421 once more,
      // on a new connection (RFC 9110 §15.5.20 allows it), so each comes twice.
      const posts = answered.filter((a) => a.includes('/releases/rollback'));
      expect(new Set(posts)).toEqual(new Set(['POST /reef/scenarios/default/releases/rollback 421']));
      expect(posts.length).toBeGreaterThanOrEqual(2);
      // The page itself was refused too.
      expect(status).toBe(421);
    });

    it('CSRF: a page on http://attacker.test posts to the gateway with a no-cors fetch and a form, and nothing is rolled back', async () => {
      const page = await browser.newPage();
      expect(await page.navigate(`http://attacker.test:${attackerPort}/`)).toBe(200);
      const target = `http://127.0.0.1:${gwPort}/reef/scenarios/default/releases/rollback`;

      // No body, no content type: the request a page may send without asking first.
      const sent = await fetchIn(page, target, `{ method: 'POST', mode: 'no-cors' }`);
      // An opaque answer: the page learns nothing, whatever the gateway did.
      expect(sent).toMatchObject({ status: 0, type: 'opaque' });

      // A form post, aimed at a frame so that the page stays to say when it has loaded.
      const form = await page.evaluate<string>(`new Promise((resolve) => {
        const frame = document.createElement('iframe');
        frame.name = 'sink';
        document.body.appendChild(frame);
        setTimeout(() => {
          frame.onload = () => resolve('loaded');
          const f = document.createElement('form');
          f.method = 'POST';
          f.action = ${JSON.stringify(target)};
          f.target = 'sink';
          f.enctype = 'text/plain';
          const field = document.createElement('input');
          field.name = '{"release_id": null, "x": "';
          field.value = '"}';
          f.appendChild(field);
          document.body.appendChild(f);
          f.submit();
        }, 0);
      })`);
      expect(form).toBe('loaded');
      expect(rollbacks).toEqual([]);
      // Both reached the gateway, which refused them (not the browser, which would leave nothing to see here).
      expect(answered.slice(-2)).toEqual(['POST /reef/scenarios/default/releases/rollback 403', 'POST /reef/scenarios/default/releases/rollback 403']);
    });
  });
}
