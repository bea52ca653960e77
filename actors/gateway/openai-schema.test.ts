import { describe, expect, it } from 'vitest';
import { parseChatRequest } from './openai-schema.js';

const MESSAGES = [{ role: 'user', content: 'hi' }];

describe('parseChatRequest: fields refused after the schema', () => {
  it.each([
    ['an empty stop string (regression: both engines ended every reply after one token, empty)', { stop: '' }, 'stop', /must not be empty/],
    ['an empty string among the stop strings', { stop: ['\n\n', ''] }, 'stop', /must not be empty/],
    ['logprobs: true (regression: answered logprobs: null)', { logprobs: true }, 'logprobs', /not returned in the reply.*records\/\{id\}/],
    ['top_logprobs without logprobs', { top_logprobs: 5 }, 'top_logprobs', /not returned in the reply/],
    ['top_logprobs with logprobs: false', { logprobs: false, top_logprobs: 2 }, 'top_logprobs', /not returned in the reply/],
    ['n = 2', { n: 2 }, 'n', /n must be 1/],
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
  ] as const)('accepts %s', (_name, extra) => {
    expect(parseChatRequest({ messages: MESSAGES, ...extra }).ok).toBe(true);
  });
});
