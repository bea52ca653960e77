import { describe, expect, it } from 'vitest';
import { bytesToF32, bytesToI32, decode, encode, f32ToBytes, i32ToBytes } from './codec.js';

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
});
