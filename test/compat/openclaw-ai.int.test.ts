import { createLlmRuntime, type AssistantMessage, type AssistantMessageEvent, type Context, type Model, type SimpleStreamOptions, type Tool } from '@openclaw/ai';
import { registerBuiltInApiProviders } from '@openclaw/ai/providers';
import { Type } from 'typebox';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { AgentRecord } from '../../actors/gateway/store/types.js';
import type { FakeGeneration } from '../helpers/fake-engine.js';
import { postChat, startStack, type Stack } from '../gateway/harness.js';

/**
 * OpenClaw's own provider library, @openclaw/ai (the version OpenClaw 2026.9.6 pins), against the
 * real gateway before the fake engine, once per provider `api` OpenClaw can be configured with:
 * openai-completions, anthropic-messages and openai-responses. Each conversation goes through the
 * library's streaming call, as OpenClaw always streams: a text turn, a turn where the model thinks
 * and calls a tool, and the turn that sends the tool's result back. Every turn must be recorded
 * with the prompt ids the chat-completions path gives the same conversation, so a turn is trained
 * on the same tokens whichever API the agent was configured with.
 */

const KEY = 'sk-reef-openclaw-ai-test-key-0123456789abcdef';
const SYSTEM = 'You are a careful agent.';
const HELLO = ['Hello', ' from', ' the', ' fake', ' engine', '.'];
// Qwen3 markup, one token per piece, as the qwen3 parser reads it.
const THINK_AND_CALL = ['<think>', 'I should', ' save it', '</think>', '\n\n', 'Saving', ' now.', '\n<tool_call>', '\n{"name": "save", ', '"arguments": {"x": 1, "tag": "a"}}', '\n</tool_call>'];
const ANSWER = ['It', ' is', ' saved', '.'];
/** A tool as OpenClaw declares one: a TypeBox schema for its parameters. */
const SAVE: Tool = { name: 'save', description: 'Save a value', parameters: Type.Object({ x: Type.Number(), tag: Type.Optional(Type.String()) }) };
/**
 * The same tool on /v1/chat/completions. OpenClaw's OpenAI transports send `strict: false` and the
 * chat path renders what it is sent, so the model sees that flag; the Messages API has no such field.
 */
const chatTools = (api: ReefApi) => [{ type: 'function', function: { name: 'save', description: 'Save a value', parameters: SAVE.parameters, ...(api === 'anthropic-messages' ? {} : { strict: false }) } }];

const APIS = ['openai-completions', 'anthropic-messages', 'openai-responses'] as const;
type ReefApi = (typeof APIS)[number];
/** The prefix each API puts before the record id in its response id. */
const ID_PREFIX: Record<ReefApi, string> = { 'openai-completions': 'chatcmpl-', 'anthropic-messages': 'msg_', 'openai-responses': 'resp_' };

/**
 * The model OpenClaw builds from `models.providers.reef` with this `api`: the Anthropic SDK adds
 * `/v1/messages` to its base URL itself, the OpenAI one only the route.
 */
function reefModel(api: ReefApi, gatewayUrl: string): Model {
  return {
    id: 'tiny',
    name: 'Reef tiny',
    api,
    provider: 'reef',
    baseUrl: api === 'anthropic-messages' ? gatewayUrl : `${gatewayUrl}/v1`,
    reasoning: true,
    input: ['text'],
    cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
    contextWindow: 32768,
    maxTokens: 4096,
  };
}

/** Part of the body @openclaw/ai sends for the text turn, per API: what Reef must accept. */
const SENT: Record<ReefApi, Record<string, unknown>> = {
  'openai-completions': { stream: true, stream_options: { include_usage: true }, store: false, max_completion_tokens: 256, reasoning_effort: 'minimal', messages: [{ role: 'developer', content: SYSTEM }, { role: 'user', content: 'Hello there' }] },
  'anthropic-messages': { stream: true, max_tokens: 1280, thinking: { type: 'enabled', budget_tokens: 1024 }, system: [{ type: 'text', text: SYSTEM, cache_control: { type: 'ephemeral' } }] },
  'openai-responses': { stream: true, store: false, max_output_tokens: 256, reasoning: { effort: 'minimal' }, include: ['reasoning.encrypted_content'], input: [{ type: 'message', role: 'developer' }, { type: 'message', role: 'user' }] },
};

