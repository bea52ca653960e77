import { Packr } from 'msgpackr';

/**
 * The msgpack settings every Reef socket uses, in TypeScript and (mirrored) in Python.
 * No records extension (Python can't read it), `undefined` becomes nil, 64-bit ints decode to
 * numbers when safe and to bigint otherwise.
 */
const packr = new Packr({
  useRecords: false,
  encodeUndefinedAsNil: true,
  // 'auto' is supported by msgpackr 1.12 at run time but missing from its type declarations.
  int64AsType: 'auto' as 'number',
  mapsAsObjects: true,
  moreTypes: false,
  bundleStrings: false,
});

export function encode(value: unknown): Buffer {
  return packr.pack(value);
}

export function decode(bytes: Uint8Array): unknown {
  return packr.unpack(bytes);
}

/** Large numeric arrays travel as raw little-endian bytes (no typed-array extensions on the wire). */
export function f32ToBytes(values: ArrayLike<number>): Buffer {
  const arr = Float32Array.from(values as ArrayLike<number>);
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

export function bytesToF32(bytes: Uint8Array): Float32Array {
  const copy = new Uint8Array(bytes); // aligned copy: msgpack slices may start at odd offsets
  return new Float32Array(copy.buffer, copy.byteOffset, copy.byteLength / 4);
}

export function i32ToBytes(values: ArrayLike<number>): Buffer {
  const arr = Int32Array.from(values as ArrayLike<number>);
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

export function bytesToI32(bytes: Uint8Array): Int32Array {
  const copy = new Uint8Array(bytes);
  return new Int32Array(copy.buffer, copy.byteOffset, copy.byteLength / 4);
}
