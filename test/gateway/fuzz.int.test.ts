import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Pool } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openAIError, startStack, type Stack } from './harness.js';
import { prng } from '../../actors/runtime/prng.js';

/**
 * Fuzz: ≥ 10,000 generated requests, mostly malformed, from a seeded PRNG, over keep-alive with
 * bounded concurrency. The gateway must never crash, never answer 5xx, answer 2xx only to valid
 * requests, always use the OpenAI error body, and leave a consistent store: every 2xx receipt is a
 * complete record, and there are no other records.
 */

const SEED = Number(process.env.REEF_FUZZ_SEED ?? 0x5eed);
const CASES = 10_000;
const CONCURRENCY = 16;


type Validity = 'valid' | 'invalid' | 'unknown';
interface Case { method: 'POST' | 'GET'; path: string; headers: Record<string, string>; body: Buffer | null; validity: Validity; what: string }

const TOOL = { type: 'function', function: { name: 'save', description: 'save x', parameters: { type: 'object', properties: { x: { type: 'integer' } } } } };
const BASES: Array<() => Record<string, unknown>> = [
  () => ({ model: 'tiny', messages: [{ role: 'user', content: 'Hi there' }] }),
  () => ({ messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: [{ type: 'text', text: 'parts' }] }], temperature: 0.7, max_tokens: 16 }),
  () => ({ messages: [{ role: 'developer', content: 'dev' }, { role: 'user', content: 'call it' }, { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'save', arguments: '{"x":1}' } }] }, { role: 'tool', tool_call_id: 'call_1', content: 'saved' }], tools: [TOOL], tool_choice: 'auto' }),
  () => ({ messages: [{ role: 'user', content: 'stream' }], stream: true, stream_options: { include_usage: true }, max_completion_tokens: 8, stop: ['\n'] }),
];

/** Typed fields and values that break them (each is certainly rejected). */
const WRONG: Array<[string[], unknown[]]> = [
  [['messages'], [null, 'hi', 42, {}, [], [null], [1, 2], [{ role: 'user' }], [{ role: 'robot', content: 'x' }], [{ role: 'user', content: 7 }], [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }]]],
  [['temperature'], ['hot', -1, 2.5, 1e308, true, [], {}]],
  [['top_p'], [0, -0.5, 1.5, 'x', false]],
  [['top_k'], [0, -2, 2.5, '20', true, 2 ** 53]],
  [['max_tokens'], [0, -5, 1.5, 1e20, 2 ** 53, 'ten', 1e9, 5000]],
  [['max_completion_tokens'], [0, 3.3, 'x', 1e300]],
  [['n'], [2, 0, -1, 1e9, 'one', 1.5]],
  [['stream'], ['yes', 1, 0, {}, []]],
  [['stop'], [5, ['a', 'b', 'c', 'd', 'e'], [1], {}]],
  [['tools'], ['x', 5, [{}], [{ type: 'function' }], [{ type: 'retrieval', function: { name: 'a' } }], [{ type: 'function', function: { name: '' } }]]],
  [['tool_choice'], ['sometimes', 5, { type: 'function' }]],
  [['seed'], [1.5, 'x', 1e300]],
  [['stream_options'], ['x', 5, []]],
  [['model'], [5, {}, []]],
];

const CONTENT_TYPES_BAD = ['text/plain', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'application/xml', 'image/png', ''];

const DEEP = '"__deep__"';

/** JSON text nested `depth` levels (built as text: JSON.stringify itself overflows past a few thousand). */
function deep(depth: number, r: () => number): string {
  let open = '';
  let close = '';
  for (let i = 0; i < depth; i++) {
    const arr = r() < 0.5;
    open += arr ? '[' : '{"k":';
    close = (arr ? ']' : '}') + close;
  }
  return open + (r() < 0.5 ? '1' : '"leaf"') + close;
}

