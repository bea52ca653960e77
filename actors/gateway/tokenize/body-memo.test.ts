import { describe, expect, it } from 'vitest';
import { extendBody, messageCuts, rememberBody, type RememberedBody } from './body-memo.js';
import { NotUtf8Error, utf8Text } from './utf8.js';

let seed = 7;
const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
const pick = <T>(xs: readonly T[]): T => xs[rand(xs.length)]!;

/** Text that stresses the scanner: quotes, backslash runs, brackets, commas, non-ASCII. */
const nasty = ['plain', 'a "quoted" word', 'back\\slash', 'ends with \\', '\\\\"', '[x, {y}]', ',,,', 'é😀', '\u2028', '}]', ''];
const randomString = () => Array.from({ length: 1 + rand(3) }, () => pick(nasty)).join(pick(['', ' ', '\n']));

function randomValue(depth: number): unknown {
  const k = rand(depth > 2 ? 4 : 7);
  if (k === 0) return randomString();
  if (k === 1) return pick([0, -1.5, 1e21, 3, 0.5]);
  if (k === 2) return pick([true, false, null]);
  if (k === 3) return rand(100);
  if (k === 4) return Array.from({ length: rand(3) }, () => randomValue(depth + 1));
  const o: Record<string, unknown> = {};
  for (let i = rand(4); i > 0; i--) o[pick(['role', 'content', 'x', 'a"b', '[', 'messages'])] = randomValue(depth + 1);
  return o;
}

const randomMessage = () => (rand(5) === 0 ? randomValue(1) : { role: pick(['user', 'assistant', 'tool']), content: randomString(), ...(rand(3) === 0 ? { extra: randomValue(1) } : {}) });

/** JSON text with random whitespace between tokens (JSON.stringify with indentation, or none). */
function serialise(v: unknown): string {
  return JSON.stringify(v, null, pick([undefined, 0, 1, '\t', ' \r\n']));
}

function bodyOf(messages: unknown[], rest: Record<string, unknown>, messagesFirst: boolean): Buffer {
  const obj = messagesFirst ? { messages, ...rest } : { ...rest, messages };
  return Buffer.from(serialise(obj));
}

const parse = (b: Uint8Array) => JSON.parse(utf8Text(b)) as unknown;

/** Every cut must be where the array may be cut: the elements after it parse as what follows. */
function expectCutsValid(r: RememberedBody): void {
  const b = r.body;
  const all = (parse(b) as { messages: unknown[] }).messages;
  expect(r.cuts.at.length).toBe(r.cuts.count.length);
  // One cut after each element, none twice: a memo's cuts are copied into the memos that extend it.
  expect(r.cuts.count).toEqual(all.map((_, i) => i + 1));
  r.cuts.at.forEach((at, i) => {
    const rest = JSON.parse(`[null${utf8Text(b.subarray(at, r.cuts.close))}]`) as unknown[];
    expect(rest.slice(1)).toEqual(all.slice(r.cuts.count[i]));
  });
  expect(b[r.cuts.close]).toBe(0x5d);
}

