import { expect, it } from 'vitest';
import { fetch, request } from 'undici';

/**
 * The engine conformance suite: what Reef relies on from an engine's HTTP API (docs/internals.md,
 * "Engine HTTP API"), checked the same way against the `hf` CPU engine and SGLang.
 *
 * Call it inside a `describe`; the target's fields are read when each test runs, so a `beforeAll`
 * may fill them in after starting the engine.
 */
export interface EngineTarget {
  /** e.g. `http://127.0.0.1:30000`, no trailing slash. */
  baseUrl: string;
  /** The checkpoint the engine serves; reloaded by the weight-update test. */
  modelPath: string;
}

export interface ConformanceOptions {
  /**
   * Also check the `hf` engine's extras: `max_context_length`/`vocab_size` in model_info, and an
   * input at the context length answered with 400.
   * @default false
   */
  hfExtras?: boolean;
}

type Json = Record<string, any>;

async function call(target: EngineTarget, method: 'GET' | 'POST', path: string, body?: unknown): Promise<{ status: number; json: Json | null }> {
  const res = await request(target.baseUrl + path, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, json: text ? (JSON.parse(text) as Json) : null };
}

async function generate(target: EngineTarget, body: Json): Promise<Json> {
  const { status, json } = await call(target, 'POST', '/generate', body);
  expect(status, JSON.stringify(json)).toBe(200);
  return json!;
}

/** The SSE events of a streamed /generate: parsed objects, then the literal `[DONE]`. */
async function generateStream(target: EngineTarget, body: Json): Promise<Array<Json | '[DONE]'>> {
  const res = await fetch(target.baseUrl + '/generate', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type') ?? '').toMatch(/^text\/event-stream/);
  const events: Array<Json | '[DONE]'> = [];
  let buffer = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const payload = line.slice(5).trim();
        events.push(payload === '[DONE]' ? '[DONE]' : (JSON.parse(payload) as Json));
      }
    }
  }
  return events;
}

const PROMPT_IDS = [10, 11, 12, 13, 14, 15, 16, 17];

function greedy(maxNewTokens: number, extra: Json = {}): Json {
  return { input_ids: PROMPT_IDS, sampling_params: { max_new_tokens: maxNewTokens, temperature: 0, ignore_eos: true, ...extra } };
}

function expectLogprobEntry(entry: unknown, id?: number): void {
  expect(Array.isArray(entry) && entry.length === 3).toBe(true);
  const [lp, tid, text] = entry as [unknown, unknown, unknown];
  expect(typeof lp).toBe('number');
  expect(lp as number).toBeLessThanOrEqual(1e-6);
  expect(Number.isInteger(tid)).toBe(true);
  if (id !== undefined) expect(tid).toBe(id);
  expect(text).toBeNull();
}

function expectReplyShape(r: Json, promptTokens: number | null): void {
  expect(typeof r.text).toBe('string');
  expect(Array.isArray(r.output_ids) && r.output_ids.every((x: unknown) => Number.isInteger(x))).toBe(true);
  const m = r.meta_info;
  expect(typeof m.id).toBe('string');
  expect(['stop', 'length', 'abort']).toContain(m.finish_reason.type);
  if (promptTokens !== null) expect(m.prompt_tokens).toBe(promptTokens);
  expect(m.completion_tokens).toBe(r.output_ids.length);
  expect(typeof m.weight_version).toBe('string');
}

