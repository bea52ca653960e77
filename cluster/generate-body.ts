import { ReefError } from '../actors/runtime/errors.js';
import type { GenerateRequest } from './engine-client.js';

const COMMA = 0x2c;
const ZERO = 0x30;
const encoder = new TextEncoder();
const LARGEST_ID = 0x7fffffff;
/** The byte offset of every MARK_EVERY-th id is kept, where a later body may resume copying. */
const MARK_EVERY = 256;

/**
 * The id list of an earlier body (`generateBody(…, { keep: true })`): a later prompt that begins
 * with the same ids copies their text instead of formatting it again. A session's next turn
 * resends its transcript, so on an OpenClaw-sized prompt nearly all 20k+ ids are such a prefix.
 */
export interface IdText {
  ids: Int32Array;
  /** `ids` as JSON numbers joined by commas, no brackets. */
  text: Uint8Array;
  /** marks[j] is where id j·MARK_EVERY starts in `text`. */
  marks: Int32Array;
  /** The shared buffer the body was written in, with room to spare. */
  arena: BodyArena;
}

/**
 * Shared memory a kept body was written in, sized with room to grow. The next body built from its
 * id text (`inPlace`) writes only what differs, after the shared prefix, instead of copying 100+ KB
 * into new memory, provided nobody may still be reading the last body: `lease` is 1 from the
 * moment a body is handed out until its user calls `releaseBody` (after the engine request ended).
 * A lease never released only costs a fresh arena next time.
 */
export interface BodyArena {
  bytes: Uint8Array;
  lease: Int32Array;
}

/** Ends the lease of a body from an arena (see `BodyArena`); a no-op for other bodies. */
export function releaseBody(lease: Int32Array | null | undefined): void {
  if (lease) Atomics.store(lease, 0, 0);
}

/** Ids compared per native call: a shared 20k-id prefix compared id by id took ~25 µs. */
const COMPARE_BLOCK = 2048;

function commonPrefix(a: Int32Array, b: ArrayLike<number>): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  if (b instanceof Int32Array) {
    const ab = Buffer.from(a.buffer, a.byteOffset, a.byteLength);
    const bb = Buffer.from(b.buffer, b.byteOffset, b.byteLength);
    while (i + COMPARE_BLOCK <= n && bb.compare(ab, i * 4, (i + COMPARE_BLOCK) * 4, i * 4, (i + COMPARE_BLOCK) * 4) === 0) i += COMPARE_BLOCK;
  }
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Decimal digits of a token id (ids are below 2^31, so at most 10). */
function digitsOf(v: number): number {
  return v < 10 ? 1 : v < 100 ? 2 : v < 1000 ? 3 : v < 10_000 ? 4 : v < 100_000 ? 5 : v < 1_000_000 ? 6 : v < 10_000_000 ? 7 : v < 100_000_000 ? 8 : v < 1_000_000_000 ? 9 : 10;
}

/**
 * The bytes of `ids[from…]` as written by `writeIds`, each id checked before a byte is written
 * (the ids before `from` equal ones written before).
 *
 * This loop and `writeIds` are functions of their own so that V8 optimizes them as functions:
 * inside `generateBody` they were entered through on-stack replacement, and that code, compiled
 * before the rest of the function had run, was entered and thrown away again on every call.
 */
function idTextSize(ids: ArrayLike<number>, from: number): number {
  let size = 0;
  for (let i = from; i < ids.length; i++) {
    const v = ids[i]!;
    if (!Number.isInteger(v)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `input_ids[${i}] is not an integer: ${v}` });
    if (v < 0 || v > LARGEST_ID) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `input_ids[${i}] is not a token id: ${v}` });
    size += digitsOf(v) + (i > 0 && i !== from ? 1 : 0);
  }
  return size;
}

/**
 * Writes `ids[from…]` at `out[o]` as decimal numbers joined by commas (none before the first: text
 * copied up to `from` ends with its comma), marks where every MARK_EVERY-th id starts (relative to
 * `base`), and returns the end.
 */
function writeIds(ids: ArrayLike<number>, from: number, out: Uint8Array, o: number, base: number, marks: Int32Array): number {
  for (let i = from; i < ids.length; i++) {
    let v = ids[i]!;
    if (i > 0 && i !== from) out[o++] = COMMA;
    if (i % MARK_EVERY === 0) marks[i / MARK_EVERY] = o - base;
    const digits = digitsOf(v);
    let e = o + digits;
    while (v >= 10) {
      // v < 2^31, so `| 0` truncates exactly.
      const q = (v / 10) | 0;
      out[--e] = ZERO + v - q * 10;
      v = q;
    }
    out[--e] = ZERO + v;
    o += digits;
  }
  return o;
}

