import { hash as nativeHash } from 'node:crypto';

/**
 * Message hashing for correlation. A message hash is a 53-bit integer (JSON-safe, a fast Map key)
 * over the parts of a message that a client resends unchanged. What is compared, and why:
 *
 * - `role`, `name`, `tool_call_id` as they are.
 * - `content`: a string as is; an array of only text parts is read as the concatenation of their
 *   texts (clients resend our string reply as parts and back); other parts by canonical JSON.
 *   `null`, absent and `''` are the same (clients differ on an empty tool-call reply).
 * - assistant messages only: a leading `<think>…</think>` block and surrounding whitespace are
 *   dropped, and `reasoning_content` / `reasoning` are ignored: clients resend the reply without its
 *   reasoning, or with it folded back into the content, and the gateway recorded it apart.
 * - `tool_calls`: id, function name and arguments; arguments that parse as JSON compare by
 *   canonical JSON (sorted keys, no spaces), since some clients re-serialise them.
 * - anything else (`refusal`, `audio`, cache-control hints) is ignored.
 *
 * Strings of 48 characters and more are memoised by value (a bounded cache), so that the history a
 * client resends on every request is hashed once: the 30k-character system prompt costs a Map
 * lookup (a length check and a memcmp) instead of ~20 µs of sha1, and an old message a V8 string
 * hash instead of a JavaScript loop. This is what keeps fallback matching near O(new messages).
 */

/** Strings of this length and more are memoised: a lookup beats rehashing them. */
const MEMO = 48;
/** Strings of this length and more are hashed natively (sha1), not in JavaScript. */
const LONG = 1024;

/** 53-bit string hash (cyrb53 shape) for short strings. */
function jsHash(s: string, seed: number): number {
  let h1 = 0xdeadbeef ^ seed;
  let h2 = 0x41c6ce57 ^ seed;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 2654435761);
    h2 = Math.imul(h2 ^ c, 1597334677);
  }
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 4294967296 * (2097151 & h2) + (h1 >>> 0);
}

function rawStringHash(s: string): number {
  if (s.length < LONG) return jsHash(s, 0);
  // 13 hex digits = 52 bits of the digest.
  return Number.parseInt(nativeHash('sha1', s, 'hex').slice(0, 13), 16);
}

/**
 * Memo of long strings → hash, bounded by the characters it holds (cleared whole when full: the
 * strings worth keeping, like a system prompt, come straight back).
 */
export class HashMemo {
  private readonly strings = new Map<string, number>();
  private readonly args = new Map<string, number>();
  private chars = 0;

  /** @param maxChars @default 16_000_000 */
  constructor(private readonly maxChars = 16_000_000) {}

  string(s: string): number {
    if (s.length < MEMO) return jsHash(s, 0);
    const hit = this.strings.get(s);
    if (hit !== undefined) return hit;
    const h = rawStringHash(s);
    this.remember(this.strings, s, h);
    return h;
  }

  /** Tool-call arguments: canonical JSON when they parse, else the raw text. */
  toolArguments(s: string): number {
    // rawStringHash picks its function by the canonical text's length, not the raw one's: the two
    // fall on either side of LONG when a client re-serialises (1e21 → 1e+21, spaces dropped).
    if (s.length < LONG) return mix(rawStringHash(canonicalArgs(s)), 0x61726773);
    const hit = this.args.get(s);
    if (hit !== undefined) return hit;
    const h = mix(rawStringHash(canonicalArgs(s)), 0x61726773);
    this.remember(this.args, s, h);
    return h;
  }

  /** Forget every memoised string (they are hashed again on sight). */
  clear(): void {
    this.strings.clear();
    this.args.clear();
    this.chars = 0;
  }

  private remember(map: Map<string, number>, s: string, h: number): void {
    if (this.chars + s.length > this.maxChars) this.clear();
    if (s.length <= this.maxChars) {
      map.set(s, h);
      this.chars += s.length;
    }
  }
}

function canonicalArgs(s: string): string {
  try {
    return canonicalJson(JSON.parse(s));
  } catch {
    // Not JSON (a truncated call): compare the text itself.
    return s;
  }
}

