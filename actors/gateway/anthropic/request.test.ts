import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../../cluster/paths.js';
import { anthropicErrorOf, isMessagesPath } from './errors.js';
import { MessagesRequestError, restate, toChatRequest } from './request.js';

const user = (content: unknown) => ({ role: 'user', content });

function refusal(body: unknown, generate = true): string {
  try {
    toChatRequest(body, generate);
  } catch (err) {
    if (err instanceof MessagesRequestError) return err.message;
    throw err;
  }
  throw new Error('not refused');
}

describe('Messages request → chat request', () => {
  it('maps system, tools, tool_choice, stop sequences, sampling and thinking; drops cache_control and metadata', () => {
    const { chat, origins } = toChatRequest({
      model: 'tiny',
      max_tokens: 64,
      system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }, { type: 'text', text: ' Really.' }],
      messages: [user('hi')],
      tools: [{ name: 'save', description: 'Save', input_schema: { type: 'object' }, cache_control: { type: 'ephemeral' } }],
      tool_choice: { type: 'any', disable_parallel_tool_use: true },
      stop_sequences: ['END'],
      temperature: 0.2,
      top_p: 0.9,
      top_k: 20,
      stream: true,
      thinking: { type: 'disabled' },
      metadata: { user_id: 'u' },
      service_tier: 'auto',
      output_config: { effort: 'low' },
    }, true);
    expect(chat).toEqual({
      model: 'tiny',
      max_tokens: 64,
      stream: true,
      messages: [{ role: 'system', content: [{ type: 'text', text: 'Be brief.' }, { type: 'text', text: ' Really.' }] }, { role: 'user', content: 'hi' }],
      tools: [{ type: 'function', function: { name: 'save', description: 'Save', parameters: { type: 'object' } } }],
      tool_choice: 'required',
      stop: ['END'],
      temperature: 0.2,
      top_p: 0.9,
      top_k: 20,
      chat_template_kwargs: { enable_thinking: false },
    });
    expect(origins).toEqual(['system', 'messages[0]']);
  });

  it.each([
    [{ type: 'auto' }, 'auto'],
    [{ type: 'none' }, 'none'],
    [{ type: 'tool', name: 'save' }, { type: 'function', function: { name: 'save' } }],
  ])('tool_choice %j → %j', (choice, expected) => {
    const { chat } = toChatRequest({ max_tokens: 1, messages: [user('x')], tools: [{ name: 'save', input_schema: { type: 'object' } }], tool_choice: choice }, true);
    expect(chat.tool_choice).toEqual(expected);
  });

  it.each([[{ type: 'enabled', budget_tokens: 2048 }, true], [{ type: 'adaptive' }, true], [undefined, undefined]])('thinking %j → enable_thinking %j', (thinking, enabled) => {
    const { chat } = toChatRequest({ max_tokens: 1, messages: [user('x')], thinking }, true);
    expect((chat.chat_template_kwargs as { enable_thinking?: boolean } | undefined)?.enable_thinking).toBe(enabled);
  });

  it('splits a user message into tool messages and text, in order, keeping is_error; an assistant message into reasoning, content and calls', () => {
    const { chat, origins } = toChatRequest({
      max_tokens: 8,
      messages: [
        user('run both'),
        { role: 'assistant', content: [{ type: 'thinking', thinking: 'two calls', signature: 'x' }, { type: 'text', text: 'Running.' }, { type: 'tool_use', id: 't1', name: 'a', input: { n: 1.5 } }, { type: 'tool_use', id: 't2', name: 'b', input: {} }] },
        user([
          { type: 'tool_result', tool_use_id: 't1', content: 'ok' },
          { type: 'tool_result', tool_use_id: 't2', is_error: true, content: [{ type: 'text', text: 'boom' }] },
          { type: 'tool_result', tool_use_id: 't3' },
          { type: 'text', text: 'and then?' },
        ]),
      ],
    }, true);
    expect(chat.messages).toEqual([
      { role: 'user', content: 'run both' },
      { role: 'assistant', content: [{ type: 'text', text: 'Running.' }], reasoning_content: 'two calls', tool_calls: [{ id: 't1', type: 'function', function: { name: 'a', arguments: '{"n":1.5}' } }, { id: 't2', type: 'function', function: { name: 'b', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 't1', content: 'ok' },
      { role: 'tool', tool_call_id: 't2', content: [{ type: 'text', text: 'boom' }], is_error: true },
      { role: 'tool', tool_call_id: 't3', content: '' },
      { role: 'user', content: [{ type: 'text', text: 'and then?' }] },
    ]);
    expect(origins).toEqual(['messages[0]', 'messages[1]', 'messages[2].content[0]', 'messages[2].content[1]', 'messages[2].content[2]', 'messages[2].content[3]']);
  });

  it('an assistant message of tool calls alone has null content, as the chat path records it', () => {
    const { chat } = toChatRequest({ max_tokens: 8, messages: [user('go'), { role: 'assistant', content: [{ type: 'tool_use', id: 't', name: 'a', input: {} }] }, user([{ type: 'tool_result', tool_use_id: 't', content: 'done' }])] }, true);
    expect((chat.messages as unknown[])[1]).toEqual({ role: 'assistant', content: null, tool_calls: [{ id: 't', type: 'function', function: { name: 'a', arguments: '{}' } }] });
  });

  it('count_tokens needs no max_tokens, ignores stream, and takes a final assistant message', () => {
    const { chat } = toChatRequest({ model: 'tiny', stream: true, messages: [user('hi'), { role: 'assistant', content: 'Sure' }] }, false);
    expect(chat).toEqual({ model: 'tiny', messages: [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'Sure' }] });
  });

  it.each([
    [[], 'request body must be a JSON object'],
    [{ max_tokens: 1 }, 'messages: field required'],
    [{ max_tokens: 1, messages: [] }, 'messages: at least one message is required'],
    [{ messages: [user('x')] }, 'max_tokens: field required'],
    [{ max_tokens: 1, messages: [{ role: 'tool', content: 'x' }] }, 'messages[0].role: unknown role "tool"; expected user or assistant'],
    [{ max_tokens: 1, messages: [user([])] }, 'messages[0].content: a message needs at least one content block'],
    [{ max_tokens: 1, messages: [user([{ type: 'document', source: {} }])] }, 'messages[0].content[0].type: content block type "document" is not supported: this model takes text only'],
    [{ max_tokens: 1, messages: [user([{ type: 'tool_use', id: 'a', name: 'b', input: {} }])] }, 'messages[0].content[0].type: content block type "tool_use" is not supported in a user message'],
    [{ max_tokens: 1, messages: [user([{ type: 'tool_result', tool_use_id: 't', content: [{ type: 'image', source: {} }] }])] }, 'messages[0].content[0].content[0].type: content block type "image" is not supported: this model takes text only'],
    [{ max_tokens: 1, messages: [user([{ type: 'tool_result', tool_use_id: 't', is_error: 'yes' }])] }, 'messages[0].content[0].is_error: expected a boolean'],
    [{ max_tokens: 1, messages: [user([{ type: 'tool_result' }])] }, 'messages[0].content[0].tool_use_id: expected the id of the tool_use block this answers'],
    [{ max_tokens: 1, messages: [user('x'), { role: 'assistant', content: [{ type: 'redacted_thinking', data: 'zz' }] }, user('y')] }, 'messages[1].content[0].type: redacted_thinking blocks are not supported'],
    [{ max_tokens: 1, messages: [user('x'), { role: 'assistant', content: [{ type: 'tool_use', id: 'a', name: 'b', input: 'x=1' }] }, user('y')] }, 'messages[1].content[0].input: expected an object'],
    [{ max_tokens: 1, messages: [user('x')], system: [{ type: 'image' }] }, 'system[0].type: content block type "image" is not supported'],
    [{ max_tokens: 1, messages: [user('x')], tools: [{ type: 'bash_20250124', name: 'bash' }] }, 'tools[0].type: "bash_20250124" is a server tool'],
    [{ max_tokens: 1, messages: [user('x')], tools: [{ name: 'a', input_schema: {}, defer_loading: true }] }, 'tools[0].defer_loading: this field is not supported'],
    [{ max_tokens: 1, messages: [user('x')], tools: [{ name: 'a' }] }, 'tools[0].input_schema: field required'],
    [{ max_tokens: 1, messages: [user('x')], tool_choice: { type: 'any' } }, 'tool_choice: "any" needs tools: the request offers none'],
    [{ max_tokens: 1, messages: [user('x')], tool_choice: { type: 'sometimes' } }, 'tool_choice.type: expected auto, any, tool or none'],
    [{ max_tokens: 1, messages: [user('x')], stop_sequences: ['a', 'b', 'c', 'd', 'e'] }, 'stop_sequences: at most 4 stop sequences are supported, got 5'],
    [{ max_tokens: 1, messages: [user('x')], thinking: { type: 'maybe' } }, 'thinking.type: expected enabled, adaptive or disabled'],
    [{ max_tokens: 1, messages: [user('x')], output_config: { format: { type: 'json_schema' } } }, 'output_config.format: structured outputs are not supported'],
    [{ max_tokens: 1, messages: [user('x')], container: 'c1' }, 'container: this field is not supported by this gateway'],
  ])('refuses %j: %s', (body, message) => {
    expect(refusal(body)).toContain(message);
  });

  it('takes a tool\'s eager_input_streaming (OpenClaw sets it on every tool) and drops it; a non-boolean is refused', () => {
    const tool = { name: 'save', description: 'Save', input_schema: { type: 'object' }, eager_input_streaming: true, cache_control: { type: 'ephemeral' } };
    const { chat } = toChatRequest({ max_tokens: 8, messages: [user('hi')], tools: [tool] }, true);
    expect(chat.tools).toEqual([{ type: 'function', function: { name: 'save', description: 'Save', parameters: { type: 'object' } } }]);
    expect(refusal({ max_tokens: 8, messages: [user('hi')], tools: [{ ...tool, eager_input_streaming: 'yes' }] })).toContain('tools[0].eager_input_streaming: expected a boolean');
  });

  it('restates a chat refusal in Messages terms', () => {
    const origins = ['system', 'messages[0]', 'messages[1].content[0]'];
    expect(restate('messages[1].content: expected a string', origins)).toBe('messages[0].content: expected a string');
    expect(restate('messages[2].content: bad', origins)).toBe('messages[1].content[0]: bad');
    expect(restate('messages[0].content: bad', origins)).toBe('system: bad');
    expect(restate('tools[1].function.parameters: expected record', origins)).toBe('tools[1].input_schema: expected record');
    expect(restate('tools[0].function.name: too long', origins)).toBe('tools[0].name: too long');
    expect(restate('stop: a stop string must not be empty', origins)).toBe('stop_sequences: a stop string must not be empty');
  });
});

describe('Anthropic error statuses and types', () => {
  // The table docs/errors.md shows (written by errors-doc.ts), checked against the mapping itself.
  const doc = readFileSync(join(repoRoot(), 'docs/errors.md'), 'utf8');
  const rows = [...doc.matchAll(/^\| (\d{3}|other [45]xx) \| (\d{3}|the same) \| (\w+) \|$/gm)].map((m) => [m[1]!, m[2]!, m[3]!] as const);

  it('docs/errors.md shows the mapping the gateway answers with', () => {
    expect(rows.length).toBe(11);
    for (const [reef, status, type] of rows) {
      const examples = reef === 'other 4xx' ? [402, 405, 415, 421, 431] : reef === 'other 5xx' ? [500, 501, 502] : [Number(reef)];
      for (const n of examples) expect(anthropicErrorOf(n), `${n}`).toEqual({ status: status === 'the same' ? n : Number(status), type });
    }
  });

  it('knows the Messages paths', () => {
    expect(['/v1/messages', '/v1/messages?beta=true', '/v1/messages/count_tokens'].every(isMessagesPath)).toBe(true);
    expect(['/v1/messagesx', '/v1/chat/completions', '/v1/models'].some(isMessagesPath)).toBe(false);
  });
});
