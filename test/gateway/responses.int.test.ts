import OpenAI from 'openai';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { Correlator } from '../../actors/judge/correlate/correlator.js';
import type { CorrelationEvent } from '../../actors/judge/correlate/types.js';
import type { FakeGeneration } from '../helpers/fake-engine.js';
import { postChat, startStack, type Stack } from './harness.js';

/**
 * The Responses API through the real gateway, driven by the official openai client: what it
 * answers, streamed and not, what it records (the same ids as the chat completion of the same
 * conversation), and how previous_response_id chains become one session for the judge.
 */

const KEY_A = 'responses-test-key-a-0123456789ab';
const KEY_B = 'responses-test-key-b-0123456789ab';
const KEY_ONE = 'responses-test-key-one-slot-0123456';
const TOOL_CALL = ['<tool_call>', '\n{"name": "save", ', '"arguments": {"x": 1}}', '\n</tool_call>'];
const THINKING = ['<think>', 'pondering', ' deeply', '</think>', '\n\n', 'The', ' answer', '.'];
const SAVE = { type: 'function' as const, name: 'save', description: 'Saves x', parameters: { type: 'object', properties: { x: { type: 'number' } } }, strict: false };

describe('/v1/responses', () => {
  let s: Stack;
  let a: OpenAI;
  let b: OpenAI;
  /** What the fake engine answers next, in order; the default after. */
  const script: FakeGeneration[] = [];

  beforeAll(async () => {
    s = await startStack({
      apiKeys: [{ key: KEY_A }, { key: KEY_B }, { key: KEY_ONE, max_concurrency: 1 }],
      engine: { respond: () => script.shift() ?? { pieces: ['Hello', ' from', ' the', ' fake', ' engine', '.'] } },
    });
    a = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY_A, maxRetries: 0 });
    b = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY_B, maxRetries: 0 });
  });
  afterAll(async () => {
    await s?.close();
  });
  beforeEach(() => {
    script.length = 0;
    Object.assign(s.engine.options, { tokenDelayMs: 0, failWith: null, dieAfterTokens: null });
  });

  const record = async (id: string) => (await s.gw.store.get(id))!;

  it('answers a string input with a message, usage and the receipt, and records the chat completion it stands for', async () => {
    const { data, response } = await a.responses.create({ model: 'tiny', instructions: 'Be brief.', input: 'Hello there', max_output_tokens: 32 }).withResponse();
    const recordId = response.headers.get('x-reef-agent-record-id')!;
    expect(data.id).toBe(`resp_${recordId}`);
    expect(data).toMatchObject({ object: 'response', status: 'completed', model: 'tiny', instructions: 'Be brief.', max_output_tokens: 32, previous_response_id: null, store: true, incomplete_details: null, error: null });
    expect(data.output).toEqual([{ id: `msg_${recordId}_0`, type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'Hello from the fake engine.', annotations: [], logprobs: [] }] }]);
    expect(data.output_text).toBe('Hello from the fake engine.');
    const rec = await record(recordId);
    expect(data.usage).toMatchObject({ input_tokens: rec.promptIds.length, output_tokens: 6, total_tokens: rec.promptIds.length + 6 });
    expect(rec.status).toBe('ok');
    expect(rec.tags).toEqual({ session: data.id });
    expect(rec.request.messages).toEqual([{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello there' }]);
  });

  it('records the same prompt and completion ids as the chat completion of the same conversation', async () => {
    const tools = [SAVE];
    const history = [
      { role: 'user' as const, content: 'save one' },
      { type: 'function_call' as const, call_id: 'call_1', name: 'save', arguments: '{"x": 1}' },
      { type: 'function_call_output' as const, call_id: 'call_1', output: 'saved' },
      { role: 'user' as const, content: 'and now?' },
    ];
    script.push({ pieces: ['Done', '.'] }, { pieces: ['Done', '.'] });
    const viaResponses = await a.responses.create({ model: 'tiny', instructions: 'You save things.', input: history, tools, temperature: 0.5 }).withResponse();
    const chat = await postChat(s.url, {
      model: 'tiny',
      temperature: 0.5,
      tools: [{ type: 'function', function: { name: 'save', description: 'Saves x', parameters: SAVE.parameters, strict: false } }],
      messages: [
        { role: 'system', content: 'You save things.' },
        { role: 'user', content: 'save one' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'save', arguments: '{"x": 1}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: 'saved' },
        { role: 'user', content: 'and now?' },
      ],
    }, { authorization: `Bearer ${KEY_A}` });
    expect(chat.status).toBe(200);
    const r1 = await record(viaResponses.response.headers.get('x-reef-agent-record-id')!);
    const r2 = await record(chat.headers.get('x-reef-agent-record-id')!);
    expect(r1.promptIds.length).toBeGreaterThan(20);
    expect(Array.from(r1.promptIds)).toEqual(Array.from(r2.promptIds));
    expect(Array.from(r1.outputIds)).toEqual(Array.from(r2.outputIds));
    expect(r1.response).toEqual(r2.response);
    expect(viaResponses.data.output_text).toBe('Done.');
  });

  it('gives reasoning as a reasoning item before the message, streamed and not, with the Responses event sequence', async () => {
    script.push({ pieces: THINKING }, { pieces: THINKING });
    const plain = await a.responses.create({ model: 'tiny', input: 'think first' });
    expect(plain.output.map((o) => o.type)).toEqual(['reasoning', 'message']);
    expect(plain.output[0]).toMatchObject({ type: 'reasoning', summary: [], content: [{ type: 'reasoning_text', text: 'pondering deeply' }] });
    expect(plain.output_text).toBe('The answer.');

    const stream = await a.responses.create({ model: 'tiny', input: 'think first', stream: true });
    const events: Record<string, any>[] = [];
    for await (const e of stream) events.push(e as unknown as Record<string, any>);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const types = events.map((e) => e.type).filter((t, i, all) => !(t.endsWith('.delta') && all[i - 1] === t));
    expect(types).toEqual([
      'response.created', 'response.in_progress',
      'response.output_item.added', 'response.content_part.added', 'response.reasoning_text.delta', 'response.reasoning_text.done', 'response.content_part.done', 'response.output_item.done',
      'response.output_item.added', 'response.content_part.added', 'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done',
      'response.completed',
    ]);
    const done = events.at(-1)!;
    const recordId = done.reef.agent_record_id as string;
    expect(done.response.id).toBe(`resp_${recordId}`);
    const strip = (items: unknown[]) => JSON.parse(JSON.stringify(items).replace(/_[0-9A-Z]{26}_/g, '_ID_'));
    expect(strip(done.response.output)).toEqual(strip(plain.output));
    expect((await record(recordId)).response).toEqual({ role: 'assistant', content: 'The answer.', reasoning_content: 'pondering deeply' });
    // What was stored is what the stream completed with.
    expect(await a.responses.retrieve(done.response.id)).toMatchObject({ id: done.response.id, output: done.response.output, status: 'completed' });
  });

  it('runs a function tool round trip over previous_response_id, streamed, as one session the judge binds', async () => {
    script.push({ pieces: TOOL_CALL }, { pieces: ['Saved', ' it', '.'] });
    const first = a.responses.stream({ model: 'tiny', instructions: 'You save things.', input: 'save one', tools: [SAVE] });
    const argDeltas: string[] = [];
    first.on('response.function_call_arguments.delta', (e) => argDeltas.push(e.delta));
    const r1 = await first.finalResponse();
    const call = r1.output.find((o) => o.type === 'function_call')!;
    // The parser's serialisation of the arguments, as chat completions answer them.
    expect(call).toMatchObject({ type: 'function_call', name: 'save', arguments: '{"x":1}', status: 'completed' });
    expect(argDeltas.join('')).toBe('{"x":1}');
    expect(r1.output.map((o) => o.type)).toEqual(['function_call']);
    if (call.type !== 'function_call') throw new Error('no call');

    const r2 = await a.responses.create({ model: 'tiny', instructions: 'You save things.', previous_response_id: r1.id, input: [{ type: 'function_call_output', call_id: call.call_id, output: 'saved' }], tools: [SAVE] });
    expect(r2.previous_response_id).toBe(r1.id);
    expect(r2.output_text).toBe('Saved it.');
    const id1 = r1.id.slice('resp_'.length);
    const id2 = r2.id.slice('resp_'.length);
    const rec2 = await record(id2);
    expect(rec2.request.messages).toEqual([
      { role: 'system', content: 'You save things.' },
      { role: 'user', content: 'save one' },
      { role: 'assistant', content: null, tool_calls: [{ id: call.call_id, type: 'function', function: { name: 'save', arguments: '{"x":1}' } }] },
      { role: 'tool', tool_call_id: call.call_id, content: 'saved' },
    ]);
    expect((await record(id1)).tags).toEqual({ session: r1.id });
    expect(rec2.tags).toEqual({ session: r1.id });

    const correlator = new Correlator({ sessionTtlS: 3600 });
    const events: CorrelationEvent[] = [];
    for (const r of await s.gw.store.readFrom(0, 1000)) if (r.id === id1 || r.id === id2) events.push(...correlator.observe(r));
    expect(events.filter((e) => e.kind === 'turn-finished').map((e) => e.kind === 'turn-finished' && [e.turnRecordId, e.nextStateRecordId])).toEqual([[id1, id2]]);
  });

  it('keeps a conversation whose items come back whole, with their ids and no previous_response_id, in its session', async () => {
    script.push({ pieces: THINKING });
    const r1 = await a.responses.create({ model: 'tiny', input: 'first' });
    const r2 = await a.responses.create({ model: 'tiny', input: [{ role: 'user', content: 'first' }, ...(r1.output as never[]), { role: 'user', content: [{ type: 'input_text', text: 'second' }] }] });
    const rec2 = await record(r2.id.slice('resp_'.length));
    expect(rec2.tags).toEqual({ session: r1.id });
    expect(rec2.request.messages).toEqual([{ role: 'user', content: 'first' }, { role: 'assistant', content: 'The answer.', reasoning_content: 'pondering deeply' }, { role: 'user', content: 'second' }]);
  });

  it('a client session header wins, and the chain keeps it without the header', async () => {
    const r1 = await a.responses.create({ model: 'tiny', input: 'hi' }, { headers: { 'x-session-id': 'agent-7' } });
    const r2 = await a.responses.create({ model: 'tiny', input: 'again', previous_response_id: r1.id });
    expect((await record(r1.id.slice(5))).tags).toEqual({ session: 'agent-7' });
    expect((await record(r2.id.slice(5))).tags).toEqual({ session: 'agent-7' });
  });

  it('answers a cut-off reply as incomplete, with the reason', async () => {
    script.push({ pieces: ['One', ' two'], finish: 'length' });
    const r = await a.responses.create({ model: 'tiny', input: 'count', max_output_tokens: 2 });
    expect(r.status).toBe('incomplete');
    expect(r.incomplete_details).toEqual({ reason: 'max_output_tokens' });
    expect(r.output).toMatchObject([{ type: 'message', status: 'incomplete' }]);
  });

  it('retrieves, lists the input items of, and deletes a stored response; only for the key that made it', async () => {
    const r = await a.responses.create({ model: 'tiny', input: 'keep me' });
    expect(await a.responses.retrieve(r.id)).toEqual(r);
    const items = await a.responses.inputItems.list(r.id);
    expect(items.data).toMatchObject([{ type: 'message', role: 'user', content: 'keep me' }]);

    await expect(b.responses.retrieve(r.id)).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    await expect(b.responses.delete(r.id)).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    const other = b.responses.create({ model: 'tiny', input: 'steal', previous_response_id: r.id });
    await expect(other).rejects.toBeInstanceOf(OpenAI.BadRequestError);
    await expect(other).rejects.toMatchObject({ status: 400, param: 'previous_response_id', message: expect.stringContaining(`Previous response with id '${r.id}' not found.`) });

    await a.responses.delete(r.id);
    await expect(a.responses.retrieve(r.id)).rejects.toMatchObject({ status: 404 });
    await expect(a.responses.create({ model: 'tiny', input: 'more', previous_response_id: r.id })).rejects.toMatchObject({ status: 400 });
  });

  it('does not keep a response sent with store: false, and tags it with no session', async () => {
    const { data, response } = await a.responses.create({ model: 'tiny', input: 'forget me', store: false }).withResponse();
    expect(data.store).toBe(false);
    await expect(a.responses.retrieve(data.id)).rejects.toMatchObject({ status: 404 });
    expect((await record(response.headers.get('x-reef-agent-record-id')!)).tags).toEqual({});
  });

  it.each([
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools[0].type', 'is not supported: this gateway serves function tools only'],
    [{ input: [{ type: 'message', role: 'user', content: [{ type: 'input_image', image_url: 'http://x' }] }] }, 'input[0].content[0].type', 'input_image'],
    [{ input: [{ type: 'computer_call_output', call_id: 'c' }] }, 'input[0].type', 'is not supported'],
    [{ input: 'x', background: true }, 'background', 'background responses are not supported'],
    [{ input: 'x', conversation: 'conv_1' }, 'conversation', 'Conversations API is not supported'],
    [{ input: 'x', text: { format: { type: 'json_schema', name: 'n', schema: {} } } }, 'text.format', 'structured outputs are not'],
    [{ input: 'x', previous_response_id: 'resp_nope' }, 'previous_response_id', "Previous response with id 'resp_nope' not found."],
    [{ input: 42 }, 'input', 'input must be a string or a list of input items'],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens', 'a positive integer'],
  ])('refuses %j with a 400 naming %s, before the engine is asked', async (params, param, message) => {
    const before = s.engine.requests.length;
    const head = await s.gw.store.headOffset();
    const err = await a.responses.create({ model: 'tiny', ...(params as object) } as never).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err).toMatchObject({ status: 400, param, type: 'invalid_request_error' });
    expect((err as Error).message).toContain(message);
    expect(s.engine.requests.length).toBe(before);
    expect(await s.gw.store.headOffset()).toBe(head);
  });

  it.each([
    ['nested past the depth limit', `{"model":"tiny","input":"x","metadata":${'['.repeat(200)}${']'.repeat(200)}}`, 'nested more than 128 levels deep'],
    ['with a prototype key', '{"model":"tiny","input":"x","__proto__":{"stream":true}}', 'forbidden prototype property'],
    ['not UTF-8', Buffer.from([0x7b, 0xff, 0x7d]), 'not valid UTF-8'],
  ])('refuses a body %s as the chat route does, with a 400 and nothing stored', async (_what, body, message) => {
    const head = await s.gw.store.headOffset();
    const res = await fetch(`${s.url}/v1/responses`, { method: 'POST', headers: { authorization: `Bearer ${KEY_A}`, 'content-type': 'application/json' }, body });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: { message: string } }).error.message).toContain(message);
    expect(await s.gw.store.headOffset()).toBe(head);
  });

  it('is admitted as chat completions are, before its body: a bad scenario header is refused naming it', async () => {
    const err = await a.responses.create({ model: 'tiny', input: 'x' }, { headers: { 'x-reef-scenario': 'Not A Scenario' } }).then(() => null, (e: unknown) => e);
    expect(err).toMatchObject({ status: 400, param: 'x-reef-scenario' });
  });

  it('an engine that is down answers 503 before any event; one that dies mid-stream ends the stream with an error event and a failed response, and a failed record', async () => {
    s.engine.options.failWith = 503;
    const head = await s.gw.store.headOffset();
    for (const stream of [false, true]) {
      const err = await a.responses.create({ model: 'tiny', input: 'x', stream } as never).then(() => null, (e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.APIError);
      expect(err).toMatchObject({ status: 503, code: 'REEF_ERR_ENGINE_DOWN' });
    }
    expect(await s.gw.store.headOffset()).toBe(head);

    Object.assign(s.engine.options, { failWith: null, dieAfterTokens: 3, tokenDelayMs: 5 });
    script.push({ pieces: ['a', ' b', ' c', ' d', ' e', ' f'] });
    const events: Record<string, any>[] = [];
    for await (const e of await a.responses.create({ model: 'tiny', input: 'x', stream: true })) events.push(e as unknown as Record<string, any>);
    expect(events.map((e) => e.type).slice(-2)).toEqual(['error', 'response.failed']);
    expect(events.at(-2)!.code).toMatch(/^REEF_ERR_ENGINE_(FAILED|DOWN)$/);
    const failed = events.at(-1)!.response;
    expect(failed.status).toBe('failed');
    expect((await record(failed.id.slice(5))).status).toBe('failed');
    await expect(a.responses.retrieve(failed.id)).rejects.toMatchObject({ status: 404 });
  });

  it('ends a chain\'s session with x-session-done and no session header; without a session to end it is a 400', async () => {
    const r1 = await a.responses.create({ model: 'tiny', input: 'hi' });
    const r2 = await a.responses.create({ model: 'tiny', input: 'bye', previous_response_id: r1.id }, { headers: { 'x-session-done': 'true' } });
    expect((await record(r2.id.slice(5))).tags).toEqual({ session: r1.id, 'session-done': 'true' });
    const err = await a.responses.create({ model: 'tiny', input: 'x', store: false }, { headers: { 'x-session-done': 'true' } }).then(() => null, (e: unknown) => e);
    expect(err).toMatchObject({ status: 400, param: 'x-session-done' });
  });

  it('gives its concurrency slot back whatever the answer: a key with one slot goes on after answers, refusals and streams', async () => {
    const one = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: KEY_ONE, maxRetries: 0 });
    await one.responses.create({ model: 'tiny', input: 'x' });
    await expect(one.responses.create({ model: 'tiny', input: 'x', tools: [{ type: 'web_search' } as never] })).rejects.toMatchObject({ status: 400 });
    await expect(one.responses.create({ model: 'tiny', input: 'x', previous_response_id: 'resp_gone' })).rejects.toMatchObject({ status: 400 });
    for await (const _ of await one.responses.create({ model: 'tiny', input: 'x', stream: true })) void _;
    expect((await one.responses.create({ model: 'tiny', input: 'still here' })).status).toBe('completed');
  });
});
