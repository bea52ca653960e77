import { describe, expect, it } from 'vitest';
import { BUILTIN_NAMES, luhn, patternProblem, Redactor } from './redact.js';

const all = new Redactor({ builtin: BUILTIN_NAMES, patterns: [], applyTo: 'openai' });
const r = (text: string) => all.redact(text).text;

describe('built-in redaction patterns', () => {
  it.each([
    ['write to jane.doe+reef@mail.example.co.uk today', 'write to [EMAIL] today'],
    ['ADMIN@EXAMPLE.ORG', '[EMAIL]'],
    ['call +1 415 555 0142 or +44 20 7946 0958', 'call [PHONE] or [PHONE]'],
    ['office (415) 555-0142, cell 415-555-0142, fax 415.555.0142', 'office [PHONE], cell [PHONE], fax [PHONE]'],
    ['card 4111 1111 1111 1111 exp 12/29', 'card [CARD] exp 12/29'],
    ['card 5500-0000-0000-0004', 'card [CARD]'],
    ['amex 378282246310005', 'amex [CARD]'],
    ['key sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8t done', 'key [API_KEY] done'],
    ['sk-ant-api03-AbCdEfGhIjKlMnOpQrSt', '[API_KEY]'],
    ['token ghp_0123456789abcdefghijABCDEFGHIJ012345', 'token [API_KEY]'],
    ['AKIAIOSFODNN7EXAMPLE', '[API_KEY]'],
    ['Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload', 'Authorization: Bearer [API_KEY]'],
  ])('masks %j', (input, want) => {
    expect(r(input)).toBe(want);
  });

  it.each([
    // Not e-mail addresses: a handle, a decorator, a version pin.
    'ping @jane on chat', 'use @Component() here', 'pip install torch==2.5@latest',
    // Not phones: years, amounts, an ISO date, a version, an id, a time range, a short number.
    'in 2024 we spent 1500000 dollars', 'due 2026-12-07', 'version 10.2.3', 'order 123456', 'open 9-17', 'room 101',
    // Digit runs that fail Luhn's check: an order number, a timestamp in ms.
    'order 4111 1111 1111 1112', 'at 1733600000000 ms',
    // Not keys: words that start alike, a short sk- word, a hash-like id without a provider prefix.
    'the sk-ills of a team', 'sketch the AKIA idea', 'commit 3f2a9c1b7d',
    // Plain prose.
    'The answer is 42, and the reply used no bullet lists.',
  ])('leaves %j alone', (input) => {
    expect(all.redact(input)).toEqual({ text: input, masked: 0 });
  });

  it('counts masks, keeps the text around them, and takes a key before its digits look like a card', () => {
    expect(all.redact('a@b.io and sk-4111111111111111abcd and 4111111111111111')).toEqual({ text: '[EMAIL] and [API_KEY] and [CARD]', masked: 3 });
  });

  it("Luhn's check", () => {
    expect(luhn('4111111111111111')).toBe(true);
    expect(luhn('4111111111111112')).toBe(false);
    expect(luhn('79927398713')).toBe(true);
  });
});

describe('configured patterns and where redaction applies', () => {
  it('masks a configured pattern under its name, next to the built-in ones chosen', () => {
    const x = new Redactor({ builtin: ['email'], patterns: [{ name: 'employee_id', regex: 'EMP-\\d{6}' }], applyTo: 'openai' });
    expect(x.redact('EMP-004217 (a@b.io) paid with 4111 1111 1111 1111').text).toBe('[EMPLOYEE_ID] ([EMAIL]) paid with 4111 1111 1111 1111');
  });

  it('applies to external OpenAI-API PRMs by default, to every PRM with apply_to all, and to none with no rule', () => {
    expect(all.appliesTo('openai')).toBe(true);
    expect(all.appliesTo('sglang')).toBe(false);
    expect(new Redactor({ builtin: BUILTIN_NAMES, patterns: [], applyTo: 'all' }).appliesTo('sglang')).toBe(true);
    expect(new Redactor({ builtin: [], patterns: [], applyTo: 'all' }).appliesTo('openai')).toBe(false);
  });

  it('refuses a pattern that does not compile or matches the empty string', () => {
    expect(patternProblem('EMP-\\d{6}')).toBeNull();
    expect(patternProblem('(unclosed')).toMatch(/^expected a regular expression/);
    expect(patternProblem('x*')).toMatch(/empty string/);
  });
});