function generate(r: () => number, i: number): Case {
  const pick = <T,>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
  const body = pick(BASES)();
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  let validity: Validity = 'valid';
  let what = 'base';
  let raw: Buffer | null = null;
  let deepText: string | null = null;
  const op = r();
  if (op < 0.1) {
    what = 'valid';
  } else if (op < 0.3) {
    const [path, values] = pick(WRONG);
    body[path[0]!] = pick(values);
    // max_completion_tokens wins over max_tokens, which would make a too-large max_tokens moot.
    if (path[0] === 'max_tokens') delete body.max_completion_tokens;
    what = `wrong ${path[0]}`;
    validity = 'invalid';
  } else if (op < 0.38) {
    delete body.messages;
    what = 'missing messages';
    validity = 'invalid';
  } else if (op < 0.44) {
    const keys = Object.keys(body).filter((k) => k !== 'messages');
    if (keys.length) delete body[pick(keys)];
    what = 'missing optional';
  } else if (op < 0.52) {
    // Deep nesting where the schema ignores it (an unknown field) or where it breaks a typed one.
    const depth = pick([10, 100, 1000, 5000, 20000]);
    deepText = deep(depth, r);
    const where = r();
    if (where < 0.25) {
      const report = Buffer.from(`{"score": 1, "metadata": {"m": ${deepText}}}`);
      return { method: 'POST', path: '/reef/report', headers, body: report, validity: depth > 100 ? 'invalid' : 'valid', what: `deep report metadata ${depth}` };
    }
    if (where < 0.6) {
      body.extra = '__deep__';
      what = `deep unknown field ${depth}`;
      validity = 'unknown';
    } else {
      body.messages = [{ role: 'user', content: '__deep__' }];
      what = `deep content ${depth}`;
      validity = 'invalid';
    }
  } else if (op < 0.62) {
    const text = JSON.stringify(body);
    const cut = 1 + Math.floor(r() * (text.length - 2));
    raw = Buffer.from(text.slice(0, cut));
    what = 'truncated';
    validity = 'invalid';
  } else if (op < 0.7) {
    const buf = Buffer.from(JSON.stringify(body));
    const n = 1 + Math.floor(r() * 6);
    for (let k = 0; k < n; k++) buf[Math.floor(r() * buf.length)] = 0x80 + Math.floor(r() * 0x80);
    raw = buf;
    what = 'invalid utf-8';
    validity = 'unknown';
  } else if (op < 0.77) {
    headers['content-type'] = pick(CONTENT_TYPES_BAD);
    if (!headers['content-type']) delete headers['content-type'];
    what = `content-type ${headers['content-type'] ?? 'none'}`;
    validity = 'invalid';
  } else if (op < 0.84) {
    const scenario = pick(['good-one', 'a', 'UPPER', '-lead', 'x'.repeat(65), 'sp ace', 'ok.name_1', '']);
    headers['x-reef-scenario'] = scenario;
    what = `scenario ${scenario}`;
    validity = scenario === '' || /^[a-z0-9][a-z0-9._-]{0,63}$/.test(scenario) ? 'valid' : 'invalid';
  } else if (op < 0.9) {
    for (let k = 0; k < 1 + Math.floor(r() * 5); k++) {
      const name = pick(['x-reef-tag-', 'x-random-', 'authorization', 'x-api-key', 'accept', 'user-agent']);
      headers[name.endsWith('-') ? `${name}${Math.floor(r() * 1e6).toString(36)}` : name] = Math.floor(r() * 1e12).toString(36) + pick(['', ' ', '=', '%00', '\u00e9']);
    }
    what = 'random headers';
  } else if (op < 0.95) {
    const proto = pick(['{"__proto__": {"x": 1}, "messages": []}', '{"constructor": {"prototype": {"x": 1}}}', '[]', 'null', '"str"', '1e999', '{}', '{"messages": [{"role": "user", "content": "a", "__proto__": {"role": "tool"}}]}']);
    raw = Buffer.from(proto);
    what = `odd json ${proto.slice(0, 20)}`;
    validity = 'invalid';
  } else {
    const [method, path] = pick([['GET', '/v1/chat/completions'], ['POST', '/v1/chat/completion'], ['POST', '/reef/report'], ['GET', '/reef/scenarios/%ff/records'], ['GET', '/reef/scenarios/default/records?limit=abc'], ['POST', '/reef/scenarios']] as const);
    return { method, path, headers, body: method === 'POST' ? Buffer.from(JSON.stringify(body)) : null, validity: 'invalid', what: `${method} ${path}` };
  }
  void i;
  if (deepText !== null) raw = Buffer.from(JSON.stringify(body).replace(DEEP, deepText));
  return { method: 'POST', path: '/v1/chat/completions', headers, body: raw ?? Buffer.from(JSON.stringify(body)), validity, what };
}