export interface GenerateBodyOptions {
  /** An earlier body's id text: the ids this prompt shares with it are copied as text. */
  reuse?: IdText | null;
  /**
   * Allocate the body in a SharedArrayBuffer: it then crosses to another thread without a copy
   * (and without being moved away from this one).
   */
  shared?: boolean;
  /**
   * `reuse` belongs to the caller alone (its own last body, not another's): when its arena is free
   * and large enough, this body is written into it over the last one (see `BodyArena`).
   */
  inPlace?: boolean;
}

const OPEN = encoder.encode('{"input_ids":[');

/** Arena room for a body of `size` bytes: a session's next turns grow it by a few KB each. */
const arenaSize = (size: number) => size + (size >> 2) + 4096;

/**
 * The `/generate` body as UTF-8 JSON bytes, ready for the socket: `{"input_ids":[…],` and the other
 * fields (the engine reads JSON, so the order of keys is free; ids first let a later body keep
 * the same bytes in place).
 *
 * `input_ids` is written digit by digit into one buffer: an OpenClaw-sized prompt is 20k+ ids, and
 * building it as a string cost ~0.45 ms (`JSON.stringify(Array.from(ids))` ~1 ms), plus the
 * string's UTF-8 encoding when the socket wrote it. The buffer has its own memory, so it can go to
 * another thread (the tokenizer workers build bodies this way). With `reuse`, the ids this prompt
 * shares with that earlier one are copied as text, or with `inPlace` left where they are.
 *
 * With `keep`, the answer also carries this body's `IdText` for the next one, and the lease the
 * body's user must end (`releaseBody`). It refers to `ids` and to the body's own bytes rather than
 * copying them, so the body is shared (a moved buffer would take the kept text with it), and
 * `ids` must not change afterwards.
 */
export function generateBody(req: GenerateRequest, stream: boolean, opts?: GenerateBodyOptions & { keep?: false }): Uint8Array;
export function generateBody(req: GenerateRequest, stream: boolean, opts: GenerateBodyOptions & { keep: true }): { body: Uint8Array; idText: IdText | null; lease: Int32Array | null };
export function generateBody(req: GenerateRequest, stream: boolean, opts?: GenerateBodyOptions & { keep?: boolean }): Uint8Array | { body: Uint8Array; idText: IdText | null; lease: Int32Array | null } {
  const { input_ids: ids, ...rest } = req;
  const head = JSON.stringify({ ...rest, stream });
  if (ids == null) {
    const body = encoder.encode(head);
    return opts?.keep ? { body, idText: null, lease: null } : body;
  }
  // `head` is an object: its members follow the ids (`],` + head without its `{`), or none do.
  const tail = encoder.encode(head === '{}' ? ']}' : `],${head.slice(1)}`);
  const marks = new Int32Array(Math.ceil(ids.length / MARK_EVERY));
  // Resume at the last mark inside the shared prefix; the copied text ends with its comma.
  const reuse = opts?.reuse;
  const m = reuse ? Math.min(Math.floor(commonPrefix(reuse.ids, ids) / MARK_EVERY), marks.length - 1, reuse.marks.length - 1) : 0;
  const from = m > 0 ? m * MARK_EVERY : 0;
  const copied = m > 0 ? reuse!.marks[m]! : 0;
  const size = OPEN.length + copied + idTextSize(ids, from) + tail.length;
  const keep = opts?.keep === true;
  const arena = reuse?.arena;
  // In place: the bytes up to the resume point are this body's already.
  const inPlace = keep && opts?.inPlace === true && m > 0 && arena !== undefined && size <= arena.bytes.length && Atomics.compareExchange(arena.lease, 0, 0, 1) === 0;
  let out: Uint8Array;
  let lease: Int32Array | null = null;
  if (inPlace) {
    out = arena!.bytes;
    lease = arena!.lease;
  } else if (keep) {
    out = new Uint8Array(new SharedArrayBuffer(arenaSize(size)));
    lease = new Int32Array(new SharedArrayBuffer(4));
    Atomics.store(lease, 0, 1);
  } else {
    // A plain Uint8Array: element stores into a Buffer, a subclass, ran at half the speed.
    out = new Uint8Array(opts?.shared ? new SharedArrayBuffer(size) : Buffer.allocUnsafeSlow(size).buffer, 0, size);
  }
  const base = OPEN.length;
  let o = base;
  if (!inPlace) out.set(OPEN);
  if (m > 0) {
    if (!inPlace) out.set(reuse!.text.subarray(0, copied), base);
    marks.set(reuse!.marks.subarray(0, m + 1));
    o = base + copied;
  }
  o = writeIds(ids, from, out, o, base, marks);
  const textEnd = o;
  out.set(tail, o);
  o += tail.length;
  const body = o === out.length ? out : out.subarray(0, o);
  if (!keep) return body;
  const kept: IdText = { ids: ids instanceof Int32Array ? ids : Int32Array.from(ids), text: out.subarray(base, textEnd), marks, arena: { bytes: out, lease: lease! } };
  return { body, idText: kept, lease };
}
