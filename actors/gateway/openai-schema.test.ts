import { describe, expect, it } from 'vitest';
import { parseChatRequest } from './openai-schema.js';

const MESSAGES = [{ role: 'user', content: 'hi' }];
const TOOL = (name: string) => ({ type: 'function', function: { name, parameters: { type: 'object' } } });

describe('parseChatRequest: fields refused after the schema', () => {
  it.each([
    ['an empty stop string (regression: both engines ended every reply after one token, empty)', { stop: '' }, 'stop', /must not be empty/],
    ['an empty string among the stop strings', { stop: ['\n\n', ''] }, 'stop', /must not be empty/],
    ['a stop string longer than 256 characters (each streamed event checks the tail against it, quadratic in its length)', { stop: ['END', 'x'.repeat(257)] }, 'stop', /at most 256 characters, got one of 257/],
    ['one long string as the stop', { stop: 'y'.repeat(100_000) }, 'stop', /at most 256 characters, got one of 100000/],
    ['logprobs: true (regression: answered logprobs: null)', { logprobs: true }, 'logprobs', /not returned in the reply.*records\/\{id\}/],
    ['top_logprobs without logprobs', { top_logprobs: 5 }, 'top_logprobs', /not returned in the reply/],
    ['top_logprobs with logprobs: false', { logprobs: false, top_logprobs: 2 }, 'top_logprobs', /not returned in the reply/],
    ['n = 2', { n: 2 }, 'n', /n must be 1/],
    ['tool_choice "required" without tools', { tool_choice: 'required' }, 'tool_choice', /^tool_choice "required" needs tools: the request offers none$/],
    ['tool_choice "required" with an empty tool list', { tools: [], tool_choice: 'required' }, 'tool_choice', /needs tools/],
    ['a named tool_choice without tools', { tool_choice: { type: 'function', function: { name: 'f' } } }, 'tool_choice', /^tool_choice naming "f" needs tools/],
    ['a named tool_choice of a tool not offered', { tools: [TOOL('g')], tool_choice: { type: 'function', function: { name: 'f' } } }, 'tool_choice.function.name', /^tool_choice names "f", which is not among the request's tools$/],
    ['chat_template_kwargs that is not an object', { chat_template_kwargs: ['enable_thinking'] }, 'chat_template_kwargs', /expected an object of chat template variables/],
    ['chat_template_kwargs as a string', { chat_template_kwargs: 'enable_thinking=false' }, 'chat_template_kwargs', /expected an object/],
    ['chat_template_kwargs setting the messages', { chat_template_kwargs: { messages: [] } }, 'chat_template_kwargs.messages', /set from the request/],
    ['chat_template_kwargs setting add_generation_prompt', { chat_template_kwargs: { enable_thinking: true, add_generation_prompt: false } }, 'chat_template_kwargs.add_generation_prompt', /set from the request/],
    ['chat_template_kwargs with an apply_chat_template argument', { chat_template_kwargs: { continue_final_message: true } }, 'chat_template_kwargs.continue_final_message', /argument of apply_chat_template/],
  ] as const)('%s', (_name, extra, param, message) => {
    const out = parseChatRequest({ messages: MESSAGES, ...extra });
    expect(out.ok).toBe(false);
    if (out.ok) return;
    expect(out.issue.param).toBe(param);
    expect(out.issue.message).toMatch(message);
  });

  it.each([
    ['stop strings that are not empty', { stop: ['\n\n', ' '] }],
    ['a single stop string', { stop: 'END' }],
    ['stop: null', { stop: null }],
    ['stop: []', { stop: [] }],
    ['logprobs: false', { logprobs: false }],
    ['logprobs: null, top_logprobs: null', { logprobs: null, top_logprobs: null }],
    ['top_logprobs: 0', { logprobs: false, top_logprobs: 0 }],
    ['tool_choice "auto" without tools', { tool_choice: 'auto' }],
    ['tool_choice: null without tools', { tool_choice: null }],
    ['tool_choice "required" with tools', { tools: [TOOL('f')], tool_choice: 'required' }],
    ['a named tool_choice of an offered tool', { tools: [TOOL('g'), TOOL('f')], tool_choice: { type: 'function', function: { name: 'f' } } }],
    ['chat_template_kwargs', { chat_template_kwargs: { enable_thinking: false, reasoning_effort: 'low' } }],
    ['chat_template_kwargs: null', { chat_template_kwargs: null }],
  ] as const)('accepts %s', (_name, extra) => {
    expect(parseChatRequest({ messages: MESSAGES, ...extra }).ok).toBe(true);
  });

  it('keeps chat_template_kwargs on the request, as sent', () => {
    const out = parseChatRequest({ messages: MESSAGES, chat_template_kwargs: { enable_thinking: false } });
    expect(out.ok && (out.value as Record<string, unknown>).chat_template_kwargs).toEqual({ enable_thinking: false });
  });
});

describe('parseChatRequest: what an invalid field is told', () => {
  it.each([
    ['tool_choice of an unknown value (regression: "Invalid input")', { tool_choice: 'any' }, 'tool_choice', 'tool_choice: expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'],
    ['tool_choice that is an array', { tool_choice: ['auto'] }, 'tool_choice', 'tool_choice: expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'],
    ['tool_choice naming no function', { tool_choice: { type: 'function' } }, 'tool_choice', 'tool_choice: expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'],
    ['five stop strings (regression: "Invalid input")', { stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop', 'stop: Too big: expected array to have <=4 items'],
    ['a stop string that is a number', { stop: ['a', 1] }, 'stop[1]', 'stop[1]: expected string, received number'],
    ['stop that is a number', { stop: 5 }, 'stop', 'stop: expected a string or an array of at most 4 strings'],
    ['a text part without its text (regression: "expected a string or an array of content parts")', { messages: [{ role: 'user', content: [{ type: 'text' }] }] }, 'messages[0].content[0].text', 'messages[0].content[0].text: expected string, received undefined'],
    ['a content part without a type', { messages: [{ role: 'user', content: [{ text: 'x' }] }] }, 'messages[0].content[0].type', 'messages[0].content[0].type: a content part needs a type; expected {"type": "text", "text": ...}'],
    ['a refusal part in an assistant message', { messages: [{ role: 'assistant', content: [{ type: 'refusal', refusal: 'no' }] }, { role: 'user', content: 'x' }] }, 'messages[0].content[0].type', 'messages[0].content[0].type: content part type "refusal" is not supported: this model takes text only'],
    ['a content part that is not an object', { messages: [{ role: 'tool', content: ['x'] }] }, 'messages[0].content[0]', 'messages[0].content[0]: expected object, received string'],
    ['content that is neither a string nor an array', { messages: [{ role: 'user', content: 42 }] }, 'messages[0].content', 'messages[0].content: expected a string or an array of content parts'],
    ['an unknown role', { messages: [{ role: 'wizard', content: 'hi' }] }, 'messages[0].role', 'messages[0].role: unknown role "wizard"; expected system, developer, user, assistant or tool'],
  ] as const)('%s', (_name, extra, param, message) => {
    const out = parseChatRequest({ messages: MESSAGES, ...extra });
    expect(out).toEqual({ ok: false, issue: { param, message } });
  });
});

describe('parseChatRequest: stop strings up to the limit', () => {
  it('accepts four stop strings of 256 characters', () => {
    expect(parseChatRequest({ messages: MESSAGES, stop: ['a', 'b', 'c', 'é'.repeat(256)] }).ok).toBe(true);
  });
});