interface Turn {
  events: AssistantMessageEvent[];
  message: AssistantMessage;
  record: AgentRecord;
}

describe('@openclaw/ai against the gateway', () => {
  let s: Stack;
  /** What the fake engine says next, in order; then HELLO. */
  const script: FakeGeneration[] = [];

  beforeAll(async () => {
    s = await startStack({ apiKeys: [{ key: KEY }], engine: { respond: () => script.shift() ?? { pieces: HELLO } } });
  });
  afterAll(async () => {
    await s?.close();
  });
  // A turn that failed leaves its scripted reply unread: it must not become the next turn's.
  beforeEach(() => {
    script.length = 0;
  });

  describe.each(APIS)('with api %s', (api) => {
    const runtime = createLlmRuntime();
    registerBuiltInApiProviders(runtime.registry);
    /** The request bodies the library built, as it sent them. */
    const payloads: Array<Record<string, any>> = [];
    // What OpenClaw passes on an agent turn: its session, a thinking level ("minimal" keeps
    // Anthropic's thinking budget, 1024, under max_tokens), the output cap.
    const options: SimpleStreamOptions = {
      apiKey: KEY,
      sessionId: `oc-session-${api}`,
      reasoning: 'minimal',
      maxTokens: 256,
      onPayload: (p) => {
        payloads.push(p as Record<string, any>);
        return undefined;
      },
    };
    const model = () => reefModel(api, s.url);

    async function turn(context: Context, pieces: string[]): Promise<Turn> {
      script.push({ pieces });
      const stream = runtime.streamSimple(model(), context, options);
      const events: AssistantMessageEvent[] = [];
      for await (const e of stream) events.push(e);
      const message = await stream.result();
      expect(message.errorMessage).toBeUndefined();
      expect(message.responseId?.startsWith(ID_PREFIX[api])).toBe(true);
      const record = (await s.gw.store.get(message.responseId!.slice(ID_PREFIX[api].length)))!;
      expect(record.status).toBe('ok');
      return { events, message, record };
    }

    /** The record of the same conversation sent to /v1/chat/completions with the same output. */
    async function viaChat(messages: unknown[], pieces: string[], withTools = true): Promise<AgentRecord> {
      script.push({ pieces });
      const res = await postChat(s.url, { model: 'tiny', max_tokens: 256, ...(withTools ? { tools: chatTools(api) } : {}), messages }, { authorization: `Bearer ${KEY}` });
      expect(res.status).toBe(200);
      return (await s.gw.store.get(res.headers.get('x-reef-agent-record-id')!))!;
    }

    const kinds = (events: AssistantMessageEvent[]) => events.map((e) => e.type).filter((t, i, all) => t !== all[i - 1]);
    const user = (content: string) => ({ role: 'user' as const, content, timestamp: Date.now() });

    it('a text turn: streamed text, stop, usage, and the chat path\'s prompt ids', async () => {
      const t = await turn({ systemPrompt: SYSTEM, messages: [user('Hello there')] }, HELLO);
      expect(kinds(t.events)).toEqual(['start', 'text_start', 'text_delta', 'text_end', 'done']);
      // What the library asked for, each in its API's terms: thinking on, a system prompt, a cap.
      expect(payloads.at(-1)).toMatchObject(SENT[api]);
      expect(t.message.content).toMatchObject([{ type: 'text', text: 'Hello from the fake engine.' }]);
      expect(t.message.stopReason).toBe('stop');
      expect(t.message.usage).toMatchObject({ input: t.record.promptIds.length, output: HELLO.length });
      expect(t.record.response).toMatchObject({ role: 'assistant', content: 'Hello from the fake engine.' });
      // OpenClaw's session id reaches a custom endpoint as the `session_id` header on Responses only
      // (the other two send it only where session affinity is configured); Reef tags it as the session.
      expect(t.record.tags).toEqual(api === 'openai-responses' ? { session: options.sessionId } : {});
      const chat = await viaChat([{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Hello there' }], HELLO, false);
      expect(t.record.promptIds.length).toBeGreaterThan(20);
      expect(Array.from(t.record.promptIds)).toEqual(Array.from(chat.promptIds));
    });

    it('a tool round trip: the thinking, the parsed tool call, and the tool result sent back, each turn with the chat path\'s ids', async () => {
      const context: Context = { systemPrompt: SYSTEM, messages: [user('save 1')], tools: [SAVE] };
      const first = await turn(context, THINK_AND_CALL);
      expect(first.message.stopReason).toBe('toolUse');
      expect(first.message.content).toMatchObject([
        { type: 'thinking', thinking: 'I should save it' },
        { type: 'text', text: 'Saving now.' },
        { type: 'toolCall', name: 'save', arguments: { x: 1, tag: 'a' } },
      ]);
      const ended = first.events.filter((e): e is Extract<AssistantMessageEvent, { type: 'toolcall_end' }> => e.type === 'toolcall_end');
      expect(ended.map((e) => e.toolCall)).toMatchObject([{ name: 'save', arguments: { x: 1, tag: 'a' } }]);
      expect(kinds(first.events)).toEqual(expect.arrayContaining(['thinking_start', 'thinking_delta', 'thinking_end', 'toolcall_start', 'toolcall_delta', 'toolcall_end']));
      expect(first.record.response).toMatchObject({ reasoning_content: 'I should save it', content: 'Saving now.', tool_calls: [{ function: { name: 'save', arguments: '{"x":1,"tag":"a"}' } }] });
      const call = first.message.content.find((b) => b.type === 'toolCall')!;
      if (call.type !== 'toolCall') throw new Error('no tool call');
      // The call id the library holds names the call Reef recorded (Responses joins call and item ids).
      expect(call.id.split('|')[0]).toBe(first.record.response.tool_calls![0]!.id);

      const chatCall = { role: 'assistant', content: 'Saving now.', reasoning_content: 'I should save it', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'save', arguments: '{"x":1,"tag":"a"}' } }] };
      const chatFirst = await viaChat([{ role: 'system', content: SYSTEM }, { role: 'user', content: 'save 1' }], THINK_AND_CALL);
      expect(Array.from(first.record.promptIds)).toEqual(Array.from(chatFirst.promptIds));
      expect(Array.from(first.record.outputIds)).toEqual(Array.from(chatFirst.outputIds));

      context.messages.push(first.message, { role: 'toolResult', toolCallId: call.id, toolName: 'save', content: [{ type: 'text', text: 'saved as #4' }], isError: false, timestamp: Date.now() });
      const second = await turn(context, ANSWER);
      expect(second.message.content).toMatchObject([{ type: 'text', text: 'It is saved.' }]);
      expect(second.message.stopReason).toBe('stop');
      const chatSecond = await viaChat([{ role: 'system', content: SYSTEM }, { role: 'user', content: 'save 1' }, chatCall, { role: 'tool', tool_call_id: 'call_1', content: 'saved as #4' }], ANSWER);
      expect(Array.from(second.record.promptIds)).toEqual(Array.from(chatSecond.promptIds));
      // The translation the ids came from: the thinking, the call and its result made the round trip.
      expect(second.record.request.messages.at(-2)).toMatchObject({ role: 'assistant', reasoning_content: 'I should save it', tool_calls: [{ id: call.id.split('|')[0], function: { name: 'save' } }] });
      expect(second.record.request.messages.at(-1)).toMatchObject({ role: 'tool', tool_call_id: call.id.split('|')[0] });
    });

    it('a wrong API key ends the stream with the library\'s error, carrying the gateway\'s 401', async () => {
      const before = s.engine.requests.length;
      const stream = runtime.streamSimple(model(), { systemPrompt: SYSTEM, messages: [user('Hello there')] }, { ...options, apiKey: 'sk-not-a-reef-key-0123456789abcdef' });
      const events: AssistantMessageEvent[] = [];
      for await (const e of stream) events.push(e);
      const message = await stream.result();
      expect(events.at(-1)?.type).toBe('error');
      expect(message.stopReason).toBe('error');
      expect(message.errorMessage).toMatch(/401/);
      expect(s.engine.requests.length).toBe(before);
    });
  });
});
