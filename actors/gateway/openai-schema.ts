import { z } from 'zod';
import { fastChatRequest } from './chat-request-fast.js';

/**
 * The OpenAI chat-completions request as Reef accepts it. Known fields are checked strictly;
 * unknown top-level fields are accepted and ignored, because real clients (OpenClaw, Hermes, the
 * SDKs) send many optional knobs this engine does not implement.
 */

const TextPart = z.object({ type: z.literal('text'), text: z.string() }).loose();
const ContentPart = z.discriminatedUnion('type', [
  TextPart,
  z.object({ type: z.literal('image_url') }).loose(),
  z.object({ type: z.literal('input_audio') }).loose(),
  z.object({ type: z.literal('file') }).loose(),
]);
const Content = z.union([z.string(), z.array(ContentPart)]);

const ToolCall = z.object({
  id: z.string(),
  type: z.literal('function').default('function'),
  function: z.object({ name: z.string().min(1), arguments: z.string() }),
}).loose();

const SystemMessage = z.object({ role: z.enum(['system', 'developer']), content: Content, name: z.string().optional() }).loose();
const UserMessage = z.object({ role: z.literal('user'), content: Content, name: z.string().optional() }).loose();
const AssistantMessage = z.object({
  role: z.literal('assistant'),
  content: Content.nullable().optional(),
  reasoning_content: z.string().nullable().optional(),
  tool_calls: z.array(ToolCall).optional(),
  name: z.string().optional(),
}).loose();
const ToolMessage = z.object({ role: z.literal('tool'), content: Content, tool_call_id: z.string().optional(), name: z.string().optional() }).loose();

export const ChatMessage = z.discriminatedUnion('role', [SystemMessage, UserMessage, AssistantMessage, ToolMessage]);
export type ChatMessage = z.infer<typeof ChatMessage>;

const Tool = z.object({
  type: z.literal('function'),
  function: z.object({
    name: z.string().min(1).max(64),
    description: z.string().optional(),
    parameters: z.record(z.string(), z.unknown()).optional(),
    strict: z.boolean().nullable().optional(),
  }).loose(),
}).loose();
export type Tool = z.infer<typeof Tool>;

const ToolChoice = z.union([
  z.enum(['none', 'auto', 'required']),
  z.object({ type: z.literal('function'), function: z.object({ name: z.string() }) }).loose(),
]);

/** -1 turns top-k off, as in SGLang and the hf engine; they refuse 0 and other negatives. */
export const isTopK = (k: number): boolean => k === -1 || k >= 1;
const TOP_K_RULE = 'expected -1 (off) or an integer >= 1';

export const ChatCompletionRequest = z.object({
  model: z.string().optional(),
  messages: z.array(ChatMessage).min(1, { message: 'messages must contain at least one message' }),
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().gt(0).max(1).nullable().optional(),
  // Not OpenAI's, but SGLang's and vLLM's clients send it; it reaches the engine (tokenize/prepare.ts).
  top_k: z.int({ error: TOP_K_RULE }).refine(isTopK, { error: TOP_K_RULE }).nullable().optional(),
  max_tokens: z.number().int().min(1).nullable().optional(),
  max_completion_tokens: z.number().int().min(1).nullable().optional(),
  stop: z.union([z.string(), z.array(z.string()).max(4)]).nullable().optional(),
  n: z.number().int().nullable().optional(),
  stream: z.boolean().nullable().optional(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).loose().nullable().optional(),
  tools: z.array(Tool).nullable().optional(),
  tool_choice: ToolChoice.nullable().optional(),
  seed: z.number().int().nullable().optional(),
  user: z.string().optional(),
}).loose();
export type ChatCompletionRequest = z.infer<typeof ChatCompletionRequest>;

/** The longest stop string a request may give, in UTF-16 code units (JavaScript string length). */
export const MAX_STOP_LENGTH = 256;

/** A request's `stop` as a list (a single string is one stop string), or null when it has none. */
export function stopStrings(stop: string | string[] | null | undefined): string[] | null {
  return stop == null ? null : typeof stop === 'string' ? [stop] : stop;
}

