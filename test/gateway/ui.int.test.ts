import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { STATE_KEY as JUDGE_STATE_KEY } from '../../actors/judge/handler.js';
import { Authenticator, type ApiKeySpec } from '../../actors/gateway/auth.js';
import type { ChatDeps } from '../../actors/gateway/chat.js';
import { releasesOf } from '../../actors/gateway/index.js';
import { GatewayMetrics } from '../../actors/gateway/metrics.js';
import { PipelineStatus } from '../../actors/gateway/pipeline-status.js';
import { registerReefRoutes } from '../../actors/gateway/routes/reef.js';
import { UI_CSP } from '../../actors/gateway/routes/ui.js';
import { buildGatewayServer } from '../../actors/gateway/server.js';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import type { Release } from '../../actors/trainer-controller/controller.js';
import { STATE_KEY as TRAINER_STATE_KEY } from '../../actors/trainer-controller/messages.js';
import { readReleases, releaseKey } from '../../actors/trainer-controller/releases.js';
import { repoRoot } from '../../cluster/paths.js';
import { testKey } from '../helpers/api-keys.js';
import { Chromium, findChromium, type Page } from '../helpers/chromium.js';

/**
 * The live page (GET /reef/ui) in headless Chromium, against two real, listening gateways over one
 * seeded SQLite store: a keyless one (loopback, Host and Origin checked) and a keyed one with a key
 * for every scenario and a key for one. The trainer-controller's side of a rollback is the `rollback`
 * dependency, which records what reached it.
 */

const CHROMIUM = findChromium();
const NO_BROWSER = process.env.REEF_NO_BROWSER === '1';

const FULL = testKey('ui-full');
const SCOPED = testKey('ui-scoped');
/** A hint is PRM output, and a PRM reads the user's words: whatever they wrote can come back here. */
const INJECTED = '<img src=x onerror="window.__pwned=1">';
/** Judged turns of `default`: 12, one of them dropped (no reward), every one with a reply. */
const TURNS = 12;
const DROPPED = 3;

const reply = (i: number) => (i <= 6 ? `**Answer:** ${i * 3}\n- step one\n- step two` : `Three times ${i} is ${i * 3}, so the answer is ${i * 3}.`);
const hintOf = (i: number) => (i === TURNS ? INJECTED : `turn ${i}: answer in plain sentences, no bold`);

async function seed(store: SqliteStore): Promise<void> {
  const judge = async (scenario: string, i: number, hint: string | null, reward: number, decision: 'hint' | 'anchor' | 'dropped') => {
    const rec = await store.append({ ...sampleRecord(i, { scenario }), response: { role: 'assistant', content: scenario === 'default' ? reply(i) : `private reply ${i}`, tool_calls: null } });
    const hints = hint === null ? [] : [hint];
    await store.appendJudgedTurn({
      turnRecordId: rec.id, nextStateRecordId: `next-${scenario}-${i}`, scenario, sessionKey: `tag:s-${i % 3}`, decision, reward,
      teacherCandidates: decision === 'hint' ? hints : decision === 'anchor' ? [null] : [],
      judgment: {
        score: { votes: [reward, reward, decision === 'dropped' ? null : reward], outputs: ['x'.repeat(50_000)], result: reward },
        hint: { votes: hint === null ? [-1] : [1], hints },
        nextState: { role: 'user', content: scenario === 'default' && i === TURNS ? `I said <b>no bold</b> ${INJECTED}` : `next state ${i}` },
        decision, reward,
      },
    });
  };
  for (let i = 1; i <= TURNS; i++) {
    if (i === DROPPED) await judge('default', i, null, 0, 'dropped');
    else await judge('default', i, hintOf(i), i <= 6 ? -1 : 1, 'hint');
    if (i === 6) await putReleases(store, Date.now());
  }
  for (let i = 1; i <= 3; i++) await judge('private', 100 + i, `private hint ${i}`, 1, 'hint');
  await store.commitConsumer('judge', 16, JUDGE_STATE_KEY, {
    correlator: { counters: { tagged: 30, untagged: 2, bound: 15, dropped_unbound: 4, evicted: 1, retries: 0, side: 0, ended: 3 }, warned: { untagged: true, evictions: false, unboundAt: null } },
    counters: { judged: 15, dropped: 1, votes_ok: 90 },
  });
}

