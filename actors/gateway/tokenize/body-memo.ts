/**
 * Incremental parsing of chat bodies. An agent resends its whole transcript every turn, so a turn's
 * body is usually the previous turn's with messages appended: the same bytes up to the end of the
 * last message, new messages, then the same tail (`tools`, sampling parameters). Parsing only the
 * new messages and reusing the rest of the earlier parse skips most of `JSON.parse` on an
 * OpenClaw-sized body (a 30k-character system prompt, a dozen tool schemas).
 *
 * The result is always what `JSON.parse` of the whole body gives, or nothing: `extend` answers null
 * whenever it cannot show that, and the caller parses the body itself. The argument, for a body B
 * and the remembered body P whose messages array is P[open..close]:
 * - B[0, cut) = P[0, cut) for a cut C of P's array (a comma between two elements at the array's own
 *   depth, or its closing bracket), so B up to there reads as P does, with the first count(C)
 *   elements of P's array;
 * - B ends with P[close, end), the bracket closing the array and everything after it;
 * - the bytes X between them are well-formed array elements each after a comma: that is exactly
 *   when `[null` + X + `]` parses, since nothing in X can join a token of its own to the element
 *   before it (X must start with whitespace or a comma).
 * Then B's messages are P's first count(C) followed by those of X, and every other member of B is
 * P's. The `messages` key must occur once at the top level (JSON.parse keeps the last of duplicate
 * keys) and be spelled without escapes, or the body is not remembered.
 *
 * Remembered values are frozen: requests share them, so nothing downstream may change them.
 */

import { deepFreeze } from './frozen.js';
import { utf8Text } from './utf8.js';

const TAB = 0x09;
const LF = 0x0a;
const CR = 0x0d;
const SPACE = 0x20;
const QUOTE = 0x22;
const COMMA = 0x2c;
const COLON = 0x3a;
const OPEN_BRACKET = 0x5b;
const BACKSLASH = 0x5c;
const CLOSE_BRACKET = 0x5d;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const MESSAGES = Buffer.from('messages');

/** Where the messages array of a body may be cut: at `at[i]`, `count[i]` elements lie before it. */
export interface MessageCuts {
  at: number[];
  count: number[];
  /** Offset of the array's closing bracket. */
  close: number;
}

export interface RememberedBody {
  body: Buffer;
  json: Readonly<Record<string, unknown>>;
  messages: readonly unknown[];
  cuts: MessageCuts;
}

const isWs = (c: number | undefined): boolean => c === SPACE || c === LF || c === CR || c === TAB;

function skipWs(b: Buffer, i: number): number {
  while (isWs(b[i])) i++;
  return i;
}

/** The offset of the quote closing the string that opens at `i`, or -1. */
function stringEnd(b: Buffer, i: number): number {
  let from = i + 1;
  for (;;) {
    const q = b.indexOf(QUOTE, from);
    if (q < 0) return -1;
    let k = q - 1;
    while (b[k] === BACKSLASH) k--;
    // An even run of backslashes escapes itself, not the quote.
    if ((q - 1 - k) % 2 === 0) return q;
    from = q + 1;
  }
}

/**
 * Walks a JSON value's bytes from `i` to its end (exclusive), or -1. With `cuts`, `i` is an
 * array's opening bracket and every comma at its own depth, and its closing bracket, is recorded.
 */
function skipValue(b: Buffer, i: number, cuts: MessageCuts | null = null, baseCount = 0): number {
  const first = b[i];
  if (first === QUOTE) {
    const e = stringEnd(b, i);
    return e < 0 ? -1 : e + 1;
  }
  if (first !== OPEN_BRACE && first !== OPEN_BRACKET) {
    // A number or a literal: runs to the next delimiter.
    while (i < b.length) {
      const c = b[i];
      if (c === COMMA || c === CLOSE_BRACE || c === CLOSE_BRACKET || isWs(c)) break;
      i++;
    }
    return i;
  }
  let depth = 0;
  let elements = 0;
  let sawValue = false;
  for (; i < b.length; i++) {
    const c = b[i]!;
    if (c === QUOTE) {
      const e = stringEnd(b, i);
      if (e < 0) return -1;
      i = e;
      sawValue = true;
    } else if (c === OPEN_BRACE || c === OPEN_BRACKET) {
      if (depth > 0) sawValue = true;
      depth++;
    } else if (c === CLOSE_BRACE || c === CLOSE_BRACKET) {
      depth--;
      if (depth === 0) {
        if (cuts !== null && sawValue) {
          cuts.at.push(i);
          cuts.count.push(baseCount + elements + 1);
        }
        if (cuts !== null) cuts.close = i;
        return i + 1;
      }
    } else if (c === COMMA) {
      if (depth === 1 && cuts !== null) {
        elements++;
        cuts.at.push(i);
        cuts.count.push(baseCount + elements);
      }
    } else if (!isWs(c) && depth > 0) sawValue = true;
  }
  return -1;
}

