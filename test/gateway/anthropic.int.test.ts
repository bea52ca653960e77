import Anthropic from '@anthropic-ai/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Correlator } from '../../actors/judge/correlate/correlator.js';
import type { CorrelationEvent } from '../../actors/judge/correlate/types.js';
import type { FakeGeneration } from '../helpers/fake-engine.js';
import { postChat, startStack, type Stack } from './harness.js';

/**
 * The Anthropic Messages API through the official SDK, on the real gateway (HTTP, tokenizer pool,
 * SQLite) before the fake engine: bodies, streams, tool use, thinking, stop reasons, token counts,
 * errors, receipts, and the property the design rests on: a Messages turn is recorded with the
 * token ids of the same conversation sent to /v1/chat/completions.
 */

const KEY = 'sk-reef-anthropic-test-key-0123456789abcdef';
/** A key with a token budget of 100 a minute; one with one request at a time. */
const SMALL = 'sk-reef-anthropic-small-key-0123456789abcdef';
const ONE = 'sk-reef-anthropic-one-at-a-time-0123456789ab';
const BODY_LIMIT = 256 * 1024;
const DEFAULT: FakeGeneration = { pieces: ['Hello', ' from', ' the', ' fake', ' engine', '.'] };
// Qwen3 markup, one token per piece, as the qwen3 parser reads it.
const THINK_AND_CALL = ['<think>', 'I should', ' save it', '</think>', '\n\n', 'Saving', ' now.', '\n<tool_call>', '\n{"name": "save", ', '"arguments": {"x": 1, "tag": "a"}}', '\n</tool_call>'];
const TOOLS: Anthropic.Tool[] = [{ name: 'save', description: 'Save a value', input_schema: { type: 'object', properties: { x: { type: 'number' }, tag: { type: 'string' } }, required: ['x'] } }];
const OPENAI_TOOLS = [{ type: 'function', function: { name: 'save', description: 'Save a value', parameters: TOOLS[0]!.input_schema } }];

