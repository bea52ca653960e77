import type { ChatCompletionRequest } from './openai-schema.js';
import { perFrozen } from './tokenize/frozen.js';

/**
 * The chat-request schema (openai-schema.ts) by hand, for the requests agents actually send. Run
 * cold, between an agent's turns, zod's validation of an OpenClaw-sized request took ~0.2 ms of the
 * tokenizer worker's ~1.2 ms; this walk takes a fraction of it.
 *
 * It answers only with `parseChatRequest`'s exact result or with "ask zod": the value it returns is
 * what `ChatCompletionRequest.parse` would return, down to key order (known keys in the schema's
 * order, then the keys a loose object keeps, in the body's order), stripped keys and filled-in
 * defaults, except `tools`, which is the body's own list once valid (as `parseChatRequest` puts it
 * back). Objects already in that form are returned as they are, the rest are copied. Anything it
 * does not settle (every error, an image part, a value of an unusual type) answers `null`, and zod
 * gives the exact error or result; the tests compare the two over thousands of generated bodies.
 */
export function fastChatRequest(body: unknown): ChatCompletionRequest | null {
  const out = request(body);
  return out === NO ? null : (out as ChatCompletionRequest);
}

const NO = Symbol('ask zod');
type Out = unknown;

function request(b: unknown): Out {
  if (!isObject(b)) return NO;
  if (!optional(b.model, isString)) return NO;
  if (!Array.isArray(b.messages) || b.messages.length === 0) return NO;
  const messages = mapAll(b.messages, settledMessage);
  if (messages === NO) return NO;
  if (!nullish(b.temperature, (v) => isNumber(v) && v >= 0 && v <= 2)) return NO;
  if (!nullish(b.top_p, (v) => isNumber(v) && v > 0 && v <= 1)) return NO;
  if (!nullish(b.top_k, (v) => isInt(v) && (v === -1 || v >= 1))) return NO;
  if (!nullish(b.max_tokens, isPositiveInt) || !nullish(b.max_completion_tokens, isPositiveInt)) return NO;
  if (!nullish(b.stop, (v) => isString(v) || (Array.isArray(v) && v.length <= 4 && v.every(isString)))) return NO;
  if (!nullish(b.n, isInt) || !nullish(b.seed, isInt)) return NO;
  if (!nullish(b.stream, isBoolean)) return NO;
  const streamOptions = b.stream_options == null ? b.stream_options : isObject(b.stream_options) && optional(b.stream_options.include_usage, isBoolean) ? shape(b.stream_options, STREAM_OPTIONS_KEYS, true, null) : NO;
  if (streamOptions === NO) return NO;
  const tools = b.tools == null ? b.tools : Array.isArray(b.tools) ? mapAll(b.tools, settledTool) : NO;
  if (tools === NO) return NO;
  const toolChoice = b.tool_choice == null ? b.tool_choice : toolChoiceOf(b.tool_choice);
  if (toolChoice === NO) return NO;
  if (!optional(b.user, isString)) return NO;
  return shape(b, TOP_KEYS, true, { messages, stream_options: streamOptions, tools, tool_choice: toolChoice });
}

/** The schema's keys, in the schema's order (openai-schema.ts). */
const TOP_KEYS = ['model', 'messages', 'temperature', 'top_p', 'top_k', 'max_tokens', 'max_completion_tokens', 'stop', 'n', 'stream', 'stream_options', 'tools', 'tool_choice', 'seed', 'user'];
const STREAM_OPTIONS_KEYS = ['include_usage'];
const SYSTEM_KEYS = ['role', 'content', 'name'];
const ASSISTANT_KEYS = ['role', 'content', 'reasoning_content', 'tool_calls', 'name'];
const TOOL_MESSAGE_KEYS = ['role', 'content', 'tool_call_id', 'name'];
const TOOL_CALL_KEYS = ['id', 'type', 'function'];
const FUNCTION_CALL_KEYS = ['name', 'arguments'];
const TOOL_KEYS = ['type', 'function'];
const NAME_KEYS = ['name'];
const TEXT_PART_KEYS = ['type', 'text'];

type Obj = Record<string, unknown>;

function isObject(v: unknown): v is Obj {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
}

const isString = (v: unknown): v is string => typeof v === 'string';
const isBoolean = (v: unknown): v is boolean => typeof v === 'boolean';
const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
const isInt = (v: unknown): v is number => Number.isSafeInteger(v);
const isPositiveInt = (v: unknown): boolean => isInt(v) && v >= 1;

/** Absent (`.optional()`): JSON has no `undefined`, so a present key must hold a valid value. */
function optional(v: unknown, ok: (v: unknown) => boolean): boolean {
  return v === undefined || ok(v);
}