/** Order-sensitive combination of two 53-bit hashes into one. */
export function mix(a: number, b: number): number {
  let h1 = (a >>> 0) ^ 0x9e3779b9;
  let h2 = Math.floor(a / 4294967296) ^ 0x85ebca6b;
  const b1 = b >>> 0;
  const b2 = Math.floor(b / 4294967296);
  h1 = Math.imul(h1 ^ b1, 2654435761);
  h2 = Math.imul(h2 ^ b2, 1597334677);
  h1 = Math.imul(h1 ^ b2, 2246822507);
  h2 = Math.imul(h2 ^ b1, 3266489909);
  h1 = Math.imul(h1 ^ (h1 >>> 16), 2246822507) ^ Math.imul(h2 ^ (h2 >>> 13), 3266489909);
  h2 = Math.imul(h2 ^ (h2 >>> 16), 2246822507) ^ Math.imul(h1 ^ (h1 >>> 13), 3266489909);
  return 4294967296 * (2097151 & h2) + (h1 >>> 0);
}

/** JSON with object keys sorted, so equal values give equal text whatever their key order. */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v !== 'object') return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  const obj = v as Record<string, unknown>;
  const keys = Object.keys(obj).filter((k) => obj[k] !== undefined).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(obj[k])}`).join(',')}}`;
}

/** The text of a message's content: a string, or the joined text of text-only parts, else null. */
export function contentText(content: unknown): string | null {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return null;
  let out = '';
  for (const part of content) {
    if (part === null || typeof part !== 'object' || (part as { type?: unknown }).type !== 'text') return null;
    const text = (part as { text?: unknown }).text;
    if (typeof text !== 'string') return null;
    out += text;
  }
  return out;
}

function assistantText(text: string): string {
  let t = text;
  if (t.startsWith('<think>')) {
    const end = t.indexOf('</think>');
    if (end >= 0) t = t.slice(end + '</think>'.length);
  }
  return t.trim();
}

const ROLE_HASH = new Map<string, number>();
function small(s: string): number {
  let h = ROLE_HASH.get(s);
  if (h === undefined) {
    h = jsHash(s, 7);
    if (ROLE_HASH.size < 64) ROLE_HASH.set(s, h);
  }
  return h;
}

const NONE = 0x1f2e3d4c;

/** The hash of one chat message under the comparison rules above. */
export function messageHash(message: unknown, memo: HashMemo): number {
  if (message === null || typeof message !== 'object') return mix(NONE, memo.string(canonicalJson(message)));
  const m = message as Record<string, unknown>;
  const role = typeof m.role === 'string' ? m.role : '';
  let h = small(role);
  const text = contentText(m.content);
  if (text === null) h = mix(h, memo.string(canonicalJson(m.content)));
  else h = mix(h, memo.string(role === 'assistant' ? assistantText(text) : text));
  if (typeof m.name === 'string') h = mix(h, small(`name:${m.name}`));
  if (typeof m.tool_call_id === 'string') h = mix(h, memo.string(`id:${m.tool_call_id}`));
  const calls = m.tool_calls;
  if (Array.isArray(calls) && calls.length > 0) {
    for (const call of calls) {
      const c = (call ?? {}) as { id?: unknown; function?: { name?: unknown; arguments?: unknown } };
      h = mix(h, memo.string(`call:${typeof c.id === 'string' ? c.id : ''}:${typeof c.function?.name === 'string' ? c.function.name : ''}`));
      const args = c.function?.arguments;
      h = mix(h, typeof args === 'string' ? memo.toolArguments(args) : memo.string(canonicalJson(args ?? null)));
    }
  }
  return h;
}

/** The role of a message, or '' when it has none. */
export function roleOf(message: unknown): string {
  const role = (message as { role?: unknown } | null)?.role;
  return typeof role === 'string' ? role : '';
}

/** Seed of every prefix hash of `scenario`, so that keys never match across scenarios. */
export function scenarioSeed(scenario: string): number {
  return jsHash(scenario, 0x5ce);
}

/**
 * Seed of the prefix hashes of one API key's records in `scenario`: another key's transcripts
 * never match its sessions. Records before key ids (null) keep the scenario's seed, so sessions
 * saved from them still match.
 */
export function sessionSeed(scenario: string, keyId: string | null): number {
  return keyId === null ? scenarioSeed(scenario) : mix(scenarioSeed(scenario), jsHash(keyId, 0x6b1d));
}