/** The cuts of the body's top-level `messages` array, or null when it cannot be remembered. */
export function messageCuts(b: Buffer): MessageCuts | null {
  let i = skipWs(b, 0);
  if (b[i] !== OPEN_BRACE) return null;
  i = skipWs(b, i + 1);
  let cuts: MessageCuts | null = null;
  if (b[i] === CLOSE_BRACE) return null;
  for (;;) {
    if (b[i] !== QUOTE) return null;
    const keyEnd = stringEnd(b, i);
    if (keyEnd < 0) return null;
    const escaped = b.indexOf(BACKSLASH, i + 1);
    const isMessages = keyEnd - i - 1 === MESSAGES.length && b.compare(MESSAGES, 0, MESSAGES.length, i + 1, keyEnd) === 0;
    // `"m\u0065ssages"` is `messages` too; such a body is simply not remembered.
    if (escaped >= 0 && escaped < keyEnd) return null;
    i = skipWs(b, keyEnd + 1);
    if (b[i] !== COLON) return null;
    i = skipWs(b, i + 1);
    if (isMessages) {
      if (cuts !== null || b[i] !== OPEN_BRACKET) return null;
      cuts = { at: [], count: [], close: -1 };
      i = skipValue(b, i, cuts);
    } else i = skipValue(b, i);
    if (i < 0) return null;
    i = skipWs(b, i);
    if (b[i] === CLOSE_BRACE) break;
    if (b[i] !== COMMA) return null;
    i = skipWs(b, i + 1);
  }
  return cuts !== null && cuts.at.length > 0 ? cuts : null;
}

/** Equal bytes at the start of both, compared natively a block at a time. */
export function commonPrefixLength(a: Buffer, b: Buffer): number {
  const n = Math.min(a.length, b.length);
  const BLOCK = 4096;
  let i = 0;
  while (i + BLOCK <= n && a.compare(b, i, i + BLOCK, i, i + BLOCK) === 0) i += BLOCK;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/**
 * Remembers a parsed body so that a later one can extend it; null when its shape does not allow
 * that. `body` must not change afterwards, and `json` is frozen (it is the caller's parse).
 */
export function rememberBody(body: Uint8Array, json: unknown): RememberedBody | null {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) return null;
  const messages = (json as Record<string, unknown>).messages;
  if (!Array.isArray(messages)) return null;
  const b = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const cuts = messageCuts(b);
  if (cuts === null || cuts.count[cuts.count.length - 1] !== messages.length) return null;
  deepFreeze(json);
  return { body: b, json: json as Record<string, unknown>, messages, cuts };
}

export interface ExtendedBody {
  /** What `JSON.parse` of the body gives, sharing the remembered parts. */
  json: Record<string, unknown>;
  /** The messages parsed now (the rest were checked with the remembered body). */
  added: unknown[];
  /**
   * The body remembered for the next one (`rememberBody` of it, without a scan of all of it), or
   * null. Nothing the request needs: the gateway's workers call it after they have answered.
   */
  remember(): RememberedBody | null;
}

/** `body` parsed as an extension of `prev`, or null (then parse it whole). */
export function extendBody(prev: RememberedBody, body: Uint8Array): ExtendedBody | null {
  const P = prev.body;
  const B = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const same = commonPrefixLength(P, B);
  const { at, count, close } = prev.cuts;
  let j = at.length - 1;
  while (j >= 0 && at[j]! > same) j--;
  if (j < 0) return null;
  const cut = at[j]!;
  const tail = P.length - close;
  const end = B.length - tail;
  if (end < cut || B.compare(P, close, P.length, end, B.length) !== 0) return null;
  // X must begin with whitespace or a comma; a non-ASCII first byte (a byte-order mark, say) would
  // also decode differently on its own.
  if (end > cut && B[cut] !== COMMA && !isWs(B[cut])) return null;
  let more: unknown[];
  try {
    more = JSON.parse(`[null${utf8Text(B.subarray(cut, end))}]`) as unknown[];
  } catch {
    return null;
  }
  const added = more.slice(1);
  const messages = prev.messages.slice(0, count[j]).concat(added);
  const json = { ...prev.json, messages };
  const remember = (): RememberedBody | null => {
    const cuts: MessageCuts = { at: at.slice(0, j + 1), count: count.slice(0, j + 1), close: end };
    if (appendCuts(B, cut, end, count[j]!, cuts) !== messages.length) return null;
    // Only the new parts are unfrozen; the walk stops at the remembered ones.
    deepFreeze(json);
    return { body: B, json, messages, cuts };
  };
  return { json, added, remember };
}

/**
 * Records the cuts of the elements appended in B[from, to) after the `count` elements before the
 * cut at `from`, and the closing bracket at `to`; returns the element count there. The bytes are
 * walked as the array `[0` + B[from, to) + `]`, whose `0` stands for the elements before the cut,
 * so that one walker (`skipValue`) reads every array.
 */
function appendCuts(B: Buffer, from: number, to: number, count: number, cuts: MessageCuts): number {
  const lead = Buffer.from('[0');
  const probe = Buffer.concat([lead, B.subarray(from, to), Buffer.from(']')]);
  const seen: MessageCuts = { at: [], count: [], close: -1 };
  skipValue(probe, 0, seen, count - 1);
  const lastCount = cuts.count.length > 0 ? cuts.count[cuts.count.length - 1]! : 0;
  for (let k = 0; k < seen.count.length; k++) {
    // The walk reports the cut at `from` again (the comma or bracket after the `0`), or a comma
    // after whitespace there, with the same count. Kept, it would be copied into the next memo,
    // which extends this one, and into every memo after that: the cut lists of a gateway's
    // bodies grew by a few entries per session, without end. One cut per element is enough.
    if (seen.count[k]! <= lastCount) continue;
    cuts.at.push(from + seen.at[k]! - lead.length);
    cuts.count.push(seen.count[k]!);
  }
  return seen.count[seen.count.length - 1]!;
}