/** `.nullable().optional()`. */
function nullish(v: unknown, ok: (v: unknown) => boolean): boolean {
  return v === undefined || v === null || ok(v);
}

/** Each element through `f`; the same array when no element changed. */
function mapAll(xs: unknown[], f: (x: unknown) => Out): unknown[] | typeof NO {
  let out: unknown[] | null = null;
  for (let i = 0; i < xs.length; i++) {
    const y = f(xs[i]);
    if (y === NO) return NO;
    if (y !== xs[i]) (out ??= xs.slice())[i] = y;
  }
  return out ?? xs;
}

/**
 * The object a zod object schema with these `known` keys puts out: known keys present in `o` (or
 * given a value in `set`) in `known`'s order, then, when `loose`, the other keys in `o`'s order
 * (otherwise they are stripped). `o` itself when that is what it already is.
 */
function shape(o: Obj, known: readonly string[], loose: boolean, set: Obj | null): Obj {
  let k = 0;
  let same = true;
  let unknownSeen = false;
  for (const key in o) {
    const at = known.indexOf(key, k);
    if (at >= 0 && !unknownSeen) k = at + 1;
    else if (at >= 0 || known.includes(key) || !loose) same = false;
    else unknownSeen = true;
    if (!same) break;
  }
  if (set !== null) {
    for (const key in set) {
      if (set[key] !== o[key] || (set[key] !== undefined && !(key in o))) same = false;
    }
  }
  if (same) return o;
  const out: Obj = {};
  for (const key of known) {
    if (set !== null && key in set) {
      if (set[key] !== undefined || key in o) out[key] = set[key];
    } else if (key in o) out[key] = o[key];
  }
  if (loose) for (const key in o) if (!known.includes(key)) out[key] = o[key];
  return out;
}

function content(v: unknown): Out {
  if (isString(v)) return v;
  if (!Array.isArray(v)) return NO;
  return mapAll(v, (p) => (isObject(p) && p.type === 'text' && isString(p.text) ? shape(p, TEXT_PART_KEYS, true, null) : NO));
}

function toolCall(v: unknown): Out {
  if (!isObject(v) || !isString(v.id)) return NO;
  // `type` defaults to 'function'; any other value is zod's to reject.
  if (v.type !== undefined && v.type !== 'function') return NO;
  const f = v.function;
  if (!isObject(f) || !isString(f.name) || f.name.length < 1 || !isString(f.arguments)) return NO;
  return shape(v, TOOL_CALL_KEYS, true, { type: 'function', function: shape(f, FUNCTION_CALL_KEYS, false, null) });
}

function message(v: unknown): Out {
  if (!isObject(v)) return NO;
  switch (v.role) {
    case 'system':
    case 'developer':
    case 'user': {
      const c = content(v.content);
      return c !== NO && optional(v.name, isString) ? shape(v, SYSTEM_KEYS, true, { content: c }) : NO;
    }
    case 'assistant': {
      const c = v.content == null ? v.content : content(v.content);
      const calls = v.tool_calls === undefined ? undefined : Array.isArray(v.tool_calls) ? mapAll(v.tool_calls, toolCall) : NO;
      if (c === NO || calls === NO || !nullish(v.reasoning_content, isString) || !optional(v.name, isString)) return NO;
      return shape(v, ASSISTANT_KEYS, true, { content: c, tool_calls: calls });
    }
    case 'tool': {
      const c = content(v.content);
      return c !== NO && optional(v.tool_call_id, isString) && optional(v.name, isString) ? shape(v, TOOL_MESSAGE_KEYS, true, { content: c }) : NO;
    }
    default:
      return NO;
  }
}

/** A valid tool is answered as it is, not in zod's shape: see `parseChatRequest`. */
function tool(v: unknown): Out {
  if (!isObject(v) || v.type !== 'function') return NO;
  const f = v.function;
  if (!isObject(f) || !isString(f.name) || f.name.length < 1 || f.name.length > 64) return NO;
  if (!optional(f.description, isString) || !optional(f.parameters, isObject) || !nullish(f.strict, isBoolean)) return NO;
  return v;
}

/**
 * A session's earlier messages and its tool list are the same frozen objects every turn
 * (tokenize/body-memo.ts), so each is walked once; the answers are frozen too, so the tokenizer's
 * identity caches keep working on them (a valid tool list is answered as the same array).
 */
const settledMessage = perFrozen(message);
const settledTool = perFrozen(tool);

function toolChoiceOf(v: unknown): Out {
  if (v === 'none' || v === 'auto' || v === 'required') return v;
  if (!isObject(v) || v.type !== 'function' || !isObject(v.function) || !isString(v.function.name)) return NO;
  return shape(v, TOOL_KEYS, true, { function: shape(v.function, NAME_KEYS, false, null) });
}
