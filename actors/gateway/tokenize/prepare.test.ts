import { describe, expect, it } from 'vitest';
import { utf8Text } from './prepare.js';

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
