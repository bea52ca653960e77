import { describe, expect, it } from 'vitest';
import { canonicalJson, contentText, HashMemo, messageHash, mix } from './hash.js';

const memo = new HashMemo();
const h = (m: unknown): number => messageHash(m, memo);

describe('message hashing', () => {
  it('is a 53-bit integer, stable and order-sensitive when mixed', () => {
    const a = h({ role: 'user', content: 'hi' });
    expect(Number.isSafeInteger(a) && a >= 0).toBe(true);
    expect(h({ content: 'hi', role: 'user' })).toBe(a);
    expect(mix(1, 2)).not.toBe(mix(2, 1));
  });

  it('tells roles, names, tool ids and contents apart', () => {
    const base = h({ role: 'user', content: 'hi' });
    expect(h({ role: 'system', content: 'hi' })).not.toBe(base);
    expect(h({ role: 'user', content: 'hi', name: 'bob' })).not.toBe(base);
    expect(h({ role: 'tool', content: 'hi', tool_call_id: 'a' })).not.toBe(h({ role: 'tool', content: 'hi', tool_call_id: 'b' }));
    expect(h({ role: 'user', content: 'hi ' })).not.toBe(base);
  });

  it('reads text parts as their text, and null, absent and empty content as the same', () => {
    expect(h({ role: 'user', content: [{ type: 'text', text: 'h' }, { type: 'text', text: 'i' }] })).toBe(h({ role: 'user', content: 'hi' }));
    expect(h({ role: 'assistant', content: null })).toBe(h({ role: 'assistant' }));
    expect(h({ role: 'assistant', content: '' })).toBe(h({ role: 'assistant' }));
    expect(contentText([{ type: 'image_url', image_url: { url: 'x' } }])).toBeNull();
  });

  it('ignores reasoning and a leading think block in assistant replies only', () => {
    const reply = h({ role: 'assistant', content: 'answer' });
    expect(h({ role: 'assistant', content: 'answer', reasoning_content: 'why' })).toBe(reply);
    expect(h({ role: 'assistant', content: '<think>why</think>\n\nanswer\n' })).toBe(reply);
    expect(h({ role: 'user', content: '<think>why</think>answer' })).not.toBe(h({ role: 'user', content: 'answer' }));
  });

  it('compares tool-call arguments as canonical JSON', () => {
    const call = (args: string, id = 'c') => h({ role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: 'f', arguments: args } }] });
    expect(call('{"a":1,"b":[1,2]}')).toBe(call('{ "b": [1, 2], "a": 1 }'));
    expect(call('{"a":1}')).not.toBe(call('{"a":2}'));
    expect(call('{"a":1}')).not.toBe(call('{"a":1}', 'd'));
    expect(call('{"a": tru')).not.toBe(call('{"a":true}'));
  });

  it('hashes tool-call arguments by their canonical JSON alone, whatever the length of the text sent', () => {
    const call = (args: string) => h({ role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: args } }] });
    // 1007 characters as the model wrote them, 1207 once re-serialised (1e21 → 1e+21): a client
    // that re-serialises sends the longer text back.
    const written = `{"v":[${Array(200).fill('1e21').join(',')}]}`;
    const resent = JSON.stringify(JSON.parse(written));
    expect([written.length < 1024, resent.length >= 1024]).toEqual([true, true]);
    expect(call(written)).toBe(call(resent));
  });

  it('hashes long text natively with the same result memoised or not, across memo clears', () => {
    const long = 'x'.repeat(5000);
    const small = new HashMemo(6000);
    const first = messageHash({ role: 'system', content: long }, small);
    messageHash({ role: 'system', content: 'y'.repeat(5000) }, small); // overflows: memo cleared
    expect(messageHash({ role: 'system', content: `${long}` }, small)).toBe(first);
    expect(h({ role: 'system', content: long })).toBe(first);
    expect(h({ role: 'system', content: `${long.slice(1)}y` })).not.toBe(first);
  });

  it('canonical JSON sorts keys at every depth', () => {
    expect(canonicalJson({ b: 1, a: { d: [1, { z: 0, y: null }], c: 'x' } })).toBe('{"a":{"c":"x","d":[1,{"y":null,"z":0}]},"b":1}');
  });
});
