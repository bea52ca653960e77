import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parsePrometheusText } from '../helpers/prometheus-text.js';
import { waitFor } from '../helpers/wait.js';
import { CHAT, openAIError, postChat, startStack, type Stack } from './harness.js';

/** The Reef HTTP API: reports, scenarios, records, status, health and metrics. */

describe('gateway Reef API', () => {
  let s: Stack;
  const receipts: Record<string, string[]> = { default: [], other: [] };

  const post = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const get = async (path: string) => {
    const res = await fetch(`${s.url}${path}`);
    return { status: res.status, body: (await res.json()) as any };
  };

  beforeAll(async () => {
    s = await startStack();
    for (const scenario of ['default', 'default', 'default', 'default', 'default', 'other']) {
      const res = await postChat(s.url, CHAT, { 'x-reef-scenario': scenario, 'x-reef-tag-turn': String(receipts[scenario]!.length) });
      expect(res.status).toBe(200);
      receipts[scenario]!.push(res.headers.get('x-reef-agent-record-id')!);
    }
  });
  afterAll(async () => {
    await s?.close();
  });

  describe('POST /reef/report', () => {
    async function rejected(body: unknown, param: string | null, headers: Record<string, string> = {}) {
      const res = await post('/reef/report', body, headers);
      const json = await res.json();
      expect(res.status, JSON.stringify(json)).toBe(400);
      expect(openAIError(json).param).toBe(param);
      return openAIError(json).message;
    }

    it('takes only a finite number as score', async () => {
      await rejected({ score: true }, 'score');
      await rejected({ score: false }, 'score');
      await rejected({ score: 'NaN' }, 'score');
      await rejected({ score: '0.5' }, 'score');
      await rejected({ score: null }, 'score');
      await rejected({}, 'score');
      await rejected({ score: [1] }, 'score');
      // 1e999 parses to Infinity.
      const inf = await fetch(`${s.url}/reef/report`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"score": 1e999}' });
      expect(inf.status).toBe(400);
      expect(openAIError(await inf.json()).param).toBe('score');
    });

    it('takes a string or an object as feedback, an object as metadata', async () => {
      await rejected({ score: 1, feedback: 3 }, 'feedback');
      await rejected({ score: 1, feedback: ['a'] }, 'feedback');
      await rejected({ score: 1, metadata: 'x' }, 'metadata');
      expect((await post('/reef/report', { score: 1, feedback: 'good' })).status).toBe(201);
      expect((await post('/reef/report', { score: -0.5, feedback: { why: 'slow' }, metadata: { run: 3 } })).status).toBe(201);
    });

    it('references must be existing records of the same scenario, without duplicates', async () => {
      const [a, b] = receipts.default!;
      await rejected({ score: 1, references: 'abc' }, 'references');
      await rejected({ score: 1, references: [a, a] }, 'references');
      // A missing record and another scenario's get the same answer, which names neither that
      // scenario nor whether the id exists.
      const missing = await rejected({ score: 1, references: ['01ZZZZZZZZZZZZZZZZZZZZZZZZ'] }, 'references');
      const foreign = await rejected({ score: 1, references: [receipts.other![0]] }, 'references');
      expect(missing).toBe('report reference "01ZZZZZZZZZZZZZZZZZZZZZZZZ" is not a record of scenario default');
      expect(foreign).toBe(`report reference "${receipts.other![0]}" is not a record of scenario default`);
      const res = await post('/reef/report', { score: 1, references: [a, b] });
      expect(res.status).toBe(201);
      expect(((await res.json()) as any).references).toEqual([a, b]);
      // The other scenario's record is fine in its own scenario (header or body).
      expect((await post('/reef/report', { score: 1, references: [receipts.other![0]] }, { 'x-reef-scenario': 'other' })).status).toBe(201);
      expect((await post('/reef/report', { score: 1, scenario: 'other', references: [receipts.other![0]] })).status).toBe(201);
    });

    it('is idempotent by agent_record_id: the same body is 200 with the same report, a different one 409', async () => {
      const body = { score: 0.75, feedback: 'ok', references: [receipts.default![2]], agent_record_id: 'client-report-1' };
      const first = await post('/reef/report', body);
      expect(first.status).toBe(201);
      expect(first.headers.get('x-reef-agent-record-id')).toBe('client-report-1');
      const one = (await first.json()) as any;
      expect(one).toMatchObject({ agent_record_id: 'client-report-1', created: true, score: 0.75 });
      const again = await post('/reef/report', body);
      expect(again.status).toBe(200);
      const two = (await again.json()) as any;
      expect(two.created).toBe(false);
      expect(two.id).toBe(one.id);
      const conflict = await post('/reef/report', { ...body, score: 0.25 });
      expect(conflict.status).toBe(409);
      expect(openAIError(await conflict.json()).type).toBe('conflict_error');
      // The same client id in another scenario is another report.
      expect((await post('/reef/report', { ...body, references: [] }, { 'x-reef-scenario': 'other' })).status).toBe(201);
    });

    it('takes as agent_record_id only what its response header can carry, and stores nothing otherwise', async () => {
      const stored = async () => (await s.gw.store.listReports({ scenario: 'default', limit: 1000 })).items.length;
      const before = await stored();
      for (const id of ['run→1', 'a\nb', 'with space', '👋', '', 'x'.repeat(129)]) await rejected({ score: 1, agent_record_id: id }, 'agent_record_id');
      expect(await stored()).toBe(before);
      const ok = await post('/reef/report', { score: 1, agent_record_id: 'run-1:~!' });
      expect([ok.status, ok.headers.get('x-reef-agent-record-id')]).toEqual([201, 'run-1:~!']);
    });
  });

  describe('scenarios', () => {
    it('GET lists the scenarios; POST creates one, 409 when it exists, 400 for a bad name', async () => {
      const listed = await get('/reef/scenarios');
      expect(listed.body.data.map((x: any) => x.name)).toEqual(expect.arrayContaining(['default', 'other']));
      const created = await post('/reef/scenarios', { name: 'fresh', description: 'new one' });
      expect(created.status).toBe(201);
      expect(await created.json()).toMatchObject({ name: 'fresh', description: 'new one' });
      expect((await post('/reef/scenarios', { name: 'fresh' })).status).toBe(409);
      const bad = await post('/reef/scenarios', { name: 'Not Valid' });
      expect(bad.status).toBe(400);
      openAIError(await bad.json());
      expect((await post('/reef/scenarios', { description: 'no name' })).status).toBe(400);
      expect((await get('/reef/scenarios')).body.data.map((x: any) => x.name)).toContain('fresh');
    });
  });

  describe('records', () => {
    it('pages through a scenario with the next cursor', async () => {
      const seen: string[] = [];
      let after: string | null = null;
      let pages = 0;
      do {
        const { status, body } = await get(`/reef/scenarios/default/records?limit=2${after ? `&after=${after}` : ''}`);
        expect(status).toBe(200);
        expect(body.data.length).toBeLessThanOrEqual(2);
        for (const r of body.data) {
          expect(r.promptIds).toBeUndefined();
          expect(r.scenario).toBe('default');
        }
        seen.push(...body.data.map((r: any) => r.id));
        after = body.next;
        pages++;
      } while (after !== null);
      expect(seen).toEqual(receipts.default);
      expect(pages).toBe(3);
      const desc = await get('/reef/scenarios/default/records?order=desc&limit=1');
      expect(desc.body.data[0].id).toBe(receipts.default!.at(-1));
      expect((await get('/reef/scenarios/other/records')).body.data.map((r: any) => r.id)).toEqual(receipts.other);
    });

    it('keeps limit within 1..1000 and refuses a cursor it did not hand out', async () => {
      for (const limit of ['0', '1001', 'abc', '2.5', '-1']) {
        const { status, body } = await get(`/reef/scenarios/default/records?limit=${limit}`);
        expect(status, limit).toBe(400);
        expect(openAIError(body).param).toBe('limit');
      }
      expect((await get('/reef/scenarios/default/records?limit=1000')).status).toBe(200);
      const bad = await get('/reef/scenarios/default/records?after=not-a-cursor');
      expect(bad.status).toBe(400);
      openAIError(bad.body);
    });

    it('GET /records/{id} has the payload; an unknown id or the wrong scenario is 404', async () => {
      const id = receipts.default![0]!;
      const { status, body } = await get(`/reef/scenarios/default/records/${id}`);
      expect(status).toBe(200);
      const stored = (await s.gw.store.get(id))!;
      // A keyless gateway's principal is `open`: every record still says who made it.
      expect(body).toMatchObject({ id, scenario: 'default', keyId: 'open', status: 'ok', topK: 4, tags: { turn: '0' }, judgment: null });
      expect(body.promptIds).toEqual(Array.from(stored.promptIds));
      expect(body.outputIds).toEqual(Array.from(stored.outputIds));
      expect(body.logprobs).toEqual(Array.from(stored.logprobs));
      expect(body.topk).toHaveLength(stored.outputIds.length);
      expect(body.topk[0].ids).toEqual(Array.from(stored.topkIds.subarray(0, 4)));
      expect((await get(`/reef/scenarios/default/records/01ZZZZZZZZZZZZZZZZZZZZZZZZ`)).status).toBe(404);
      expect((await get(`/reef/scenarios/other/records/${id}`)).status).toBe(404);
    });
  });

  it('/reef/status reports the gateway and the store', async () => {
    const { status, body } = await get('/reef/status');
    expect(status).toBe(200);
    expect(body.gateway).toEqual({ weightVersion: 'v0', paused: false, inflight: 0 });
    expect(body.store.records).toBeGreaterThanOrEqual(6);
  });

  it('/healthz answers without auth', async () => {
    expect(await get('/healthz')).toEqual({ status: 200, body: { ok: true } });
  });

  it('/metrics exposes requests, latency, tokens, records, commit latency and engine errors', async () => {
    s.engine.options.failWith = 503;
    expect((await postChat(s.url, CHAT)).status).toBe(503);
    s.engine.options.failWith = null;
    const res = await fetch(`${s.url}/metrics`);
    expect(res.status).toBe(200);
    // The format's content type, with its charset: without one, non-ASCII label values read as Latin-1.
    expect(res.headers.get('content-type')).toBe('text/plain; version=0.0.4; charset=utf-8');
    const text = await res.text();
    const value = (re: RegExp) => Number(re.exec(text)?.[1] ?? Number.NaN);
    expect(value(/^reef_http_requests_total\{code="200",route="\/v1\/chat\/completions"\} (\d+)$/m)).toBeGreaterThanOrEqual(6);
    expect(value(/^reef_http_requests_total\{code="503",route="\/v1\/chat\/completions"\} (\d+)$/m)).toBe(1);
    expect(value(/^reef_http_request_duration_seconds_count\{route="\/v1\/chat\/completions"\} (\d+)$/m)).toBeGreaterThanOrEqual(7);
    expect(text).toMatch(/^reef_http_request_duration_seconds_bucket\{route="\/v1\/chat\/completions",le="\+Inf"\} \d+$/m);
    expect(value(/^reef_tokens_total\{kind="completion"\} (\d+)$/m)).toBe(36);
    expect(value(/^reef_tokens_total\{kind="prompt"\} (\d+)$/m)).toBeGreaterThan(0);
    expect(value(/^reef_records_total\{scenario="default",status="ok"\} (\d+)$/m)).toBe(5);
    expect(value(/^reef_records_total\{scenario="other",status="ok"\} (\d+)$/m)).toBe(1);
    expect(value(/^reef_record_commit_seconds_count (\d+)$/m)).toBe(6);
    expect(value(/^reef_engine_errors_total\{kind="generate"\} (\d+)$/m)).toBe(1);
    expect(text).toMatch(/^# TYPE reef_http_request_duration_seconds histogram$/m);
    parsePrometheusText(text);
  });

  it('/metrics counts a request whose client left before its answer, as code 499 (regression: it was not counted at all)', async () => {
    const scrape = async () => {
      const samples = parsePrometheusText(await (await fetch(`${s.url}/metrics`)).text());
      const of = (name: string, labels: Record<string, string>) =>
        samples.find((x) => x.name === name && Object.entries(labels).every(([k, v]) => x.labels[k] === v) && Object.keys(x.labels).length === Object.keys(labels).length)?.value ?? 0;
      return {
        left: of('reef_http_requests_total', { code: '499', route: '/v1/chat/completions' }),
        timed: of('reef_http_request_duration_seconds_count', { route: '/v1/chat/completions' }),
      };
    };
    const before = await scrape();
    const leave = async (body: unknown, whenGoing: () => boolean) => {
      await waitFor(() => s.gw.gate.inflight === 0, { what: 'no generation in flight' });
      const ac = new AbortController();
      const res = fetch(`${s.url}/v1/chat/completions`, { method: 'POST', signal: ac.signal, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => r.arrayBuffer()).catch(() => null);
      await waitFor(whenGoing, { what: 'the request to be with the engine' });
      ac.abort();
      await res;
    };
    s.engine.options.delayMs = () => 60_000;
    s.engine.options.tokenDelayMs = 60_000;
    try {
      await leave(CHAT, () => s.gw.gate.inflight === 1);
      await leave({ ...CHAT, stream: true }, () => s.gw.gate.inflight === 1);
    } finally {
      s.engine.options.delayMs = undefined;
      s.engine.options.tokenDelayMs = 0;
    }
    await waitFor(async () => (await scrape()).left === before.left + 2, { what: 'both requests counted with code 499' });
    expect((await scrape()).timed).toBeGreaterThanOrEqual(before.timed + 2);
  });
});