describe('gateway fuzz', () => {
  let s: Stack;
  let pool: Pool;

  beforeAll(async () => {
    // A low inline bound: bodies over 160 bytes go through the tokenizer workers, shorter ones are
    // prepared on the event loop, so both paths meet the malformed requests.
    s = await startStack({ tokenizerThreads: 2, inlinePrepareBytes: 160 });
    pool = new Pool(s.url, { connections: CONCURRENCY, pipelining: 1, keepAliveTimeout: 30_000 });
  });
  afterAll(async () => {
    await pool?.close();
    await s?.close();
  });

  it(`${CASES} generated requests: no crash, no 5xx, 2xx only when valid, OpenAI errors, consistent store`, async () => {
    const r = prng(SEED);
    const cases = Array.from({ length: CASES }, (_, i) => generate(r, i));
    const failures: string[] = [];
    const receipts = new Set<string>();
    const tally = new Map<string, number>();
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < cases.length; i = next++) {
        const c = cases[i]!;
        const res = await pool.request({ method: c.method, path: c.path, headers: c.headers, body: c.body });
        const text = await res.body.text();
        const code = res.statusCode;
        tally.set(`${Math.floor(code / 100)}xx`, (tally.get(`${Math.floor(code / 100)}xx`) ?? 0) + 1);
        const tag = `#${i} ${c.what} → ${code}: ${text.slice(0, 200)}`;
        if (code >= 500) failures.push(`5xx ${tag}`);
        else if (code >= 200 && code < 300) {
          if (c.validity === 'invalid') failures.push(`2xx for an invalid request ${tag}`);
          if (c.path !== '/v1/chat/completions') continue;
          let id: string | undefined;
          // Decided by the answer: a mutation may have corrupted the `stream` flag.
          if (String(res.headers['content-type']).startsWith('text/event-stream')) {
            const events = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
            if (events.at(-1) !== '[DONE]') failures.push(`stream without [DONE] ${tag}`);
            id = (JSON.parse(events.at(-2) ?? '{}') as { reef?: { agent_record_id?: string } }).reef?.agent_record_id;
          } else {
            id = res.headers['x-reef-agent-record-id'] as string | undefined;
          }
          if (!id) failures.push(`2xx without a receipt ${tag}`);
          else receipts.add(id);
        } else {
          if (c.validity === 'valid') failures.push(`4xx for a valid request ${tag}`);
          try {
            openAIError(JSON.parse(text));
          } catch (err) {
            failures.push(`bad error body ${tag} (${(err as Error).message})`);
          }
        }
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, worker));
    expect(failures.slice(0, 20)).toEqual([]);
    expect(tally.get('2xx')).toBeGreaterThan(CASES * 0.15);
    expect(tally.get('4xx')).toBeGreaterThan(CASES * 0.5);

    // Still alive and answering.
    expect((await pool.request({ method: 'GET', path: '/healthz' })).statusCode).toBe(200);

    // Every receipt is a complete record, and nothing else was recorded.
    expect(await s.gw.store.headOffset()).toBe(receipts.size);
    for (const id of receipts) {
      const rec = await s.gw.store.get(id);
      expect(rec, id).not.toBeNull();
      expect(rec!.status).toBe('ok');
      expect(rec!.promptIds.length).toBe(rec!.usage.promptTokens);
      expect(rec!.outputIds.length).toBe(rec!.usage.completionTokens);
      expect(rec!.outputIds.length).toBeGreaterThan(0);
      expect(rec!.logprobs.length).toBe(rec!.outputIds.length);
      expect(rec!.topkIds.length).toBe(rec!.outputIds.length * 4);
    }
    const db = new Database(join(s.dataDir, 'records.sqlite'), { readonly: true });
    try {
      expect(db.pragma('integrity_check', { simple: true })).toBe('ok');
    } finally {
      db.close();
    }
    expect(s.gw.metrics.render()).not.toMatch(/code="5\d\d"/);
  });
});