async function putReleases(store: SqliteStore, at: number): Promise<void> {
  const release = (n: number, createdAt: number): Release => ({
    id: `release-${n}`, weightVersion: `v${n}`, parent: n === 1 ? null : `release-${n - 1}`, batchIds: [`default:openclawrl:${n}`],
    metrics: { loss: 0.5 / n, reward_mean: n === 1 ? -0.6 : 0.4, lr: 1e-5 }, createdAt, checkpointPath: `/ckpt/${n}`, rollbackOf: null, keyId: null, sync: 'disk',
  });
  const r1 = release(1, at - 1000);
  const r2 = release(2, at);
  await store.putState(releaseKey(1), r1);
  await store.putState(releaseKey(2), r2);
  await store.putState(TRAINER_STATE_KEY, { version: 2, releaseCount: 2, recentReleases: [r1, r2], counters: { batches: 2 } });
}

if (CHROMIUM === null && NO_BROWSER) {
  it.skip('the live page (skipped: REEF_NO_BROWSER=1 and no chromium on PATH)', () => {});
} else {
  describe('the live page, GET /reef/ui', () => {
    let dir: string;
    let store: SqliteStore;
    let pipeline: PipelineStatus;
    let open: FastifyInstance;
    let keyed: FastifyInstance;
    let openUrl: string;
    let keyedUrl: string;
    let browser: Chromium;
    /** What reached the trainer-controller's side: [scenario, release id, key id]. */
    const rollbacks: Array<[string, unknown, string]> = [];

    const gateway = (auth: Authenticator) =>
      buildGatewayServer({
        chat: { metrics: new GatewayMetrics(), modelName: 'tiny', tokenizer: { contextLength: 64 } } as unknown as ChatDeps,
        auth,
        defaultScenario: 'default',
        registerReefRoutes: (a, principalOf) =>
          registerReefRoutes(a, {
            store,
            defaultScenario: 'default',
            status: async () => ({
              gateway: { weightVersion: 'v2', paused: false, inflight: 0 },
              ...(await pipeline.refresh()),
              actors: [{ id: 'judge-0', name: 'judge', state: 'running', restarts: 1, lastExit: 'exit code 1' }],
              engines: [{ name: 'rollout-0', role: 'rollout', healthy: true, weightVersion: 'v2' }],
            }),
            releases: async (s) => releasesOf(await readReleases(store), s),
            rollback: async (s, body, keyId) => {
              rollbacks.push([s, (body as { release_id?: unknown } | null)?.release_id ?? null, keyId]);
              return { id: 'release-3', rollbackOf: 'release-1' };
            },
          }, principalOf),
      });

    beforeAll(async () => {
      if (CHROMIUM === null) throw new Error('no chromium on PATH: install it (apt-get install -y chromium; scripts/test.sh does this), or set REEF_NO_BROWSER=1 to skip the browser tests');
      dir = mkdtempSync(join(tmpdir(), 'reef-ui-'));
      store = SqliteStore.open(join(dir, 'records.sqlite'));
      await seed(store);
      pipeline = new PipelineStatus(store, 60_000);
      open = gateway(new Authenticator([]));
      const keys: ApiKeySpec[] = [{ key: FULL, scenarios: null, maxConcurrency: 8 }, { key: SCOPED, scenarios: ['private'], maxConcurrency: 8 }];
      keyed = gateway(new Authenticator(keys));
      openUrl = await open.listen({ host: '127.0.0.1', port: 0 });
      keyedUrl = await keyed.listen({ host: '127.0.0.1', port: 0 });
      browser = await Chromium.launch(CHROMIUM);
    });

    afterAll(async () => {
      await browser?.close();
      await open?.close();
      await keyed?.close();
      await store?.close();
      if (dir) rmSync(dir, { recursive: true, force: true });
    });

    const loaded = async (url: string): Promise<Page> => {
      const page = await browser.newPage();
      await page.setViewport(1280, 1500);
      expect(await page.navigate(url)).toBe(200);
      return page;
    };
    const polled = (page: Page) => page.waitUntil<string>(`document.body.dataset.polls`, 'the first poll');

    it('serves the page, its script and its style sheet under a strict Content-Security-Policy, and an inline script does not run', async () => {
      for (const [path, type] of [['/reef/ui', 'text/html'], ['/reef/ui/app.js', 'text/javascript'], ['/reef/ui/app.css', 'text/css']] as const) {
        const res = await fetch(`${openUrl}${path}`);
        expect(res.status).toBe(200);
        expect(res.headers.get('content-type')).toContain(type);
        expect(res.headers.get('content-security-policy')).toBe(UI_CSP);
        expect(res.headers.get('x-content-type-options')).toBe('nosniff');
      }
      // The keyless gateway's Host check stands before the page as before its data (DNS rebinding).
      const rebound = await new Promise<number>((resolve, reject) => {
        const port = (open.server.address() as AddressInfo).port;
        request({ host: '127.0.0.1', port, path: '/reef/ui', headers: { host: `evil.example:${port}` } }, (res) => {
          res.resume();
          resolve(res.statusCode!);
        }).on('error', reject).end();
      });
      expect(rebound).toBe(421);
      expect(UI_CSP).toMatch(/^default-src 'self';/);
      expect(UI_CSP).not.toContain('unsafe-inline');
      const page = await loaded(`${openUrl}/reef/ui`);
      await polled(page);
      // Script that became markup, the way an escaping bug would put it there, and a request elsewhere.
      const result = await page.evaluate<{ inline: unknown; handler: unknown; violations: string[]; elsewhere: string }>(`new Promise((resolve) => {
        const violations = [];
        document.addEventListener('securitypolicyviolation', (e) => violations.push(e.violatedDirective));
        const s = document.createElement('script');
        s.textContent = 'window.__inline = 1';
        document.body.appendChild(s);
        const d = document.createElement('div');
        d.innerHTML = '<img src="/nowhere.png" onerror="window.__handler = 1">';
        document.body.appendChild(d);
        const elsewhere = fetch(${JSON.stringify(`${keyedUrl}/healthz`)}).then(() => 'reached', () => 'blocked');
        // Each refusal is reported as it happens; the handler's only once its image failed to load.
        const done = () => ['script-src-elem', 'script-src-attr', 'connect-src'].every((d) => violations.includes(d));
        const check = () => (done() ? elsewhere.then((e) => resolve({ inline: window.__inline, handler: window.__handler, violations, elsewhere: e })) : setTimeout(check, 20));
        check();
      })`);
      expect(result.inline).toBeUndefined();
      expect(result.handler).toBeUndefined();
      expect(result.elsewhere).toBe('blocked');
    });

    it('shows a seeded store: curves with a point per judged turn, the turns with their hints, correlation and releases (screenshot)', async () => {
      const page = await loaded(`${openUrl}/reef/ui`);
      await polled(page);
      const seen = await page.evaluate<Record<string, unknown>>(`(() => {
        const points = (id) => document.querySelector(id + ' polyline.rolling').getAttribute('points').trim().split(/\\s+/).length;
        return {
          reward: points('#reward-chart'), rewardDots: document.querySelectorAll('#reward-chart circle.raw').length,
          habit: points('#habit-chart'), releaseLines: document.querySelectorAll('#reward-chart line.release').length,
          hints: [...document.querySelectorAll('#turns .hint')].map((e) => e.textContent),
          turns: document.querySelectorAll('#turns > li').length,
          correlation: document.querySelector('#correlation').textContent,
          warnings: [...document.querySelectorAll('#warnings li')].map((e) => e.dataset.code),
          releases: [...document.querySelectorAll('#releases tbody tr')].map((e) => e.dataset.release),
          buttons: [...document.querySelectorAll('button.rollback')].map((e) => e.dataset.release),
          actors: document.querySelector('#actors tbody').textContent,
          scenarios: [...document.querySelectorAll('#scenario option')].map((o) => o.value),
        };
      })()`);
      expect(seen).toMatchObject({ reward: TURNS - 1, rewardDots: TURNS - 1, habit: TURNS, releaseLines: 2, turns: TURNS, warnings: ['untagged-traffic'], releases: ['release-2', 'release-1'], buttons: ['release-1'], scenarios: ['default', 'private'] });
      expect(seen.hints).toEqual(Array.from({ length: TURNS }, (_, k) => TURNS - k).filter((i) => i !== DROPPED).map((i) => `hint: ${hintOf(i)}`));
      expect(seen.correlation).toContain('bound turns15');
      expect(seen.actors).toContain('judge-0');
      // The habit curve starts at 1 (every early reply used bold and a list) and falls to 0 over the
      // plain replies: its last point sits on the chart's floor, its first on the ceiling.
      const ys = await page.evaluate<number[]>(`document.querySelector('#habit-chart polyline').getAttribute('points').trim().split(/\\s+/).map((p) => Number(p.split(',')[1]))`);
      expect(ys[0]).toBeLessThan(ys.at(-1)!);
      const png = await page.screenshot();
      expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
      expect(png.readUInt32BE(16)).toBe(1280);
      // The docs' picture: written on request, so that a test run leaves the checkout as it was.
      if (process.env.REEF_WRITE_SCREENSHOT === '1') {
        mkdirSync(join(repoRoot(), 'docs'), { recursive: true });
        writeFileSync(join(repoRoot(), 'docs', 'ui.png'), png);
      }
    });

    it('opens the scenario a link names (#private), and shows a small metric in significant digits, not as 0.000', async () => {
      const linked = await loaded(`${openUrl}/reef/ui#private`);
      await polled(linked);
      expect(await linked.evaluate<string>(`document.getElementById('scenario').value`)).toBe('private');
      expect(await linked.evaluate<string>(`document.getElementById('turns').textContent`)).toContain('private hint 3');
      // A name the gateway did not list is no scenario: the default opens.
      const unknown = await loaded(`${openUrl}/reef/ui#%3Cimg%20src%3Dx%3E`);
      await polled(unknown);
      expect(await unknown.evaluate<string>(`document.getElementById('scenario').value`)).toBe('default');
      const releases = await unknown.evaluate<string>(`document.getElementById('releases').textContent`);
      expect(releases).toContain('lr 1.00e-5');
      expect(releases).not.toContain('lr 0.000');
    });

    it('renders an injected hint, reply and next state as text, never as markup', async () => {
      const page = await loaded(`${openUrl}/reef/ui`);
      await polled(page);
      const r = await page.evaluate<{ imgs: number; bolds: number; pwned: unknown; hint: string; next: string }>(`(() => {
        const first = document.querySelector('#turns > li');
        return {
          imgs: document.querySelectorAll('#turns img').length, bolds: document.querySelectorAll('#turns b').length, pwned: window.__pwned,
          hint: first.querySelector('.hint').textContent, next: first.querySelector('.text.next').textContent,
        };
      })()`);
      expect(r).toEqual({ imgs: 0, bolds: 0, pwned: undefined, hint: `hint: ${INJECTED}`, next: `user: I said <b>no bold</b> ${INJECTED}` });
    });

    it('rolls back through the page: the click asks first, and the trainer-controller side gets the release named', async () => {
      const page = await loaded(`${openUrl}/reef/ui`);
      await polled(page);
      const before = rollbacks.length;
      // Dismissed: nothing is sent.
      const dismissed = page.nextDialog(false);
      await page.click('button.rollback[data-release="release-1"]');
      expect(await dismissed).toContain('release-1 (v1)');
      expect(await page.evaluate<string>(`document.querySelector('#rollback-result').textContent`)).toBe('');
      expect(rollbacks.length).toBe(before);
      const accepted = page.nextDialog(true);
      await page.click('button.rollback[data-release="release-1"]');
      expect(await accepted).toMatch(/every scenario.*release-1/);
      expect(await page.waitUntil<string>(`document.querySelector('#rollback-result').textContent.startsWith('rolled back') && document.querySelector('#rollback-result').textContent`, 'the rollback answer'))
        .toBe('rolled back to release-1 (new release release-3)');
      expect(rollbacks.slice(before)).toEqual([['default', 'release-1', 'open']]);
    });

    it('a keyed gateway: the page loads without a key, its data calls are refused without one, and a scoped key sees only its scenarios', async () => {
      for (const path of ['/reef/key', '/reef/scenarios', '/reef/status', '/reef/scenarios/private/judged', '/reef/scenarios/private/curves', '/reef/scenarios/private/releases']) {
        const res = await fetch(`${keyedUrl}${path}`);
        expect(res.status, path).toBe(401);
        expect(((await res.json()) as { error: { code: string } }).error.code).toBe('REEF_ERR_UNAUTHORIZED');
      }
      const scoped = { authorization: `Bearer ${SCOPED}` };
      expect((await fetch(`${keyedUrl}/reef/scenarios/default/judged`, { headers: scoped })).status).toBe(404);
      expect((await fetch(`${keyedUrl}/reef/scenarios/default/curves`, { headers: scoped })).status).toBe(404);

      const page = await loaded(`${keyedUrl}/reef/ui`);
      await page.waitUntil(`!document.querySelector('#key-form').hidden`, 'the key form');
      expect(await page.evaluate<number>(`fetch('/reef/scenarios').then((r) => r.status)`)).toBe(401);
      expect(await page.evaluate<string | undefined>('document.body.dataset.polls')).toBeUndefined();
      await page.click('#key');
      await page.type(SCOPED);
      await page.click('#key-form button[type=submit]');
      await polled(page);
      const seen = await page.evaluate<Record<string, unknown>>(`({
        scenarios: [...document.querySelectorAll('#scenario option')].map((o) => o.value),
        hints: [...document.querySelectorAll('#turns .hint')].map((e) => e.textContent),
        buttons: document.querySelectorAll('button.rollback').length,
        formHidden: document.querySelector('#key-form').hidden,
        stored: sessionStorage.getItem('reef.api_key') !== null,
        url: location.href, cookie: document.cookie,
      })`);
      expect(seen).toEqual({
        scenarios: ['private'], hints: ['hint: private hint 3', 'hint: private hint 2', 'hint: private hint 1'], buttons: 0, formHidden: true,
        stored: true, url: `${keyedUrl}/reef/ui`, cookie: '',
      });
    });

    it('the full key on the keyed gateway may roll back; the judged-turn listing pages and refuses bad parameters with 400s', async () => {
      const full = { authorization: `Bearer ${FULL}` };
      expect(await (await fetch(`${keyedUrl}/reef/key`, { headers: full })).json()).toMatchObject({ scenarios: null, rollback: true });
      expect(await (await fetch(`${keyedUrl}/reef/key`, { headers: { authorization: `Bearer ${SCOPED}` } })).json()).toMatchObject({ scenarios: ['private'], rollback: false });
      const first = (await (await fetch(`${keyedUrl}/reef/scenarios/default/judged?limit=5`, { headers: full })).json()) as { data: Array<{ offset: number; habits: string[] }>; next: string };
      expect(first.data).toHaveLength(5);
      const rest = (await (await fetch(`${keyedUrl}/reef/scenarios/default/judged?limit=100&after=${first.next}`, { headers: full })).json()) as { data: Array<{ offset: number; habits: string[] }>; next: string | null };
      expect([...first.data, ...rest.data].map((t) => t.offset)).toEqual(Array.from({ length: TURNS }, (_, k) => TURNS - k));
      expect(rest.next).toBeNull();
      expect(rest.data.at(-1)!.habits).toEqual(['bold', 'list']);
      expect(first.data[0]!.habits).toEqual([]);
      for (const [path, param] of [['judged?limit=0', 'limit'], ['judged?order=up', 'order'], ['curves?window=x', 'window'], ['curves?limit=5001', 'limit']] as const) {
        const res = await fetch(`${keyedUrl}/reef/scenarios/default/${path}`, { headers: full });
        expect(res.status, path).toBe(400);
        expect(((await res.json()) as { error: { param: string } }).error.param).toBe(param);
      }
    });
  });
}
