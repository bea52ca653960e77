import diagnostics from 'node:diagnostics_channel';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { FakeGeneration } from '../helpers/fake-engine.js';
import { CHAT, postChat, readSse, startStack, type Stack } from './harness.js';

/**
 * The completion paths end to end: real HTTP, tokenizer pool, SQLite store, fake engine. The fake
 * engine answers by the last user message, so each test picks its output by what it asks.
 */

const TOOL_CALL = ['<tool_call>', '\n{"name": "save", ', '"arguments": {"x": 1}}', '\n</tool_call>'];
const THINKING = ['<think>', 'pondering', ' deeply', '</think>', '\n\n', 'The', ' answer', '.'];
const LONG = Array.from({ length: 40 }, (_, i) => ` w${i}`);

// Short requests are prepared on the event loop and long ones on a tokenizer worker
// (INLINE_PREPARE_BYTES); `worker` sends every request through the worker path.
describe.each([['inline', undefined], ['worker', 0]] as const)('gateway completions (%s prepare)', (_mode, inlinePrepareBytes) => {
  let s: Stack;
  /** Prompt ids → output: the fake engine sees only ids, so a test scripts its output by prompt. */
  const byPrompt = new Map<string, FakeGeneration>();
  let engineResponsesFinished = 0;

  beforeAll(async () => {
    s = await startStack({
      inlinePrepareBytes,
      engine: {
        respond: ({ inputIds }) => byPrompt.get(String(inputIds)) ?? { pieces: ['Hello', ' from', ' the', ' fake', ' engine', '.'] },
      },
    });
    s.engine.server.on('request', (_req, res) => res.on('finish', () => engineResponsesFinished++));
  });
  afterAll(async () => {
    await s?.close();
  });

  /** Renders a prompt once (a throwaway request) to learn its ids, then scripts the output for them. */
  async function scripted(messages: unknown[], pieces: string[], extra: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
    const res = await postChat(s.url, { model: 'tiny', messages, max_tokens: 4, ...extra, stream: false });
    expect(res.status).toBe(200);
    byPrompt.set(String(s.engine.requests.at(-1)!.input_ids), { pieces });
    return { model: 'tiny', messages, ...extra };
  }

  it('non-streamed: OpenAI body, receipt header, and a record holding exactly what the engine saw and said', async () => {
    const before = s.engine.requests.length;
    const res = await postChat(s.url, { ...CHAT, temperature: 0.5, top_k: 20, max_tokens: 32 }, { 'x-reef-tag-session': 'abc', 'x-reef-tag-user': 'u1', 'x-reef-scenario': 'coding' });
    expect(res.status).toBe(200);
    const body = (await res.json()) as Record<string, any>;
    const id = res.headers.get('x-reef-agent-record-id')!;
    expect(id).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);
    expect(body).toMatchObject({
      object: 'chat.completion',
      model: 'tiny',
      choices: [{ index: 0, message: { role: 'assistant', content: 'Hello from the fake engine.' }, finish_reason: 'stop' }],
    });
    expect(body.id).toBe(`chatcmpl-${id}`);
    expect(typeof body.created).toBe('number');
    expect(body.choices[0].message.tool_calls).toBeUndefined();

    expect(s.engine.requests.length).toBe(before + 1);
    const sent = s.engine.requests.at(-1)! as Record<string, any>;
    expect(sent.top_logprobs_num).toBe(4);
    expect(sent.return_logprob).toBe(true);
    expect(sent.sampling_params.temperature).toBe(0.5);
    expect(sent.sampling_params.top_k).toBe(20);
    expect(sent.sampling_params.max_new_tokens).toBe(32);

    const rec = (await s.gw.store.get(id))!;
    expect(rec).not.toBeNull();
    expect(Array.from(rec.promptIds)).toEqual(sent.input_ids);
    expect(body.usage).toEqual({ prompt_tokens: sent.input_ids.length, completion_tokens: 6, total_tokens: sent.input_ids.length + 6 });
    // What the fake engine answered for this request (it is deterministic in the pieces).
    const engineReply = await fetch(`${s.engine.url}/generate`, { method: 'POST', body: JSON.stringify({ ...sent, stream: false }) }).then((r) => r.json() as Promise<any>);
    expect(Array.from(rec.outputIds)).toEqual(engineReply.output_ids);
    expect(Array.from(rec.logprobs)).toEqual(engineReply.meta_info.output_token_logprobs.map((e: number[]) => Math.fround(e[0]!)));
    expect(rec.topK).toBe(4);
    const tops = engineReply.meta_info.output_top_logprobs as number[][][];
    expect(Array.from(rec.topkIds)).toEqual(tops.flatMap((row) => row.map((e) => e[1])));
    expect(Array.from(rec.topkLogprobs)).toEqual(tops.flatMap((row) => row.map((e) => Math.fround(e[0]!))));
    expect(rec).toMatchObject({
      scenario: 'coding',
      status: 'ok',
      tags: { session: 'abc', user: 'u1' },
      finishReason: 'stop',
      weightVersion: 'v0',
      usage: { promptTokens: sent.input_ids.length, completionTokens: 6 },
      error: null,
      response: { role: 'assistant', content: 'Hello from the fake engine.' },
    });
    expect(rec.request.messages).toEqual(CHAT.messages);
    expect(rec.request.params).toMatchObject({ temperature: 0.5, top_k: 20, max_tokens: 32, model: 'tiny' });
    expect(rec.finishedAt).toBeGreaterThanOrEqual(rec.startedAt);
  });

  it('records the default scenario when x-reef-scenario is absent', async () => {
    const res = await postChat(s.url, CHAT);
    const rec = (await s.gw.store.get(res.headers.get('x-reef-agent-record-id')!))!;
    expect(rec.scenario).toBe('default');
    expect(rec.tags).toEqual({});
  });

  it('takes a body with a UTF-8 byte-order mark, and its record reads back as it was served (regression: the stored body kept the mark); refuses a malformed byte', async () => {
    const body = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(JSON.stringify(CHAT))]);
    const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    expect(res.status).toBe(200);
    const rec = (await s.gw.store.get(res.headers.get('x-reef-agent-record-id')!))!;
    expect(rec.request.messages).toEqual(CHAT.messages);
    // A malformed byte inside a string is refused: as U+FFFD the prompt served would not be the bytes recorded.
    const bad = Buffer.concat([Buffer.from('{"messages": [{"role": "user", "content": "a'), Buffer.from([0xff]), Buffer.from('b"}]}')]);
    const res2 = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: bad });
    expect(res2.status).toBe(400);
    expect(res2.headers.get('x-reef-agent-record-id')).toBeNull();
  });

  it('a session\'s growing transcript: every turn sends and records exactly its own prompt ids (bodies built on the last turn\'s, in its memory)', async () => {
    const messages: Array<Record<string, unknown>> = [{ role: 'system', content: 'You are a meticulous agent. '.repeat(140) }];
    for (let turn = 0; turn < 5; turn++) {
      messages.push({ role: 'user', content: `step ${turn}: ${'détail '.repeat(turn * 8)}` });
      const res = await postChat(s.url, { model: 'tiny', messages, max_tokens: 4, stream: turn % 2 === 0 }, { 'x-reef-tag-session': 'growing' });
      expect(res.status).toBe(200);
      const text = await res.text();
      const id = res.headers.get('x-reef-agent-record-id') ?? /"agent_record_id":"([^"]+)"/.exec(text)![1]!;
      const sent = s.engine.requests.at(-1)!;
      const rec = (await s.gw.store.get(id))!;
      expect(Array.from(rec.promptIds)).toEqual(sent.input_ids);
      expect(sent.input_ids.length).toBe(rec.usage.promptTokens);
      messages.push({ role: 'assistant', content: `done ${turn}` });
    }
  });

  it('stages a long record only once the engine request has been written, so that staging never holds it back', async () => {
    const order: string[] = [];
    const sent = ({ request: r }: { request: { path: string } }) => {
      if (r.path === '/generate') order.push('engine request sent');
    };
    diagnostics.subscribe('undici:client:sendHeaders', sent as never);
    const stage = s.gw.store.stage.bind(s.gw.store);
    s.gw.store.stage = (payloads) => (order.push('staged'), stage(payloads));
    try {
      const messages = [{ role: 'system', content: 'You are a meticulous agent. '.repeat(200) }, { role: 'user', content: 'go' }];
      // On a connection still to be opened the write waits for the connect; agents keep theirs open.
      await (await postChat(s.url, { model: 'tiny', messages: [{ role: 'user', content: 'warm-up' }], max_tokens: 1 })).text();
      for (const stream of [false, true]) {
        for (const session of ['first', 'first']) {
          order.length = 0;
          const res = await postChat(s.url, { model: 'tiny', messages, max_tokens: 4, stream }, { 'x-reef-tag-session': session });
          const text = await res.text();
          expect(res.status, text).toBe(200);
          expect(order).toEqual(['engine request sent', 'staged']);
        }
      }
    } finally {
      diagnostics.unsubscribe('undici:client:sendHeaders', sent as never);
      s.gw.store.stage = stage;
    }
  });

  it('takes a chunked upload (no content-length) split anywhere, and records it as sent', async () => {
    const messages = [{ role: 'system', content: 'Be brief. '.repeat(300) }, { role: 'user', content: 'héllo 😀' }];
    const bytes = Buffer.from(JSON.stringify({ model: 'tiny', messages, max_tokens: 4 }));
    // Uneven pieces, one of them splitting a multi-byte character.
    const cuts = [0, 1, 700, bytes.indexOf('😀') + 2, bytes.length - 3, bytes.length];
    async function* pieces() {
      for (let i = 1; i < cuts.length; i++) yield bytes.subarray(cuts[i - 1], cuts[i]);
    }
    const res = await request(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: pieces() });
    const text = await res.body.text();
    expect(res.statusCode, text).toBe(200);
    const rec = (await s.gw.store.get(res.headers['x-reef-agent-record-id'] as string))!;
    expect(rec.request.messages).toEqual(messages);
    const sent = s.engine.requests.at(-1)!;
    expect(Array.from(rec.promptIds)).toEqual(sent.input_ids);
  });

  it('streams chunks while the engine is still generating; the receipt follows the commit and precedes [DONE]', async () => {
    const req = await scripted([{ role: 'user', content: 'stream me a long one' }], LONG);
    s.engine.options.tokenDelayMs = 20;
    const finishedAtStart = engineResponsesFinished;
    let engineFinishedAtFirstContent: boolean | null = null;
    let recordAtReceipt: unknown = undefined;
    try {
      const res = await postChat(s.url, { ...req, stream: true, stream_options: { include_usage: true } });
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
      const events = await readSse(res, async (data) => {
        if (data === '[DONE]') return;
        const c = JSON.parse(data);
        if (engineFinishedAtFirstContent === null && c.choices[0]?.delta?.content) engineFinishedAtFirstContent = engineResponsesFinished > finishedAtStart;
        if (c.reef) {
          recordAtReceipt = await s.gw.store.get(c.reef.agent_record_id);
          const viaHttp = await fetch(`${s.url}/reef/scenarios/default/records/${c.reef.agent_record_id}`);
          expect(viaHttp.status).toBe(200);
        }
      });
      expect(engineFinishedAtFirstContent).toBe(false);
      expect(events.at(-1)).toBe('[DONE]');
      const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
      expect(chunks[0].choices[0].delta.role).toBe('assistant');
      const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
      expect(text).toBe(LONG.join('').trim());
      const finish = chunks.findIndex((c) => c.choices[0]?.finish_reason);
      expect(chunks[finish].choices[0].finish_reason).toBe('stop');
      const usage = chunks[finish + 1];
      expect(usage.choices).toEqual([]);
      expect(usage.usage).toMatchObject({ completion_tokens: LONG.length });
      const receipt = chunks[finish + 2];
      expect(receipt.choices).toEqual([]);
      expect(receipt.reef.agent_record_id).toMatch(/^[0-9A-Z]{26}$/);
      expect(chunks.length).toBe(finish + 3);
      expect(recordAtReceipt).toMatchObject({ id: receipt.reef.agent_record_id, status: 'ok', usage: { completionTokens: LONG.length } });
      expect(receipt.id).toBe(chunks[0].id);
    } finally {
      s.engine.options.tokenDelayMs = 0;
    }
  });

  it('a stop string SGLang trims from its last event only never reaches a streaming client in part', async () => {
    // The engine's events carry `</ans` before the final one cuts the text at `</answer>`.
    const req = await scripted([{ role: 'user', content: 'answer, then stop' }], ['Hello', ' world', '</ans', 'wer>', ' more'], { stop: ['</answer>'] });
    s.engine.options.tokenDelayMs = 20; // one event at a time, not coalesced into the last
    let streamed: any[];
    try {
      streamed = (await readSse(await postChat(s.url, { ...req, stream: true }))).slice(0, -1).map((e) => JSON.parse(e));
    } finally {
      s.engine.options.tokenDelayMs = 0;
    }
    const content = streamed.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    expect(streamed.filter((c) => c.choices[0]?.delta?.content).length).toBeGreaterThan(1);
    const whole = (await (await postChat(s.url, req)).json()) as any;
    expect(whole.choices[0].message.content).toBe('Hello world');
    expect(content).toBe('Hello world');
  });

  it('a stream without include_usage has no usage chunk', async () => {
    const events = await readSse(await postChat(s.url, { ...CHAT, stream: true }));
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    expect(chunks.filter((c) => c.usage)).toEqual([]);
    expect(chunks.at(-1).reef.agent_record_id).toBeTruthy();
  });

  it('tool calls become tool_calls with id/type/function and finish_reason tool_calls (not streamed)', async () => {
    const req = await scripted([{ role: 'user', content: 'save x please' }], TOOL_CALL, { tools: [{ type: 'function', function: { name: 'save', parameters: { type: 'object' } } }] });
    const res = await postChat(s.url, req);
    const body = (await res.json()) as any;
    expect(body.choices[0].finish_reason).toBe('tool_calls');
    const call = body.choices[0].message.tool_calls[0];
    expect(call).toMatchObject({ type: 'function', function: { name: 'save' } });
    expect(call.id).toMatch(/^call_/);
    expect(JSON.parse(call.function.arguments)).toEqual({ x: 1 });
    expect(body.choices[0].message.content).toBeNull();
    const rec = (await s.gw.store.get(res.headers.get('x-reef-agent-record-id')!))!;
    expect((rec.response as any).tool_calls).toEqual([call]);
  });

  it('streamed tool calls: the record keeps the tool_call ids the client saw (regression: the record re-parsed with fresh ids)', async () => {
    const req = await scripted([{ role: 'user', content: 'save x, streamed' }], TOOL_CALL, { tools: [{ type: 'function', function: { name: 'save' } }] });
    const events = await readSse(await postChat(s.url, { ...req, stream: true }));
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    const calls = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ index: 0, type: 'function', function: { name: 'save' } });
    expect(calls[0].id).toMatch(/^call_/);
    expect(JSON.parse(calls[0].function.arguments)).toEqual({ x: 1 });
    expect(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0].finish_reason).toBe('tool_calls');
    const rec = (await s.gw.store.get(chunks.at(-1).reef.agent_record_id))!;
    expect((rec.response as any).tool_calls).toEqual([{ id: calls[0].id, type: 'function', function: calls[0].function }]);
  });

  it('tool-call markup stays content when the request offered no tools or said tool_choice "none", streamed and not', async () => {
    const markup = TOOL_CALL.join('');
    const tools = [{ type: 'function', function: { name: 'save' } }];
    for (const extra of [{}, { tools, tool_choice: 'none' }]) {
      const req = await scripted([{ role: 'user', content: `save x, with ${Object.keys(extra).join(' and ') || 'no tools'}` }], TOOL_CALL, extra);
      const res = await postChat(s.url, req);
      const body = (await res.json()) as any;
      expect(body.choices[0].message.content).toBe(markup);
      expect(body.choices[0].message.tool_calls).toBeUndefined();
      expect(body.choices[0].finish_reason).toBe('stop');
      const rec = (await s.gw.store.get(res.headers.get('x-reef-agent-record-id')!))!;
      // The reply's message is the recorded one with the SDK's required refusal: null.
      expect(body.choices[0].message).toEqual({ ...(rec.response as object), refusal: null });
      const events = await readSse(await postChat(s.url, { ...req, stream: true }));
      const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
      expect(chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? [])).toEqual([]);
      expect(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('')).toBe(markup);
      expect(chunks.find((c) => c.choices[0]?.finish_reason)?.choices[0].finish_reason).toBe('stop');
    }
  });

  it('<think> becomes reasoning_content, streamed and not', async () => {
    const req = await scripted([{ role: 'user', content: 'think first' }], THINKING);
    const body = (await (await postChat(s.url, req)).json()) as any;
    expect(body.choices[0].message).toMatchObject({ reasoning_content: 'pondering deeply', content: 'The answer.' });
    const events = await readSse(await postChat(s.url, { ...req, stream: true }));
    const deltas = events.slice(0, -1).map((e) => JSON.parse(e).choices[0]?.delta ?? {});
    expect(deltas.map((d) => d.reasoning_content ?? '').join('')).toBe('pondering deeply');
    expect(deltas.map((d) => d.content ?? '').join('')).toBe('The answer.');
  });

  it('GET /v1/models lists the model', async () => {
    const body = (await (await fetch(`${s.url}/v1/models`)).json()) as any;
    expect(body.object).toBe('list');
    expect(body.data[0]).toMatchObject({ id: 'tiny-model', object: 'model', max_model_len: 4096 });
  });

  it('GET /v1/models/{model} answers the served model, and 404 for another (regression: 404 for both)', async () => {
    const list = (await (await fetch(`${s.url}/v1/models`)).json()) as any;
    const one = await fetch(`${s.url}/v1/models/tiny-model`);
    expect(one.status).toBe(200);
    expect(await one.json()).toEqual(list.data[0]);
    const other = await fetch(`${s.url}/v1/models/gpt-4o`);
    expect(other.status).toBe(404);
    expect(await other.json()).toEqual({ error: { message: 'model "gpt-4o" (this gateway serves "tiny-model") not found', type: 'not_found_error', param: 'model', code: 'REEF_ERR_NOT_FOUND' } });
  });
});