describe('body memo', () => {
  it('finds the cuts of the top-level messages array only', () => {
    const b = Buffer.from('{"model":"m","nested":{"messages":[1]},"messages":[{"a":"],"},[1,2], "x\\"]" ,3],"tools":[]}');
    const cuts = messageCuts(b)!;
    expect(cuts.count).toEqual([1, 2, 3, 4]);
    expect(b.toString('latin1', cuts.close)).toBe('],"tools":[]}');
    expectCutsValid(rememberBody(b, parse(b))!);
  });

  it('does not remember bodies it cannot extend exactly', () => {
    const no = [
      '{"messages":[1],"messages":[2]}', // duplicate key: JSON.parse keeps the last
      '{"m\\u0065ssages":[1]}', // an escaped spelling of the key
      '{"messages":[1],"m\\u0065ssages":[2]}', // ... which wins over the plain one
      '{"messages":[]}',
      '{"messages":"text"}',
      '\u{feff}{"messages":[1]}',
      '[1,2]',
    ];
    for (const text of no) {
      const b = Buffer.from(text);
      expect(rememberBody(b, parse(b)), text).toBeNull();
    }
  });

  it('equals JSON.parse of the whole body whenever it answers (differential, random bodies and edits)', () => {
    let answered = 0;
    let declined = 0;
    for (let round = 0; round < 600; round++) {
      const rest = { model: 'm', tools: [randomValue(1), randomValue(1)], max_tokens: rand(50), stream: rand(2) === 0 };
      const messagesFirst = rand(2) === 0;
      let messages = Array.from({ length: 1 + rand(4) }, randomMessage);
      let body = bodyOf(messages, rest, messagesFirst);
      let remembered = rememberBody(body, parse(body));
      if (remembered === null) continue;
      expectCutsValid(remembered);
      for (let turn = 0; turn < 8 && remembered !== null; turn++) {
        const edit = rand(10);
        let next: Buffer;
        if (edit <= 3) {
          // The usual turn: the transcript grows.
          messages = [...messages, ...Array.from({ length: rand(3) }, randomMessage)];
          next = bodyOf(messages, rest, messagesFirst);
        } else if (edit === 4) {
          // An edited or dropped last message.
          messages = rand(2) === 0 ? messages.slice(0, -1) : [...messages.slice(0, -1), randomMessage()];
          next = bodyOf(messages, rest, messagesFirst);
        } else if (edit === 5) {
          next = bodyOf(messages, { ...rest, max_tokens: 1000 + rand(50) }, messagesFirst);
        } else if (edit === 6) {
          // The same length, one digit changed: in the tail, or just before a cut.
          const text = remembered.body.toString('latin1');
          const from = rand(2) === 0 ? remembered.cuts.close : pick(remembered.cuts.at) - 1;
          const at = text.slice(from).search(/[0-9]/) + from;
          if (at < from) continue;
          next = Buffer.from(text.slice(0, at) + String((Number(text[at]) + 1 + rand(9)) % 10) + text.slice(at + 1), 'latin1');
        } else if (edit === 7) {
          // The byte just before a cut replaced.
          const text = remembered.body.toString('latin1');
          const at = pick(remembered.cuts.at) - 1;
          next = Buffer.from(text.slice(0, at) + pick(['1', '2', '}', ' ', 'e', '"', ']']) + text.slice(at + 1), 'latin1');
        } else {
          // Raw byte edits around the end of the array: most are malformed, some change meaning.
          const text = remembered.body.toString('latin1');
          const at = remembered.cuts.close - rand(3);
          const insert = pick([',', ',1', '.5', 'e5', ' ,{"role":"user"}', ',]', '\u00ff', ',"\\"', '', ' ']);
          next = Buffer.from(text.slice(0, at) + insert + text.slice(at + rand(2)), 'latin1');
        }
        const ext = extendBody(remembered, next);
        let whole: unknown;
        let wholeOk = true;
        try {
          whole = parse(next);
        } catch {
          wholeOk = false;
        }
        if (ext === null) {
          declined++;
          if (!wholeOk) break;
          remembered = rememberBody(next, whole);
          continue;
        }
        answered++;
        expect(wholeOk, next.toString()).toBe(true);
        // Key order too: compare the serialisations.
        expect(JSON.stringify(ext.json)).toBe(JSON.stringify(whole));
        expect(ext.added).toEqual((whole as { messages: unknown[] }).messages.slice(-ext.added.length || Infinity));
        remembered = ext.remember();
        if (remembered !== null) expectCutsValid(remembered);
      }
    }
    // Both paths were exercised.
    expect(answered).toBeGreaterThan(300);
    expect(declined).toBeGreaterThan(50);
  });

  it('keeps one cut per message along a chain of sessions, each starting from the one before', () => {
    // What a gateway's worker does: a session's first body extends the newest body it remembers,
    // another session's, and its next turns extend its own.
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
    const t1 = [{ role: 'system', content: 'You are an agent.' }, { role: 'user', content: 'hi' }];
    const t2 = [...t1, { role: 'assistant', content: 'hello' }, { role: 'tool', content: '{"ok":1}' }];
    const t3 = [...t2, { role: 'assistant', content: 'done' }, { role: 'user', content: 'again' }];
    const body = (messages: unknown[]) => Buffer.from(JSON.stringify({ model: 'm', messages, tools, stream: true }));
    let newest = rememberBody(body(t3), parse(body(t3)))!;
    for (let session = 0; session < 50; session++) {
      for (const messages of [t1, t2, t3]) {
        const ext = extendBody(newest, body(messages))!;
        expect(ext).not.toBeNull();
        newest = ext.remember()!;
        expect(newest.cuts.count).toEqual(messages.map((_, i) => i + 1));
        expectCutsValid(newest);
      }
    }
  });

  it('parses only the appended messages of a growing transcript and freezes what it keeps', () => {
    const system = { role: 'system', content: 'You are an agent. '.repeat(500) };
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
    const t1 = [system, { role: 'user', content: 'hi' }];
    const b1 = Buffer.from(JSON.stringify({ model: 'm', messages: t1, tools, stream: true }));
    const r1 = rememberBody(b1, parse(b1))!;
    const t2 = [...t1, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'more' }];
    const b2 = Buffer.from(JSON.stringify({ model: 'm', messages: t2, tools, stream: true }));
    const ext = extendBody(r1, b2)!;
    expect(ext.added).toEqual(t2.slice(2));
    // The remembered parts are shared, not parsed again.
    expect((ext.json.messages as unknown[])[0]).toBe(r1.messages[0]);
    expect(ext.json.tools).toBe(r1.json.tools);
    expect(Object.isFrozen(ext.json.tools)).toBe(true);
    expect(ext.remember()!.json).toBe(ext.json);
    expect(() => {
      'use strict';
      ((ext.json.messages as Array<Record<string, unknown>>)[3]!).content = 'changed';
    }).toThrow(TypeError);
  });

  it('keeps the body bytes and the decoding of a cut exact: a byte-order mark or a broken byte after the cut is not read alone', () => {
    const b1 = Buffer.from('{"messages":[{"role":"user","content":"a"}],"stream":true}');
    const r1 = rememberBody(b1, parse(b1))!;
    const withBom = Buffer.concat([b1.subarray(0, b1.indexOf(']')), Buffer.from([0xef, 0xbb, 0xbf]), b1.subarray(b1.indexOf(']'))]);
    // JSON.parse refuses U+FEFF between elements, so the memo must not answer.
    expect(() => parse(withBom)).toThrow();
    expect(extendBody(r1, withBom)).toBeNull();
    const broken = Buffer.concat([b1.subarray(0, b1.indexOf(']')), Buffer.from(',"\xff"', 'latin1'), b1.subarray(b1.indexOf(']'))]);
    // Not UTF-8: the memo does not answer, and the whole body is refused (prepare.test.ts).
    expect(extendBody(r1, broken)).toBeNull();
    expect(() => utf8Text(broken)).toThrow(NotUtf8Error);
  });
});