describe('Anthropic Messages API', () => {
  let s: Stack;
  let client: Anthropic;
  /** What the fake engine says next, in order; then DEFAULT. */
  const script: FakeGeneration[] = [];

  beforeAll(async () => {
    s = await startStack({ apiKeys: [{ key: KEY }, { key: SMALL, tokens_per_minute: 100 }, { key: ONE, max_concurrency: 1 }], limits: { body_bytes: BODY_LIMIT }, engine: { respond: () => script.shift() ?? DEFAULT } });
    // The SDK sends the key as x-api-key, as it does to Anthropic.
    client = new Anthropic({ apiKey: KEY, baseURL: s.url, maxRetries: 0 });
  });
  afterAll(async () => {
    await s?.close();
  });

  const record = async (id: string) => (await s.gw.store.get(id))!;

  it('non-streamed: a message with usage and a receipt; the record has the tags, scenario and ids the engine saw', async () => {
    const { data, response } = await client.messages
      .create({ model: 'tiny', max_tokens: 32, system: 'You are terse.', messages: [{ role: 'user', content: 'Hello there' }], metadata: { user_id: 'u-1' } }, { headers: { 'x-session-id': 'oc-7', 'x-turn-type': 'main', 'x-reef-scenario': 'coding', 'x-reef-tag-user': 'u1' } })
      .withResponse();
    const sent = s.engine.requests.at(-1)! as { input_ids: number[]; sampling_params: Record<string, unknown> };
    expect(data).toMatchObject({ type: 'message', role: 'assistant', model: 'tiny', content: [{ type: 'text', text: 'Hello from the fake engine.' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: sent.input_ids.length, output_tokens: 6 } });
    const id = response.headers.get('x-reef-agent-record-id')!;
    expect(id).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);
    expect(data.id).toBe(`msg_${id}`);
    expect(sent.sampling_params.max_new_tokens).toBe(32);
    const rec = await record(id);
    expect(rec).toMatchObject({ scenario: 'coding', status: 'ok', tags: { session: 'oc-7', 'turn-type': 'main', user: 'u1' }, response: { role: 'assistant', content: 'Hello from the fake engine.' } });
    expect(Array.from(rec.promptIds)).toEqual(sent.input_ids);
    // The chat request it was served as: the judge and the trainer read the record's messages.
    expect(rec.request.messages).toEqual([{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Hello there' }]);
  });

  it('streamed, with thinking and a tool call: the event sequence, the final message, and the receipt on message_stop', async () => {
    script.push({ pieces: THINK_AND_CALL });
    const stream = client.messages.stream({ model: 'tiny', max_tokens: 64, tools: TOOLS, messages: [{ role: 'user', content: 'save 1' }] }, { headers: { 'x-reef-tag-session': 'st-1' } });
    const events: Array<Record<string, any>> = [];
    for await (const e of stream) events.push(e as unknown as Record<string, any>);
    const final = await stream.finalMessage();

    const kinds = events.map((e) => (e.type === 'content_block_delta' ? `${e.type}:${e.delta.type}` : e.type === 'content_block_start' ? `${e.type}:${e.content_block.type}` : e.type));
    const squeezed = kinds.filter((k, i) => k !== kinds[i - 1]);
    expect(squeezed).toEqual([
      'message_start',
      'content_block_start:thinking', 'content_block_delta:thinking_delta', 'content_block_delta:signature_delta', 'content_block_stop',
      'content_block_start:text', 'content_block_delta:text_delta', 'content_block_stop',
      'content_block_start:tool_use', 'content_block_delta:input_json_delta', 'content_block_stop',
      'message_delta', 'message_stop',
    ]);
    expect(events.filter((e) => e.type === 'content_block_start').map((e) => e.index)).toEqual([0, 1, 2]);
    expect(final.content).toMatchObject([
      { type: 'thinking', thinking: 'I should save it' },
      { type: 'text', text: 'Saving now.' },
      { type: 'tool_use', name: 'save', input: { x: 1, tag: 'a' } },
    ]);
    expect((final.content[0] as Anthropic.ThinkingBlock).signature).toMatch(/^reef-sha256:/);
    expect(final.stop_reason).toBe('tool_use');
    expect(final.usage).toMatchObject({ input_tokens: s.engine.requests.at(-1)!.input_ids!.length, output_tokens: THINK_AND_CALL.length });

    const stop = events.at(-1)!;
    const rec = await record(stop.reef.agent_record_id);
    expect(rec.tags).toEqual({ session: 'st-1' });
    // The id the client got is the id recorded: the next turn's tool_result names it.
    const toolUse = final.content[2] as Anthropic.ToolUseBlock;
    expect(rec.response).toMatchObject({ reasoning_content: 'I should save it', content: 'Saving now.', tool_calls: [{ id: toolUse.id, function: { name: 'save', arguments: '{"x":1,"tag":"a"}' } }] });
  });

  it('a tool_use round trip records the prompt and output ids of the same conversation on /v1/chat/completions', async () => {
    const system = 'You are a careful agent.';
    // Turn 1 both ways: the model thinks and calls the tool.
    script.push({ pieces: THINK_AND_CALL }, { pieces: THINK_AND_CALL });
    const first = await client.messages.create({ model: 'tiny', max_tokens: 64, system: [{ type: 'text', text: system, cache_control: { type: 'ephemeral' } }], tools: TOOLS, tool_choice: { type: 'auto' }, messages: [{ role: 'user', content: 'save 1' }] });
    const chatFirstRes = await postChat(s.url, { model: 'tiny', max_tokens: 64, messages: [{ role: 'system', content: system }, { role: 'user', content: 'save 1' }], tools: OPENAI_TOOLS, tool_choice: 'auto' }, { 'x-api-key': KEY });
    const chatFirst = (await chatFirstRes.json()) as { choices: [{ message: { tool_calls: Array<{ id: string }> } & Record<string, unknown> }] };
    const toolUse = first.content.find((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use')!;

    // Turn 2 both ways: the tool's result goes back, and the model answers.
    const answer = { pieces: ['It', ' is', ' saved', '.'] };
    script.push(answer, answer);
    const { data: second, response } = await client.messages
      .create({
        model: 'tiny',
        max_tokens: 64,
        system: [{ type: 'text', text: system }],
        tools: TOOLS,
        messages: [
          { role: 'user', content: 'save 1' },
          { role: 'assistant', content: first.content as Anthropic.ContentBlockParam[] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: toolUse.id, content: [{ type: 'text', text: 'saved as #4' }] }] },
        ],
      })
      .withResponse();
    const viaMessages = await record(response.headers.get('x-reef-agent-record-id')!);
    const callId = chatFirst.choices[0].message.tool_calls[0]!.id;
    const chatSecond = await postChat(s.url, {
      model: 'tiny',
      max_tokens: 64,
      tools: OPENAI_TOOLS,
      messages: [{ role: 'system', content: system }, { role: 'user', content: 'save 1' }, chatFirst.choices[0].message, { role: 'tool', tool_call_id: callId, content: 'saved as #4' }],
    }, { 'x-api-key': KEY });
    expect(chatSecond.status).toBe(200);
    const viaChat = await record(chatSecond.headers.get('x-reef-agent-record-id')!);

    expect(second).toMatchObject({ content: [{ type: 'text', text: 'It is saved.' }], stop_reason: 'end_turn' });
    expect(viaMessages.promptIds.length).toBeGreaterThan(50);
    expect(Array.from(viaMessages.promptIds)).toEqual(Array.from(viaChat.promptIds));
    expect(Array.from(viaMessages.outputIds)).toEqual(Array.from(viaChat.outputIds));
    // The translation the ids came from: the reasoning, the call and its result made the round trip.
    expect(viaMessages.request.messages).toMatchObject([
      { role: 'system', content: [{ type: 'text', text: system }] },
      { role: 'user', content: 'save 1' },
      { role: 'assistant', reasoning_content: 'I should save it', content: [{ type: 'text', text: 'Saving now.' }], tool_calls: [{ id: toolUse.id, function: { name: 'save', arguments: '{"x":1,"tag":"a"}' } }] },
      { role: 'tool', tool_call_id: toolUse.id, content: [{ type: 'text', text: 'saved as #4' }] },
    ]);
  });

  it('a failed tool\'s result (is_error, string content) is served and recorded as a tool message; anthropic-version is not required', async () => {
    const body = {
      model: 'tiny',
      max_tokens: 8,
      messages: [
        { role: 'user', content: 'save 1' },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'save', input: { x: 1 } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', is_error: true, content: 'disk full' }, { type: 'text', text: 'try again?' }] },
      ],
      tools: TOOLS,
    };
    const res = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY }, body: JSON.stringify(body) });
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ type: 'message', content: [{ type: 'text', text: 'Hello from the fake engine.' }] });
    const rec = await record(res.headers.get('x-reef-agent-record-id')!);
    expect(rec.request.messages.slice(1)).toEqual([
      { role: 'assistant', content: null, tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'save', arguments: '{"x":1}' } }] },
      { role: 'tool', tool_call_id: 'toolu_1', content: 'disk full', is_error: true },
      { role: 'user', content: [{ type: 'text', text: 'try again?' }] },
    ]);
  });

  it('an untagged Messages conversation is bound by its transcript, as a chat one is: the tool result is the next state of the tool call', async () => {
    const headers = { 'x-reef-scenario': 'transcript' };
    script.push({ pieces: THINK_AND_CALL });
    const first = await client.messages.create({ model: 'tiny', max_tokens: 64, tools: TOOLS, messages: [{ role: 'user', content: 'save 1' }] }, { headers });
    const toolUse = first.content.find((b): b is Anthropic.ToolUseBlock => b.type === 'tool_use')!;
    await client.messages.create({
      model: 'tiny',
      max_tokens: 64,
      tools: TOOLS,
      messages: [{ role: 'user', content: 'save 1' }, { role: 'assistant', content: first.content as Anthropic.ContentBlockParam[] }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: toolUse.id, content: 'saved' }] }],
    }, { headers });
    const correlator = new Correlator({ sessionTtlS: 3600 });
    const events: CorrelationEvent[] = [];
    for (const rec of await s.gw.store.readFrom(0, 1000)) if (rec.scenario === 'transcript') events.push(...correlator.observe(rec));
    const finished = events.filter((e) => e.kind === 'turn-finished');
    expect(finished).toHaveLength(1);
    expect(finished[0]).toMatchObject({ turnRecordId: first.id.slice('msg_'.length), nextState: { content: 'saved' } });
  });

  it('stop_reason stop_sequence names the sequence, streamed and not; max_tokens when the budget ran out', async () => {
    const stopping = { pieces: ['one', ' two', ' END', ' three'] };
    script.push(stopping);
    const once = await client.messages.create({ model: 'tiny', max_tokens: 16, stop_sequences: [' END'], messages: [{ role: 'user', content: 'count' }] });
    expect(once).toMatchObject({ content: [{ type: 'text', text: 'one two' }], stop_reason: 'stop_sequence', stop_sequence: ' END' });
    script.push(stopping);
    const streamed = await client.messages.stream({ model: 'tiny', max_tokens: 16, stop_sequences: [' END'], messages: [{ role: 'user', content: 'count' }] }).finalMessage();
    expect(streamed).toMatchObject({ content: [{ type: 'text', text: 'one two' }], stop_reason: 'stop_sequence', stop_sequence: ' END' });
    script.push({ pieces: ['cut', ' short'], finish: 'length' });
    const cut = await client.messages.create({ model: 'tiny', max_tokens: 2, messages: [{ role: 'user', content: 'go on' }] });
    expect(cut).toMatchObject({ stop_reason: 'max_tokens', stop_sequence: null });
  });

  it('count_tokens counts the prompt a generation would send, and generates and records nothing', async () => {
    const params = { model: 'tiny', system: 'Count me.', tools: TOOLS, messages: [{ role: 'user' as const, content: 'how many?' }] };
    const before = s.engine.requests.length;
    const head = await s.gw.store.headOffset();
    const counted = await client.messages.countTokens(params);
    expect(s.engine.requests.length).toBe(before);
    expect(await s.gw.store.headOffset()).toBe(head);
    await client.messages.create({ ...params, max_tokens: 8 });
    expect(counted).toEqual({ input_tokens: s.engine.requests.at(-1)!.input_ids!.length });
  });

  it('refuses what it cannot honour with a 400 the SDK reads as BadRequestError, naming the field', async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ messages: [{ role: 'user', content: [{ type: 'text', text: 'look' }, { type: 'image', source: { type: 'url', url: 'https://x/y.png' } }] }] }, 'messages[0].content[1].type: content block type "image" is not supported: this model takes text only'],
      [{ tools: [{ type: 'web_search_20250305', name: 'web_search' }], messages: [{ role: 'user', content: 'hi' }] }, 'tools[0].type: "web_search_20250305" is a server tool'],
      [{ messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'The answer is' }] }, 'messages[1].role: the last message must be a user message'],
      [{ stop_sequences: [''], messages: [{ role: 'user', content: 'hi' }] }, 'stop_sequences: a stop string must not be empty'],
      [{ mcp_servers: [], messages: [{ role: 'user', content: 'hi' }] }, 'mcp_servers: this field is not supported'],
      [{ tool_choice: { type: 'tool', name: 'nope' }, tools: TOOLS, messages: [{ role: 'user', content: 'hi' }] }, 'tool_choice.name: "nope" is not among the request\'s tools'],
    ];
    const before = s.engine.requests.length;
    for (const [body, message] of cases) {
      const err = await client.messages.create({ model: 'tiny', max_tokens: 8, ...body } as unknown as Anthropic.MessageCreateParamsNonStreaming).catch((e: unknown) => e);
      expect(err, message).toBeInstanceOf(Anthropic.BadRequestError);
      const e = err as InstanceType<typeof Anthropic.BadRequestError>;
      expect(e.status).toBe(400);
      expect(e.error).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', details: { error_code: 'REEF_ERR_INVALID_ARGUMENT' } } });
      expect(e.apiMessage).toContain(message);
    }
    // max_tokens is required, as by Anthropic.
    const res = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01' }, body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }) });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ type: 'error', error: { type: 'invalid_request_error', message: 'max_tokens: field required' } });
    expect(s.engine.requests.length).toBe(before);
  });

  it('answers refusals made before the body is read, and the engine\'s failures, in Anthropic\'s body and statuses', async () => {
    const wrong = new Anthropic({ apiKey: 'sk-not-the-key', baseURL: s.url, maxRetries: 0 });
    const auth = await wrong.messages.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
    expect(auth).toBeInstanceOf(Anthropic.AuthenticationError);
    expect((auth as Anthropic.APIError).error).toMatchObject({ type: 'error', error: { type: 'authentication_error', details: { error_code: 'REEF_ERR_UNAUTHORIZED' } } });

    const scenario = await client.messages.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-reef-scenario': 'Not A Name' } }).catch((e: unknown) => e);
    expect(scenario).toBeInstanceOf(Anthropic.BadRequestError);
    expect((scenario as Anthropic.APIError).apiMessage).toContain('x-reef-scenario "Not A Name" is not a valid scenario name');

    const header = await client.messages.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }, { headers: { 'x-turn-type': 'heartbeat' } }).catch((e: unknown) => e);
    expect((header as Anthropic.APIError).apiMessage).toContain('x-turn-type "heartbeat" is neither main nor side');

    // Past the body limit, refused on the declared length before the upload is read.
    const big = await fetch(`${s.url}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-api-key': KEY }, body: JSON.stringify({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'x'.repeat(BODY_LIMIT) }] }) });
    expect(big.status).toBe(413);
    expect(await big.json()).toMatchObject({ type: 'error', error: { type: 'request_too_large', message: `request body is larger than ${BODY_LIMIT} bytes (reef.limits.body_bytes)`, details: { error_code: 'REEF_ERR_TOO_LARGE' } } });

    // A key's token budget: the first request takes most of it, the next is a 429 the SDK reads as RateLimitError.
    const small = new Anthropic({ apiKey: SMALL, baseURL: s.url, maxRetries: 0 });
    await small.messages.create({ model: 'tiny', max_tokens: 60, messages: [{ role: 'user', content: 'hi' }] });
    const limited = await small.messages.create({ model: 'tiny', max_tokens: 60, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
    expect(limited).toBeInstanceOf(Anthropic.RateLimitError);
    expect(Number((limited as Anthropic.APIError).headers?.get('retry-after'))).toBeGreaterThan(0);
    expect((limited as Anthropic.APIError).error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', details: { error_code: 'REEF_ERR_RATE_LIMIT' } } });

    // A key's concurrency slot, taken before the body is read: a second request while one generates is a 429.
    const one = new Anthropic({ apiKey: ONE, baseURL: s.url, maxRetries: 0 });
    s.engine.options.delayMs = () => 30_000;
    const leave = new AbortController();
    try {
      const generating = new Promise<void>((resolve) => s.engine.server.once('request', () => resolve()));
      const first = one.messages.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'slow' }] }, { signal: leave.signal }).catch((e: unknown) => e);
      await generating;
      const second = await one.messages.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
      expect(second).toBeInstanceOf(Anthropic.RateLimitError);
      expect((second as Anthropic.APIError).error).toMatchObject({ type: 'error', error: { type: 'rate_limit_error', message: 'too many concurrent requests for this API key (limit 1)', details: { error_code: 'REEF_ERR_RATE_LIMITED' } } });
      leave.abort();
      expect(await first).toBeInstanceOf(Anthropic.APIUserAbortError);
    } finally {
      delete s.engine.options.delayMs;
    }

    const batches = await fetch(`${s.url}/v1/messages/batches`, { headers: { 'x-api-key': KEY } });
    expect(batches.status).toBe(404);
    expect(await batches.json()).toMatchObject({ type: 'error', error: { type: 'not_found_error' } });

    s.engine.options.failWith = 503;
    try {
      const failed = await client.messages.create({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }).catch((e: unknown) => e);
      // The chat path's 503 (engine unavailable), as Anthropic's 529: both retried by their SDKs.
      expect(failed).toBeInstanceOf(Anthropic.OverloadedError);
      expect((failed as Anthropic.APIError).status).toBe(529);
      expect((failed as Anthropic.APIError).headers?.get('retry-after')).toBe('2');
      expect((failed as Anthropic.APIError).error).toMatchObject({ type: 'error', error: { type: 'overloaded_error', details: { error_code: 'REEF_ERR_ENGINE_DOWN' } } });
    } finally {
      s.engine.options.failWith = null;
    }

    // An engine that dies mid-stream: the client has had message_start and text, then an error event.
    // A delay lets each event leave the fake engine before it destroys the socket.
    Object.assign(s.engine.options, { dieAfterTokens: 3, tokenDelayMs: 5 });
    try {
      const seen: string[] = [];
      const stream = client.messages.stream({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] });
      const cut = await (async () => {
        for await (const e of stream) seen.push(e.type === 'content_block_delta' && e.delta.type === 'text_delta' ? e.delta.text : e.type);
      })().catch((e: unknown) => e);
      expect(seen.slice(0, 2)).toEqual(['message_start', 'content_block_start']);
      expect(seen.slice(2).join('')).toBe('Hello from the');
      expect(cut).toBeInstanceOf(Anthropic.APIError);
      const body = (cut as Anthropic.APIError).error as { type: string; error: { type: string; details: { error_code: string } } };
      expect(body.type).toBe('error');
      expect([body.error.type, body.error.details.error_code]).toSatisfy(([t, c]: [string, string]) => (t === 'api_error' && c === 'REEF_ERR_ENGINE_FAILED') || (t === 'overloaded_error' && c === 'REEF_ERR_ENGINE_DOWN'));
      const page = await s.gw.store.list({ scenario: 'default', order: 'desc', limit: 1 });
      expect(page.items[0]!.status).toBe('failed');
    } finally {
      Object.assign(s.engine.options, { dieAfterTokens: null, tokenDelayMs: 0 });
    }
  });
});