const LOGPROBS_REFUSED = 'logprobs are not returned in the reply; the record of the turn holds each token\'s logprob and top-K (GET /reef/scenarios/{scenario}/records/{id})';

/**
 * What `chat_template_kwargs` may not set: the variables the gateway gives the template from the
 * request itself, and apply_chat_template's own arguments, which transformers (and so a server in
 * Python) would take as arguments, not as template variables.
 */
const TEMPLATE_OWN = new Map<string, string>([
  ...['messages', 'tools', 'documents', 'add_generation_prompt'].map((k): [string, string] => [k, 'set from the request, not by chat_template_kwargs']),
  ...['continue_final_message', 'tokenize', 'return_dict', 'chat_template', 'tokenizer_kwargs', 'return_assistant_tokens_mask'].map((k): [string, string] => [k, 'an argument of apply_chat_template, not a template variable; the gateway does not take it']),
]);

export interface RequestIssue {
  /** The OpenAI `param` of the error: a dotted path such as `messages[2].role`. */
  param: string | null;
  message: string;
}

function paramOf(path: readonly PropertyKey[]): string | null {
  if (path.length === 0) return null;
  let out = '';
  for (const seg of path) out += typeof seg === 'number' ? `[${seg}]` : out ? `.${String(seg)}` : String(seg);
  return out;
}

/**
 * Validates a parsed body; returns the typed request or the first issue in OpenAI terms. The request
 * is zod's result but for `tools`, which is the body's own list: what the template renders (and the
 * record's teacher prompts are rendered from) is what the client sent.
 */
export function parseChatRequest(body: unknown): { ok: true; value: ChatCompletionRequest } | { ok: false; issue: RequestIssue } {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    return { ok: false, issue: { param: null, message: 'request body must be a JSON object' } };
  }
  // What agents send is almost always plainly valid; the schema runs for everything else.
  let req = fastChatRequest(body);
  if (req === null) {
    const parsed = ChatCompletionRequest.safeParse(body);
    if (!parsed.success) {
      const first = innermost(parsed.error.issues[0]!, body);
      const param = paramOf(first.path);
      return { ok: false, issue: { param, message: `${param ?? 'body'}: ${describeIssue(first, body)}` } };
    }
    req = parsed.data;
    // Valid, the client's tools are kept as sent (fastChatRequest answers them so too): the template
    // prints them with `tojson`, and Python's apply_chat_template prints the client's dicts, key
    // order included, where zod's copy puts the schema's keys first.
    if (Array.isArray(req.tools)) req.tools = (body as { tools: Tool[] }).tools;
  }
  if (req.n != null && req.n !== 1) return { ok: false, issue: { param: 'n', message: 'n must be 1: Reef records one completion per request' } };
  // Both engines find an empty string at the start of any text: the reply would end, empty, after one token.
  if (stopStrings(req.stop)?.includes('')) return { ok: false, issue: { param: 'stop', message: 'stop: a stop string must not be empty' } };
  // Each streamed event checks whether the reply's tail could still become a stop string, work
  // quadratic in the stop string's length on the event loop (and the engine matches it at every
  // token): a body may carry megabytes, so the length is bounded far above any real stop sequence.
  const long = stopStrings(req.stop)?.find((x) => x.length > MAX_STOP_LENGTH);
  if (long !== undefined) return { ok: false, issue: { param: 'stop', message: `stop: a stop string must be at most ${MAX_STOP_LENGTH} characters, got one of ${long.length}` } };
  // Not enforced (generation is not constrained), but a call the client demands of a tool it did
  // not offer can never come back as a tool call: the markup would stay in the content.
  const offered = (req.tools ?? []).map((t) => t.function.name);
  const choice = req.tool_choice;
  const named = choice != null && typeof choice === 'object' ? choice.function.name : null;
  if ((choice === 'required' || named !== null) && offered.length === 0) {
    return { ok: false, issue: { param: 'tool_choice', message: `tool_choice ${named === null ? '"required"' : `naming ${JSON.stringify(named)}`} needs tools: the request offers none` } };
  }
  if (named !== null && !offered.includes(named)) {
    return { ok: false, issue: { param: 'tool_choice.function.name', message: `tool_choice names ${JSON.stringify(named)}, which is not among the request's tools` } };
  }
  const kwargs = (body as { chat_template_kwargs?: unknown }).chat_template_kwargs;
  if (kwargs != null) {
    if (typeof kwargs !== 'object' || Array.isArray(kwargs)) return { ok: false, issue: { param: 'chat_template_kwargs', message: 'chat_template_kwargs: expected an object of chat template variables (such as {"enable_thinking": false})' } };
    const taken = Object.keys(kwargs).find((k) => TEMPLATE_OWN.has(k));
    if (taken !== undefined) return { ok: false, issue: { param: `chat_template_kwargs.${taken}`, message: `chat_template_kwargs.${taken}: ${TEMPLATE_OWN.get(taken)}` } };
  }
  // Answered with `logprobs: null`, a client that asked for them would fail far from the cause:
  // the reply carries no per-token logprobs (the record keeps them with the top-K).
  const wants = body as { logprobs?: unknown; top_logprobs?: unknown };
  if (wants.logprobs === true) return { ok: false, issue: { param: 'logprobs', message: LOGPROBS_REFUSED } };
  if (wants.top_logprobs != null && wants.top_logprobs !== 0) return { ok: false, issue: { param: 'top_logprobs', message: LOGPROBS_REFUSED } };
  for (const [i, m] of req.messages.entries()) {
    const parts = Array.isArray(m.content) ? m.content : [];
    const bad = parts.findIndex((p) => p.type !== 'text');
    if (bad >= 0) return { ok: false, issue: { param: `messages[${i}].content[${bad}].type`, message: `content part type ${JSON.stringify(parts[bad]!.type)} is not supported: this model takes text only` } };
  }
  return { ok: true, value: req };
}

