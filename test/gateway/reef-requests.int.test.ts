import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHAT, openAIError, postChat, startStack, type Stack } from './harness.js';

/** Regressions in how the Reef API reads what a client sends: bodies, fields, query strings. */

describe('Reef API requests', () => {
  let s: Stack;
  const receipts: string[] = [];

  const post = (path: string, body: string | Uint8Array, headers: Record<string, string> = {}) =>
    fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  const reportCount = async (scenario = 'default') => (await s.gw.store.listReports({ scenario, limit: 1000 })).items.length;

  beforeAll(async () => {
    s = await startStack();
    for (let i = 0; i < 3; i++) {
      const res = await postChat(s.url, CHAT, { 'x-reef-scenario': 'default' });
      expect(res.status).toBe(200);
      receipts.push(res.headers.get('x-reef-agent-record-id')!);
    }
  });
  afterAll(async () => {
    await s?.close();
  });

  it('a report or scenario body that is not UTF-8 is 400, not stored with U+FFFD in place of its bad bytes', async () => {
    const before = await reportCount();
    const latin1 = (json: string) => {
      const bytes = Buffer.from(json);
      bytes[bytes.indexOf('_')] = 0xe9;
      return bytes;
    };
    for (const [path, body] of [['/reef/report', '{"score": 1, "feedback": "caf_"}'], ['/reef/scenarios', '{"name": "latin1", "description": "caf_"}']] as const) {
      const res = await post(path, latin1(body));
      expect(res.status, path).toBe(400);
      const err = openAIError(await res.json());
      expect([err.code, err.message]).toEqual(['REEF_ERR_BODY', 'request body is not valid UTF-8']);
    }
    expect(await reportCount()).toBe(before);
    expect(await s.gw.store.getScenario('latin1')).toBeNull();
    // Well-formed UTF-8 beyond ASCII still goes through.
    const ok = await post('/reef/report', Buffer.from('{"score": 1, "feedback": "café 👋"}'));
    expect(ok.status).toBe(201);
    expect((await ok.json()).feedback).toBe('café 👋');
    // Malformed or empty JSON is still told apart.
    expect(openAIError(await (await post('/reef/report', '{"score": ')).json()).message).toMatch(/^request body is not valid JSON/);
    const empty = await post('/reef/report', '');
    expect([empty.status, openAIError(await empty.json()).code]).toEqual([400, 'REEF_ERR_BODY']);
  });

  it('a report whose scenario is not a scenario name is 400, not filed under the default scenario', async () => {
    const before = await reportCount();
    for (const scenario of [5, true, ['default'], { name: 'default' }, 'Not Valid', '']) {
      const res = await post('/reef/report', JSON.stringify({ score: 1, scenario }));
      const body = await res.json();
      expect(res.status, JSON.stringify(scenario)).toBe(400);
      expect(openAIError(body).param).toBe('scenario');
    }
    expect(await reportCount()).toBe(before);
    // null is absent: the header, then the default scenario.
    const res = await post('/reef/report', JSON.stringify({ score: 1, scenario: null }));
    expect([res.status, (await res.json()).scenario]).toEqual([201, 'default']);
  });

  it('a records order other than asc or desc is 400, not the oldest page served as if the newest were asked for', async () => {
    for (const order of ['DESC', 'descending', 'newest', '']) {
      const res = await fetch(`${s.url}/reef/scenarios/default/records?order=${order}&limit=1`);
      const body = await res.json();
      expect(res.status, order).toBe(400);
      expect(openAIError(body).param).toBe('order');
    }
    const desc = await (await fetch(`${s.url}/reef/scenarios/default/records?order=desc&limit=1`)).json();
    expect(desc.data.map((r: { id: string }) => r.id)).toEqual([receipts.at(-1)]);
  });

  it('a scenario description that is not a string is 400, not dropped while the scenario is created without it', async () => {
    for (const description of [5, true, ['about'], { text: 'about' }]) {
      const res = await post('/reef/scenarios', JSON.stringify({ name: 'described', description }));
      const body = await res.json();
      expect(res.status, JSON.stringify(description)).toBe(400);
      expect(openAIError(body).param).toBe('description');
    }
    expect(await s.gw.store.getScenario('described')).toBeNull();
    const res = await post('/reef/scenarios', JSON.stringify({ name: 'described', description: null }));
    expect([res.status, (await res.json()).description]).toEqual([201, null]);
  });

  /** Sends raw bytes on a fresh connection; returns the status line's code, the headers and the body. */
  async function raw(request: string): Promise<{ status: number; head: string; body: string }> {
    const { hostname, port } = new URL(s.url);
    const sock = connect(Number(port), hostname);
    const chunks: Buffer[] = [];
    sock.on('data', (b) => chunks.push(b));
    sock.on('error', () => {});
    await new Promise<void>((resolve) => {
      sock.on('close', () => resolve());
      sock.write(request);
    });
    const text = Buffer.concat(chunks).toString('utf8');
    const [head, body] = [text.slice(0, text.indexOf('\r\n\r\n')), text.slice(text.indexOf('\r\n\r\n') + 4)];
    return { status: Number(/^HTTP\/1\.1 (\d+)/.exec(head)?.[1]), head, body };
  }

  it('headers too large, or a request HTTP cannot parse, get the OpenAI error body (regression: fastify\'s own body)', async () => {
    const big = await raw(`GET /reef/status HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer ${'k'.repeat(20_000)}\r\n\r\n`);
    expect(big.status).toBe(431);
    expect(openAIError(JSON.parse(big.body)).message).toMatch(/header/);
    const bad = await raw('GET /reef/status HTTP/1.1\r\nhost: localhost\r\nx-api-key: a\u0001b\r\n\r\n');
    expect(bad.status).toBe(400);
    openAIError(JSON.parse(bad.body));
  });

  it('a report body over 64 MiB is 413 with the OpenAI body, with the UTF-8 check in front of the JSON parser', async () => {
    const before = await reportCount();
    const body = Buffer.alloc(64 * 1024 * 1024 + 16, 0x20);
    body.write('{"score": 1, "feedback": "', 0);
    body.write('"}', body.length - 2);
    const res = await post('/reef/report', body);
    expect(res.status).toBe(413);
    expect(openAIError(await res.json()).code).toBe('REEF_ERR_TOO_LARGE');
    expect(await reportCount()).toBe(before);
  });
});