export function engineConformance(target: EngineTarget, options: ConformanceOptions = {}): void {
  let initialVersion = '';

  it('answers /health with 200 and describes the model in /model_info', async () => {
    expect((await call(target, 'GET', '/health')).status).toBe(200);
    const { status, json } = await call(target, 'GET', '/model_info');
    expect(status).toBe(200);
    expect(typeof json!.model_path).toBe('string');
    expect(typeof json!.tokenizer_path).toBe('string');
    expect(json!.is_generation).toBe(true);
    expect(typeof json!.weight_version).toBe('string');
    initialVersion = json!.weight_version;
    if (options.hfExtras) {
      expect(Number.isInteger(json!.max_context_length) && json!.max_context_length > 0).toBe(true);
      expect(Number.isInteger(json!.vocab_size) && json!.vocab_size > Math.max(...PROMPT_IDS)).toBe(true);
    }
  });

  it('generates from input_ids and text; max_new_tokens ends with finish_reason length; greedy repeats', async () => {
    const a = await generate(target, { ...greedy(5), rid: 'conformance-a' });
    expectReplyShape(a, PROMPT_IDS.length);
    expect(a.output_ids).toHaveLength(5);
    expect(a.meta_info.finish_reason.type).toBe('length');
    expect(a.meta_info.finish_reason.matched ?? null).toBeNull();
    expect(a.meta_info.id).toBe('conformance-a');
    const b = await generate(target, greedy(5));
    expect(b.output_ids).toEqual(a.output_ids);
    expect(b.text).toBe(a.text);
    const t = await generate(target, { text: 'Hello there', sampling_params: { max_new_tokens: 3, temperature: 0.7, ignore_eos: true } });
    expectReplyShape(t, null);
    expect(t.output_ids).toHaveLength(3);
    expect(t.meta_info.prompt_tokens).toBeGreaterThan(0);
  });

  it('returns per-token logprobs and a sorted top-K that leads with the greedy token', async () => {
    const K = 4;
    const r = await generate(target, { ...greedy(6), return_logprob: true, top_logprobs_num: K });
    const m = r.meta_info;
    expect(m.output_token_logprobs).toHaveLength(r.output_ids.length);
    expect(m.output_top_logprobs).toHaveLength(r.output_ids.length);
    r.output_ids.forEach((id: number, t: number) => {
      expectLogprobEntry(m.output_token_logprobs[t], id);
      const row = m.output_top_logprobs[t] as unknown[][];
      expect(row).toHaveLength(K);
      row.forEach((e) => expectLogprobEntry(e));
      const values = row.map((e) => e[0] as number);
      expect(values).toEqual([...values].sort((x, y) => y - x));
      expect(row[0]![1]).toBe(id);
      expect(Math.abs((row[0]![0] as number) - m.output_token_logprobs[t][0])).toBeLessThan(1e-3);
    });
  });

  it('stops on stop_token_ids with matched = the token id, the token kept in output_ids', async () => {
    const first = await generate(target, greedy(4));
    const stopId = first.output_ids[0] as number;
    const r = await generate(target, greedy(4, { stop_token_ids: [stopId], ignore_eos: false }));
    expect(r.meta_info.finish_reason.type).toBe('stop');
    expect(r.meta_info.finish_reason.matched).toBe(stopId);
    expect(r.output_ids).toEqual([stopId]);
  });

  it('streams cumulative SSE events that end like the non-stream reply, then [DONE]', async () => {
    const body = { ...greedy(6), return_logprob: true, top_logprobs_num: 2 };
    const plain = await generate(target, body);
    const events = await generateStream(target, body);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1) as Json[];
    expect(chunks.length).toBeGreaterThanOrEqual(2);
    expect(chunks.includes('[DONE]' as never)).toBe(false);
    for (let i = 0; i < chunks.length; i++) {
      const c = chunks[i]!;
      expect(c.output_ids.length).toBeGreaterThan(0);
      if (i > 0) expect(c.output_ids.slice(0, chunks[i - 1]!.output_ids.length)).toEqual(chunks[i - 1]!.output_ids);
      if (i < chunks.length - 1) expect(c.meta_info.finish_reason).toBeNull();
    }
    const last = chunks.at(-1)!;
    expectReplyShape(last, PROMPT_IDS.length);
    expect(last.output_ids).toEqual(plain.output_ids);
    expect(last.text).toBe(plain.text);
    expect(last.meta_info.finish_reason.type).toBe('length');
    expect(last.meta_info.output_token_logprobs).toHaveLength(plain.output_ids.length);
    expect(last.meta_info.output_top_logprobs).toHaveLength(plain.output_ids.length);
  });

  it('reloads weights from disk under a new weight_version and rejects a bad path with 400', async () => {
    const before = await generate(target, greedy(4));
    const ok = await call(target, 'POST', '/update_weights_from_disk', { model_path: target.modelPath, weight_version: 'conformance-2' });
    expect(ok.status).toBe(200);
    expect(ok.json).toMatchObject({ success: true, weight_version: 'conformance-2' });
    expect(typeof ok.json!.message).toBe('string');
    expect((await call(target, 'GET', '/model_info')).json!.weight_version).toBe('conformance-2');
    const after = await generate(target, greedy(4));
    expect(after.meta_info.weight_version).toBe('conformance-2');
    expect(after.output_ids).toEqual(before.output_ids);
    const bad = await call(target, 'POST', '/update_weights_from_disk', { model_path: '/nonexistent/reef-model', weight_version: 'never' });
    expect(bad.status).toBe(400);
    expect(bad.json!.success).toBe(false);
    expect(typeof bad.json!.message).toBe('string');
    const back = await call(target, 'POST', '/update_weights_from_disk', { model_path: target.modelPath, weight_version: initialVersion || 'default' });
    expect(back.status).toBe(200);
  });

  it('holds new requests while paused, answers /health, and serves them after continue', async () => {
    expect((await call(target, 'POST', '/pause_generation', {})).status).toBe(200);
    let settled = false;
    const pending = generate(target, greedy(2)).finally(() => { settled = true; });
    try {
      expect((await call(target, 'GET', '/health')).status).toBe(200);
      // Not a timing assertion: whatever the speed, a paused engine must not have answered yet.
      await new Promise((resolve) => setTimeout(resolve, 750));
      expect(settled).toBe(false);
    } finally {
      expect((await call(target, 'POST', '/continue_generation', {})).status).toBe(200);
    }
    const r = await pending;
    expect(r.output_ids).toHaveLength(2);
    expect((await call(target, 'POST', '/flush_cache', {})).status).toBe(200);
  });

  if (options.hfExtras) {
    it('rejects an input at the context length with 400 and a JSON error', async () => {
      const info = (await call(target, 'GET', '/model_info')).json!;
      const { status, json } = await call(target, 'POST', '/generate', { input_ids: new Array(info.max_context_length).fill(10) });
      expect(status).toBe(400);
      expect(typeof json!.error.message).toBe('string');
    });
  }
}