function valueAt(body: unknown, path: readonly PropertyKey[]): unknown {
  let v = body;
  for (const seg of path) v = v !== null && typeof v === 'object' ? (v as Record<PropertyKey, unknown>)[seg] : undefined;
  return v;
}

/**
 * The issue to report: for a string-or-array field (`content`, `stop`) given an array, the array
 * branch's own issue, with its full path, rather than the union's "Invalid input" at the field.
 */
function innermost(issue: z.core.$ZodIssue, body: unknown): z.core.$ZodIssue {
  if (issue.code !== 'invalid_union' || 'discriminator' in issue || !Array.isArray(valueAt(body, issue.path))) return issue;
  // The branch that took the array: the others fail on the type (or value) of the array itself.
  const branch = issue.errors.find((errs) => errs.length > 0 && !(errs[0]!.path.length === 0 && (errs[0]!.code === 'invalid_type' || errs[0]!.code === 'invalid_value')));
  if (branch === undefined) return issue;
  const sub = branch[0]!;
  return innermost({ ...sub, path: [...issue.path, ...sub.path] } as z.core.$ZodIssue, body);
}

function describeIssue(issue: z.core.$ZodIssue, body: unknown): string {
  if (issue.code === 'invalid_union' && 'discriminator' in issue && issue.discriminator === 'role') {
    const i = issue.path[1];
    const role = typeof i === 'number' ? (body as { messages: Array<{ role?: unknown }> }).messages[i]?.role : undefined;
    return role === undefined ? 'missing role' : `unknown role ${JSON.stringify(role)}; expected system, developer, user, assistant or tool`;
  }
  if (issue.code === 'invalid_union' && 'discriminator' in issue && issue.discriminator === 'type' && issue.path.at(-3) === 'content') {
    const type = valueAt(body, issue.path);
    return type === undefined ? 'a content part needs a type; expected {"type": "text", "text": ...}' : `content part type ${JSON.stringify(type)} is not supported: this model takes text only`;
  }
  if (issue.code === 'invalid_union' && issue.path.at(-1) === 'content') return 'expected a string or an array of content parts';
  if (issue.code === 'invalid_union' && issue.path.length === 1 && issue.path[0] === 'stop') return 'expected a string or an array of at most 4 strings';
  if (issue.code === 'invalid_union' && issue.path.length === 1 && issue.path[0] === 'tool_choice') {
    return 'expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}';
  }
  return issue.message.replace(/^Invalid input: /, '');
}
