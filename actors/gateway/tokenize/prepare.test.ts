import { describe, expect, it } from 'vitest';
import { tinyModelDir } from '../../../cluster/paths.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import { normalizeMessages } from './normalize.js';
import { prepareChat } from './prepare.js';
import { utf8Text } from './utf8.js';

const params = { rid: '01JAAAAAAAAAAAAAAAAAAAAAAA', topK: 4, defaultMaxTokens: 16 };

describe('utf8Text', () => {
  const decoder = new TextDecoder();
  let seed = 11;
  const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  /** Code points from every UTF-8 length class, ASCII-heavy like a transcript. */
  const randomText = (n: number) => {
    let s = '';
    for (let i = 0; i < n; i++) {
      const k = rand(10);
      const cp = k < 6 ? 0x20 + rand(0x5f) : k === 6 ? 0x80 + rand(0x780) : k === 7 ? 0x800 + rand(0xd000) : k === 8 ? 0xe000 + rand(0x2000) : 0x10000 + rand(0x100000);
      s += String.fromCodePoint(cp);
    }
    return s;
  };

  it('decodes exactly as TextDecoder: ASCII, well-formed UTF-8, malformed bytes, a byte-order mark', () => {
    const cases: Uint8Array[] = [new Uint8Array(0), Buffer.from('{"a": 1}'), Buffer.from('\u{feff}{"bom": true}'), Uint8Array.of(0xef, 0xbb)];
    for (let i = 0; i < 300; i++) {
      const text = Buffer.from(randomText(rand(400)));
      cases.push(text);
      // Malformed: a cut sequence, a stray continuation byte, an overlong form, an encoded surrogate.
      const bad = Buffer.from(text);
      if (bad.length > 0) bad[rand(bad.length)] = [0x80, 0xc0, 0xe0, 0xf5, 0xff][rand(5)]!;
      cases.push(bad, Buffer.concat([text, Uint8Array.of(0xed, 0xa0, 0x80)]), Buffer.concat([Uint8Array.of(0xc0, 0xaf), text]));
    }
    for (const bytes of cases) expect(utf8Text(bytes)).toBe(decoder.decode(bytes));
  });

  it('reads only its own bytes of a larger buffer', () => {
    const whole = Buffer.from(`xx${'é😀a'.repeat(50)}yy`);
    const view = new Uint8Array(whole.buffer, whole.byteOffset + 2, whole.length - 4);
    expect(utf8Text(view)).toBe('é😀a'.repeat(50));
    expect(utf8Text(Buffer.from('plain ascii').subarray(6))).toBe('ascii');
  });
});

describe('prepareChat engine bodies', () => {
  it('a new session, and a request without one, reuse the last session\'s id text and render and still send exactly their own ids', async () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const fresh = ChatTokenizer.load(tinyModelDir());
    const system = { role: 'system', content: 'You are a careful agent. '.repeat(120) };
    const body = (messages: unknown[]) => Buffer.from(JSON.stringify({ messages, max_tokens: 4 }));
    const turns: Array<[string | null, unknown[]]> = [
      ['s1', [system, { role: 'user', content: 'first question' }]],
      ['s1', [system, { role: 'user', content: 'first question' }, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'more' }]],
      ['s2', [system, { role: 'user', content: 'another session' }]],
      [null, [system, { role: 'user', content: 'no session at all' }]],
      ['s3', [{ role: 'user', content: 'a different prompt altogether' }]],
    ];
    for (const [sessionKey, messages] of turns) {
      const out = prepareChat(tok, body(messages), { ...params, sessionKey });
      if (!out.ok) throw new Error(out.message);
      const sent = JSON.parse(Buffer.from(out.engineBody).toString('utf8')) as { input_ids: number[]; rid: string };
      expect(sent.input_ids).toEqual(Array.from(out.promptIds));
      expect(Array.from(out.promptIds)).toEqual(Array.from(fresh.render(normalizeMessages(messages as never), null).ids));
      expect(sent.rid).toBe(params.rid);
    }
    // The later turns took ids from the earlier renders (the check above would pass without).
    expect(tok.stats().reuse.renders).toBeGreaterThanOrEqual(3);
  });
});

describe('prepareChat bodies of a session', () => {
  it('refuses a forbidden key or a deep nesting in an appended message as it does in a whole body', async () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const t1 = [{ role: 'system', content: 'Be brief. '.repeat(50) }, { role: 'user', content: 'hi' }];
    const body = (messagesJson: string) => Buffer.from(`{"messages":${messagesJson},"max_tokens":4}`);
    const json1 = JSON.stringify(t1);
    const bad = [
      `${json1.slice(0, -1)},{"role":"user","content":"x","__proto__":{"polluted":true}}]`,
      `${json1.slice(0, -1)},{"role":"user","content":"x","deep":${'['.repeat(130)}${']'.repeat(130)}}]`,
    ];
    for (const messages of bad) {
      // Session first (its last body is remembered), then the same body alone with no session
      // remembered that fits it.
      expect(prepareChat(tok, body(json1), { ...params, sessionKey: 'memo' }).ok).toBe(true);
      const extended = prepareChat(tok, body(messages), { ...params, sessionKey: 'memo' });
      const whole = prepareChat(tok, Buffer.from(`{"max_tokens":4,"messages":${messages}}`), { ...params, sessionKey: 'other' });
      expect(extended).toMatchObject({ ok: false, code: 'REEF_ERR_BODY' });
      expect(extended).toEqual(whole);
    }
    // A good next turn after them is served, with the ids of its own transcript.
    const good = [...t1, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'more' }];
    const out = prepareChat(tok, body(JSON.stringify(good)), { ...params, sessionKey: 'memo' });
    if (!out.ok) throw new Error(out.message);
    expect(Array.from(out.promptIds)).toEqual(Array.from(tok.render(good, null).ids));
  });
});
