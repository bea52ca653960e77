import { ReefError } from '../actors/runtime/errors.js';
import type { GenerateRequest } from './engine-client.js';

const COMMA = 0x2c;
const ZERO = 0x30;
const CLOSE_BRACKET = 0x5d;
const CLOSE_BRACE = 0x7d;
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

export interface GenerateBodyOptions {
  /** An earlier body's id text: the ids this prompt shares with it are copied as text. */
  reuse?: IdText | null;
  /**
   * Allocate the body in a SharedArrayBuffer: it then crosses to another thread without a copy
   * (and without being moved away from this one).
   */
  shared?: boolean;
}

/**
 * The `/generate` body as UTF-8 JSON bytes, ready for the socket.
 *
 * `input_ids` is written digit by digit into one buffer: an OpenClaw-sized prompt is 20k+ ids, and
 * building it as a string cost ~0.45 ms (`JSON.stringify(Array.from(ids))` ~1 ms), plus the
 * string's UTF-8 encoding when the socket wrote it. The buffer is sized exactly and has its own
 * memory, so it can go to another thread (the tokenizer workers build bodies this way). With
 * `reuse`, the ids this prompt shares with that earlier one are copied as text.
 *
 * With `keep`, the answer also carries this body's `IdText` for the next one. It refers to `ids`
 * and to the body's own bytes rather than copying them, so the body is shared (a moved buffer
 * would take the kept text with it), and neither may change afterwards.
 */
export function generateBody(req: GenerateRequest, stream: boolean, opts?: GenerateBodyOptions & { keep?: false }): Uint8Array;
export function generateBody(req: GenerateRequest, stream: boolean, opts: GenerateBodyOptions & { keep: true }): { body: Uint8Array; idText: IdText | null };
export function generateBody(req: GenerateRequest, stream: boolean, opts?: GenerateBodyOptions & { keep?: boolean }): Uint8Array | { body: Uint8Array; idText: IdText | null } {
  const { input_ids: ids, ...rest } = req;
  const head = JSON.stringify({ ...rest, stream });
  if (ids == null) {
    const body = encoder.encode(head);
    return opts?.keep ? { body, idText: null } : body;
  }
  // `head` is a non-empty object: it ends with `}` and has at least one key before it.
  const open = encoder.encode(`${head.slice(0, -1)},"input_ids":[`);
  const marks = new Int32Array(Math.ceil(ids.length / MARK_EVERY));
  // Resume at the last mark inside the shared prefix; the copied text ends with its comma.
  const reuse = opts?.reuse;
  const m = reuse ? Math.min(Math.floor(commonPrefix(reuse.ids, ids) / MARK_EVERY), marks.length - 1, reuse.marks.length - 1) : 0;
  const from = m > 0 ? m * MARK_EVERY : 0;
  const copied = m > 0 ? reuse!.marks[m]! : 0;
  // The exact size: what is copied, then each further id and its comma (a value that is not a
  // token id counts as 10 digits here and is refused below).
  let size = open.length + copied + 2;
  for (let i = from; i < ids.length; i++) {
    const v = ids[i]!;
    size += (v >= 0 && v <= LARGEST_ID ? digitsOf(v) : 10) + (i > 0 && i !== from ? 1 : 0);
  }
  const shared = opts?.shared === true || opts?.keep === true;
  // A plain Uint8Array: element stores into a Buffer, a subclass, ran at half the speed.
  const out = new Uint8Array(shared ? new SharedArrayBuffer(size) : Buffer.allocUnsafeSlow(size).buffer, 0, size);
  out.set(open);
  const base = open.length;
  let o = base;
  if (m > 0) {
    out.set(reuse!.text.subarray(0, copied), base);
    marks.set(reuse!.marks.subarray(0, m + 1));
    o = base + copied;
  }
  for (let i = from; i < ids.length; i++) {
    let v = ids[i]!;
    if (!Number.isInteger(v)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `input_ids[${i}] is not an integer: ${v}` });
    if (v < 0 || v > LARGEST_ID) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `input_ids[${i}] is not a token id: ${v}` });
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
  const textEnd = o;
  out[o++] = CLOSE_BRACKET;
  out[o++] = CLOSE_BRACE;
  if (!opts?.keep) return o === size ? out : out.subarray(0, o);
  return { body: out, idText: { ids: ids instanceof Int32Array ? ids : Int32Array.from(ids), text: out.subarray(base, textEnd), marks } };
}
