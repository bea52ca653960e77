import { describe, expect, it } from 'vitest';
import { asst, sys, tool, user } from './correlate/fixtures.js';
import { contextOf, replyOf } from './turn-text.js';

const S = sys('You are a helpful agent.');
const calls = [
  { id: 'call_1', type: 'function', function: { name: 'cat', arguments: '{"path":"/etc/hostname"}' } },
  { id: 'call_2', type: 'function', function: { name: 'ls', arguments: '{"path":"/"}' } },
];

describe('contextOf', () => {
  it('is the message the reply answered: a user message, or a tool result', () => {
    expect(contextOf([S, user('hi')])).toBe('hi');
    expect(contextOf([S, user('list /'), asst('', { tool_calls: [calls[1]] }), tool('bin etc', 'call_2')])).toBe('bin etc');
  });

  it('skips a system reminder after the message the reply answered', () => {
    // A harness injects reminders after the tool result (as the correlator tests do): the reply
    // answered the tool result, not the reminder.
    expect(contextOf([S, user('list /'), asst('', { tool_calls: [calls[1]] }), tool('bin etc', 'call_2'), sys('Reminder: be brief.')])).toBe('bin etc');
  });

  it('holds every result of parallel tool calls', () => {
    expect(contextOf([S, user('host and /?'), asst('', { tool_calls: calls }), tool('box-7', 'call_1'), tool('bin etc', 'call_2')])).toBe('[tool cat]\nbox-7\n\n[tool ls]\nbin etc');
  });

  it('without an assistant message, only the newest user message: older ones are history', () => {
    expect(contextOf([S, user('summary of the conversation so far'), user('and finish')])).toBe('and finish');
  });

  it('falls back to the newest message when no user or tool message follows the last assistant message', () => {
    expect(contextOf([S])).toBe('You are a helpful agent.');
    expect(contextOf([S, user('hi'), asst('prefill')])).toBe('prefill');
    expect(contextOf([])).toBe('');
  });
});

describe('replyOf', () => {
  it('is the text, then one line per tool call', () => {
    expect(replyOf({ role: 'assistant', content: 'Looking.', tool_calls: [calls[1]] })).toBe('Looking.\ntool call: ls({"path":"/"})');
  });
});
