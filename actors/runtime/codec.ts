import { addExtension, Packr } from 'msgpackr';
import { ReefError } from './errors.js';

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
  // Left undefined, msgpackr decodes its structured-clone extensions (0x69, 0x70), so a peer could
  // hand a handler a cyclic object that any walk of it (zod, JSON.stringify, a log line) never ends.
  structuredClone: false,
});

/**
 * Typed-array views other than Uint8Array are refused. Without `moreTypes`, msgpackr writes such a
 * view as a bin of `byteLength` bytes but copies it element by element, so an Int32Array([1, 2])
 * went out as `01 02` plus six bytes of stale pool memory. Encoding the view's bytes instead would
 * be right for an Int32Array and silently wrong for a Float64Array where the peer reads f32: the
 * wire does not say the element type, so the sender has to pick it (`i32ToBytes`, `f32ToBytes`).
 * msgpackr keeps extensions per module, not per Packr; this codec is its only user in Reef.
 */
const VIEW_CLASSES = [
  'Int8Array', 'Uint8ClampedArray', 'Int16Array', 'Uint16Array', 'Int32Array', 'Uint32Array',
  'Float16Array', 'Float32Array', 'Float64Array', 'BigInt64Array', 'BigUint64Array', 'DataView',
];
for (const name of VIEW_CLASSES) {
  const Class = (globalThis as Record<string, unknown>)[name];
  if (typeof Class !== 'function') continue;
  addExtension({
    Class: Class as new () => unknown,
    write: () => {
      throw new ReefError('REEF_ERR_BAD_MESSAGE', {
        details: `a ${name} cannot be encoded: send numbers as raw little-endian bytes (i32ToBytes, f32ToBytes) or a Uint8Array`,
      });
    },
  });
}

/**
 * Throws REEF_ERR_BAD_MESSAGE for what msgpack cannot carry: a typed-array view that is not a
 * Uint8Array (see above), a bigint outside 64 bits, a symbol. msgpackr's own errors are plain
 * Errors, which callers that sort failures by code took for a transient fault and retried.
 */
export function encode(value: unknown): Buffer {
  try {
    return packr.pack(wellFormed(value));
  } catch (err) {
    if (err instanceof ReefError) throw err;
    throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: `cannot encode as msgpack (${err instanceof Error ? err.message : String(err)})` }, { cause: err });
  }
}

export function decode(bytes: Uint8Array): unknown {
  return packr.unpack(bytes);
}

type WellFormedString = string & { isWellFormed(): boolean; toWellFormed(): string };

/**
 * msgpackr writes a string shorter than 64 code units by hand, and a lone surrogate in it (text cut
 * in the middle of an emoji, a client's "\ud83d" in JSON) as the three bytes of CESU-8: invalid
 * UTF-8, so Python failed to decode the whole message and answered it with no requestId, and the
 * caller waited out its timeout. Longer strings already went as U+FFFD (Buffer's UTF-8 encoder);
 * every string now does. Objects are copied only where a string changes.
 */
function wellFormed(value: unknown): unknown {
  if (typeof value === 'string') return (value as WellFormedString).isWellFormed() ? value : (value as WellFormedString).toWellFormed();
  if (typeof value !== 'object' || value === null) return value;
  if (Array.isArray(value)) {
    let out: unknown[] | null = null;
    for (let i = 0; i < value.length; i++) {
      const v = wellFormed(value[i]);
      if (v !== value[i]) (out ??= value.slice())[i] = v;
    }
    return out ?? value;
  }
  const proto = Object.getPrototypeOf(value) as unknown;
  if (proto !== Object.prototype && proto !== null) return value;
  let out: Record<string, unknown> | null = null;
  for (const [k, v] of Object.entries(value)) {
    const key = wellFormed(k) as string;
    const w = wellFormed(v);
    if (key === k && w === v) continue;
    out ??= { ...(value as Record<string, unknown>) };
    if (key !== k) delete out[k];
    out[key] = w;
  }
  return out ?? value;
}

/** Large numeric arrays travel as raw little-endian bytes (no typed-array extensions on the wire). */
export function f32ToBytes(values: ArrayLike<number>): Buffer {
  const arr = Float32Array.from(values as ArrayLike<number>);
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

export function bytesToF32(bytes: Uint8Array): Float32Array {
  checkWidth(bytes, 'f32');
  const copy = new Uint8Array(bytes); // aligned copy: msgpack slices may start at odd offsets
  return new Float32Array(copy.buffer, copy.byteOffset, copy.byteLength / 4);
}

export function i32ToBytes(values: ArrayLike<number>): Buffer {
  const arr = Int32Array.from(values as ArrayLike<number>);
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

export function bytesToI32(bytes: Uint8Array): Int32Array {
  checkWidth(bytes, 'i32');
  const copy = new Uint8Array(bytes);
  return new Int32Array(copy.buffer, copy.byteOffset, copy.byteLength / 4);
}

/** A length that is not a whole number of elements means the bytes are not what the caller thinks. */
function checkWidth(bytes: Uint8Array, what: 'i32' | 'f32'): void {
  if (bytes.byteLength % 4 !== 0) {
    throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: `${bytes.byteLength} bytes are not a whole number of ${what} values (4 bytes each)` });
  }
}
