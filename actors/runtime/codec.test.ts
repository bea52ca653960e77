import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { bytesToF32, bytesToI32, decode, encode, f32ToBytes, i32ToBytes } from './codec.js';
import { ReefError } from './errors.js';

describe('codec', () => {
  it('round-trips maps with null, nested arrays and unicode', () => {
    const msg = { type: 'ping', requestId: 'r-1', value: null, nested: [[1, 2], ['é', '漢字']], flag: false };
    expect(decode(encode(msg))).toEqual(msg);
  });

  it('writes undefined as nil so Python sees None', () => {
    expect(decode(encode({ a: undefined }))).toEqual({ a: null });
  });

  it('decodes 64-bit integers as numbers when safe and as bigint otherwise', () => {
    expect(decode(encode({ n: 2 ** 40 }))).toEqual({ n: 2 ** 40 });
    expect(decode(encode({ n: 2n ** 62n }))).toEqual({ n: 2n ** 62n });
  });

  it('moves numeric arrays as raw little-endian bytes', () => {
    const ids = [0, 1, -5, 2 ** 31 - 1];
    const lps = [-0.5, -1.25, 0];
    const wire = decode(encode({ ids: i32ToBytes(ids), lps: f32ToBytes(lps) })) as { ids: Uint8Array; lps: Uint8Array };
    expect(Array.from(bytesToI32(wire.ids))).toEqual(ids);
    expect(Array.from(bytesToF32(wire.lps))).toEqual(lps);
    expect(Buffer.from(wire.ids).readInt32LE(8)).toBe(-5);
  });

  // msgpackr without moreTypes wrote Int32Array([1, 2]) as a bin of 8 bytes holding 01 02 and six
  // bytes of stale pool memory: a record's ids sent unconverted reached the trainer corrupted.
  it('refuses a typed array that is not bytes instead of truncating its elements', () => {
    for (const view of [new Int32Array([1, 2]), new Float32Array([1.5, 2]), new Float64Array([1]), new Uint16Array([258]), new DataView(new ArrayBuffer(4))]) {
      let err: unknown = null;
      try {
        encode({ ids: view });
      } catch (e) {
        err = e;
      }
      expect(err, view.constructor.name).toBeInstanceOf(ReefError);
      expect(err).toMatchObject({ code: 'REEF_ERR_BAD_MESSAGE', message: expect.stringContaining(`a ${view.constructor.name} cannot be encoded`) });
    }
    // Bytes still go as they are, and the encoder is usable after a refusal.
    expect(decode(encode({ b: Buffer.from([1, 2]), u: new Uint8Array([3, 4]) }))).toEqual({ b: Buffer.from([1, 2]), u: Buffer.from([3, 4]) });
  });

  it('refuses what msgpack cannot carry with REEF_ERR_BAD_MESSAGE, not a plain Error', () => {
    for (const value of [{ n: 2n ** 64n }, { n: -(2n ** 63n) - 1n }, { s: Symbol('x') }]) {
      let err: unknown = null;
      try {
        encode(value);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ReefError);
      expect(err).toMatchObject({ code: 'REEF_ERR_BAD_MESSAGE', message: expect.stringMatching(/^malformed message: cannot encode as msgpack \(.+\)$/) });
    }
    expect(decode(encode({ n: 2n ** 63n - 1n }))).toEqual({ n: 2n ** 63n - 1n });
  });

  it('writes a lone surrogate as U+FFFD in short strings as in long ones, so the bytes are valid UTF-8', () => {
    // A surrogate's UTF-8 form (CESU-8) starts ED A0..ED BF; no valid UTF-8 holds that pair.
    const cesu = (b: Buffer) => b.some((x, i) => x === 0xed && (b[i + 1] ?? 0) >= 0xa0);
    for (const [sent, expected] of [
      ['a\uD83Db', 'a\uFFFDb'],
      ['\uDE00'.repeat(3), '\uFFFD'.repeat(3)],
      [`${'x'.repeat(100)}\uD83D`, `${'x'.repeat(100)}\uFFFD`],
      ['😀 ok', '😀 ok'],
    ]) {
      const bytes = encode({ text: sent, list: [sent], [sent]: 1 });
      expect(decode(bytes)).toEqual({ text: expected, list: [expected], [expected]: 1 });
      expect(cesu(bytes), JSON.stringify(sent)).toBe(false);
    }
    const msg = { a: 'fine', nested: { b: ['x'] } };
    expect(decode(encode(msg))).toEqual(msg);
  });

  it('refuses bytes that are not a whole number of 4-byte values instead of dropping the rest', () => {
    expect(() => bytesToF32(Buffer.from([0, 0, 0xc0]))).toThrow(expect.objectContaining({ code: 'REEF_ERR_BAD_MESSAGE' }));
    expect(() => bytesToI32(Buffer.from([1, 0, 0, 0, 2]))).toThrow(/5 bytes are not a whole number of i32 values/);
    expect(Array.from(bytesToF32(Buffer.from([0, 0, 0xc0, 0x3f])))).toEqual([1.5]);
    expect(bytesToI32(Buffer.alloc(0))).toHaveLength(0);
  });
  it('refuses a cyclic object sent with msgpackr structured clone', () => {
    const cyclic: Record<string, unknown> = { type: 'ping', requestId: 'r' };
    cyclic.self = cyclic;
    const bytes = new Packr({ structuredClone: true }).pack(cyclic);
    expect(() => decode(bytes)).toThrow(/Structured clone extension is disabled/);
  });
});
