/**
 * An Anthropic Messages request → the chat-completions request it is the same conversation as. The
 * gateway then serves it through the chat pipeline (prepare, generate, parse, record), so a turn
 * that came in as a Message is rendered, tokenized, recorded, judged and trained exactly as the
 * same turn sent to /v1/chat/completions would be.
 *
 * Mapping:
 * - `system` (a string or text blocks) → a leading system message; a `system` message in
 *   `messages` stays one where it stands.
 * - user text blocks → a user message; each `tool_result` block → a `tool` message (its
 *   `tool_use_id` as the `tool_call_id`, `is_error: true` kept on the message, which the chat
 *   template does not show the model: the model sees the result's text only).
 * - assistant `text` → content, `thinking` → `reasoning_content` (the model's own `<think>`
 *   block), `tool_use` → `tool_calls` with the input as its JSON text.
 * - `tools` → functions with `input_schema` as `parameters`; `tool_choice` auto / any / tool /
 *   none → "auto" / "required" / the function / "none" (as on the chat path, not enforced on the
 *   generation); `stop_sequences` → `stop`; `thinking` → `chat_template_kwargs.enable_thinking`.
 * Ignored as harmless: `cache_control` (anywhere), `metadata`, `service_tier`, a tool's
 * `eager_input_streaming` (tool input is streamed as the parser reads it either way),
 * `output_config.effort`, `thinking.budget_tokens`, a thinking block's `signature`. Anything
 * else Reef cannot honour is refused, naming the field, rather than dropped.
 */

/** A request refused before it reaches the pipeline; `param` is the Messages field at fault. */
export class MessagesRequestError extends Error {
  constructor(
    readonly param: string | null,
    message: string,
  ) {
    super(message);
    this.name = 'MessagesRequestError';
  }
}

export interface TranslatedRequest {
  /** The chat-completions request body. */
  chat: Record<string, unknown>;
  /** For each message of `chat`, the Messages field it came from (`system`, `messages[2]`, `messages[3].content[1]`). */
  origins: string[];
}

type Json = Record<string, unknown>;

const IGNORED = new Set(['metadata', 'cache_control', 'service_tier']);
const HANDLED = new Set(['model', 'messages', 'system', 'max_tokens', 'stop_sequences', 'stream', 'temperature', 'top_p', 'top_k', 'tools', 'tool_choice', 'thinking', 'output_config']);
/** The longest stop list the chat path takes (OpenAI's limit). */
const MAX_STOPS = 4;
const TEXT_ONLY = 'this model takes text only';
// `eager_input_streaming` asks for a tool's input to stream before it is whole JSON: it changes
// delivery only, never what is generated, and OpenClaw sets it on every tool it declares.
const TOOL_KEYS = new Set(['type', 'name', 'description', 'input_schema', 'cache_control', 'strict', 'eager_input_streaming']);

function fail(param: string | null, message: string): never {
  throw new MessagesRequestError(param, param === null ? message : `${param}: ${message}`);
}

function isObject(v: unknown): v is Json {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/**
 * Translates a parsed Messages (or count_tokens) body. `generate` false: the body is counted, not
 * answered, so `max_tokens` is not required and `stream` not read.
 */
export function toChatRequest(body: unknown, generate: boolean): TranslatedRequest {
  if (!isObject(body)) fail(null, 'request body must be a JSON object');
  for (const key of Object.keys(body)) {
    if (!HANDLED.has(key) && !IGNORED.has(key)) fail(key, 'this field is not supported by this gateway');
  }
  const chat: Json = {};
  if (body.model !== undefined) {
    if (typeof body.model !== 'string') fail('model', 'expected a string');
    chat.model = body.model;
  }
  const messages: Json[] = [];
  const origins: string[] = [];
  const system = systemContent(body.system);
  if (system !== null) {
    messages.push({ role: 'system', content: system });
    origins.push('system');
  }
  if (!Array.isArray(body.messages)) fail('messages', body.messages === undefined ? 'field required' : 'expected an array of messages');
  if (body.messages.length === 0) fail('messages', 'at least one message is required');
  body.messages.forEach((m, i) => translateMessage(m, `messages[${i}]`, messages, origins));
  const last = body.messages.at(-1) as Json;
  // The chat path renders a final assistant message as a finished turn and opens a new one: it
  // would answer a prefill as a fresh reply, not continue it.
  if (generate && last.role === 'assistant') fail(`messages[${body.messages.length - 1}].role`, 'the last message must be a user message: continuing a prefilled assistant message is not supported');
  chat.messages = messages;

  if (generate) {
    if (body.max_tokens === undefined) fail('max_tokens', 'field required');
    chat.max_tokens = body.max_tokens;
    if (body.stream !== undefined) chat.stream = body.stream;
  }
  for (const k of ['temperature', 'top_p', 'top_k'] as const) if (body[k] !== undefined) chat[k] = body[k];
  if (body.stop_sequences !== undefined) {
    const stops = body.stop_sequences;
    if (!Array.isArray(stops) || !stops.every((s) => typeof s === 'string')) fail('stop_sequences', 'expected an array of strings');
    if (stops.length > MAX_STOPS) fail('stop_sequences', `at most ${MAX_STOPS} stop sequences are supported, got ${stops.length}`);
    if (stops.length > 0) chat.stop = stops;
  }
  const tools = translateTools(body.tools);
  if (tools !== null) chat.tools = tools;
  const choice = translateToolChoice(body.tool_choice, tools);
  if (choice !== null) chat.tool_choice = choice;
  const thinking = thinkingSwitch(body.thinking);
  if (thinking !== null) chat.chat_template_kwargs = { enable_thinking: thinking };
  if (body.output_config !== undefined) {
    const oc = body.output_config;
    if (!isObject(oc)) fail('output_config', 'expected an object');
    for (const key of Object.keys(oc)) {
      if (key === 'effort') continue;
      fail(`output_config.${key}`, key === 'format' ? 'structured outputs are not supported: generation is not constrained' : 'this field is not supported by this gateway');
    }
  }
  return { chat, origins };
}

function systemContent(system: unknown): string | Json[] | null {
  if (system === undefined || system === null) return null;
  if (typeof system === 'string') return system === '' ? null : system;
  if (!Array.isArray(system)) fail('system', 'expected a string or an array of text blocks');
  const parts = system.map((b, j) => textPart(b, `system[${j}]`));
  return parts.length > 0 ? parts : null;
}

function textPart(block: unknown, where: string): Json {
  if (!isObject(block)) fail(where, 'expected a content block object');
  if (block.type !== 'text') fail(`${where}.type`, unsupportedBlock(block.type, 'here: only text blocks are'));
  if (typeof block.text !== 'string') fail(`${where}.text`, 'expected a string');
  return { type: 'text', text: block.text };
}

function unsupportedBlock(type: unknown, why: string): string {
  if (type === undefined) return 'a content block needs a type';
  if (type === 'image' || type === 'document' || type === 'search_result' || type === 'container_upload') return `content block type ${JSON.stringify(type)} is not supported: ${TEXT_ONLY}`;
  return `content block type ${JSON.stringify(type)} is not supported ${why}`;
}

function translateMessage(m: unknown, where: string, out: Json[], origins: string[]): void {
  if (!isObject(m)) fail(where, 'expected a message object');
  const { role, content } = m;
  if (role !== 'user' && role !== 'assistant' && role !== 'system') fail(`${where}.role`, role === undefined ? 'field required' : `unknown role ${JSON.stringify(role)}; expected user or assistant`);
  if (typeof content !== 'string' && !Array.isArray(content)) fail(`${where}.content`, content === undefined ? 'field required' : 'expected a string or an array of content blocks');
  if (Array.isArray(content) && content.length === 0) fail(`${where}.content`, 'a message needs at least one content block');
  if (role === 'system') {
    out.push({ role: 'system', content: typeof content === 'string' ? content : content.map((b, j) => textPart(b, `${where}.content[${j}]`)) });
    origins.push(where);
  } else if (role === 'assistant') {
    out.push(assistantMessage(content, where));
    origins.push(where);
  } else if (typeof content === 'string') {
    out.push({ role: 'user', content });
    origins.push(where);
  } else {
    userMessages(content, where, out, origins);
  }
}

/** A user message's blocks, in order: runs of text become user messages, each tool result a tool message. */
function userMessages(content: unknown[], where: string, out: Json[], origins: string[]): void {
  let text: Json[] = [];
  let textFrom = '';
  const flush = () => {
    if (text.length === 0) return;
    out.push({ role: 'user', content: text });
    origins.push(textFrom);
    text = [];
  };
  content.forEach((block, j) => {
    const at = `${where}.content[${j}]`;
    if (!isObject(block)) fail(at, 'expected a content block object');
    if (block.type === 'text') {
      if (text.length === 0) textFrom = content.length === 1 ? where : at;
      text.push(textPart(block, at));
    } else if (block.type === 'tool_result') {
      flush();
      out.push(toolMessage(block, at));
      origins.push(at);
    } else {
      fail(`${at}.type`, unsupportedBlock(block.type, 'in a user message: text and tool_result blocks are'));
    }
  });
  flush();
}

function toolMessage(block: Json, at: string): Json {
  if (typeof block.tool_use_id !== 'string' || block.tool_use_id === '') fail(`${at}.tool_use_id`, 'expected the id of the tool_use block this answers');
  if (block.is_error !== undefined && typeof block.is_error !== 'boolean') fail(`${at}.is_error`, 'expected a boolean');
  const c = block.content;
  let content: string | Json[];
  if (c === undefined || c === null) content = '';
  else if (typeof c === 'string') content = c;
  else if (Array.isArray(c)) content = c.map((b, k) => textPart(b, `${at}.content[${k}]`));
  else fail(`${at}.content`, 'expected a string or an array of text blocks');
  return { role: 'tool', tool_call_id: block.tool_use_id, content, ...(block.is_error === true ? { is_error: true } : {}) };
}

function assistantMessage(content: string | unknown[], where: string): Json {
  if (typeof content === 'string') return { role: 'assistant', content };
  const text: Json[] = [];
  const thinking: string[] = [];
  const calls: Json[] = [];
  content.forEach((block, j) => {
    const at = `${where}.content[${j}]`;
    if (!isObject(block)) fail(at, 'expected a content block object');
    if (block.type === 'text') text.push(textPart(block, at));
    else if (block.type === 'thinking') {
      if (typeof block.thinking !== 'string') fail(`${at}.thinking`, 'expected a string');
      thinking.push(block.thinking);
    } else if (block.type === 'tool_use') {
      if (typeof block.id !== 'string' || block.id === '') fail(`${at}.id`, 'expected a string');
      if (typeof block.name !== 'string' || block.name === '') fail(`${at}.name`, 'expected a string');
      if (!isObject(block.input)) fail(`${at}.input`, 'expected an object');
      calls.push({ id: block.id, type: 'function', function: { name: block.name, arguments: JSON.stringify(block.input) } });
    } else if (block.type === 'redacted_thinking') {
      fail(`${at}.type`, 'redacted_thinking blocks are not supported: this model\'s reasoning is plain text (send it as a thinking block)');
    } else {
      fail(`${at}.type`, unsupportedBlock(block.type, 'in an assistant message: text, thinking and tool_use blocks are'));
    }
  });
  return {
    role: 'assistant',
    content: text.length > 0 ? text : null,
    ...(thinking.length > 0 ? { reasoning_content: thinking.join('\n') } : {}),
    ...(calls.length > 0 ? { tool_calls: calls } : {}),
  };
}

function translateTools(tools: unknown): Json[] | null {
  if (tools === undefined || tools === null) return null;
  if (!Array.isArray(tools)) fail('tools', 'expected an array of tools');
  return tools.map((t, i) => {
    const at = `tools[${i}]`;
    if (!isObject(t)) fail(at, 'expected a tool object');
    if (t.type !== undefined && t.type !== 'custom') {
      fail(`${at}.type`, `${JSON.stringify(t.type)} is a server tool, which this gateway does not run: declare client tools, with name, description and input_schema`);
    }
    for (const key of Object.keys(t)) if (!TOOL_KEYS.has(key)) fail(`${at}.${key}`, 'this field is not supported by this gateway');
    if (typeof t.name !== 'string' || t.name === '') fail(`${at}.name`, 'expected a string');
    if (t.description !== undefined && typeof t.description !== 'string') fail(`${at}.description`, 'expected a string');
    if (t.eager_input_streaming !== undefined && t.eager_input_streaming !== null && typeof t.eager_input_streaming !== 'boolean') fail(`${at}.eager_input_streaming`, 'expected a boolean');
    if (!isObject(t.input_schema)) fail(`${at}.input_schema`, t.input_schema === undefined ? 'field required' : 'expected a JSON schema object');
    return { type: 'function', function: { name: t.name, ...(t.description !== undefined ? { description: t.description } : {}), parameters: t.input_schema } };
  });
}

function translateToolChoice(choice: unknown, tools: Json[] | null): unknown {
  if (choice === undefined || choice === null) return null;
  if (!isObject(choice)) fail('tool_choice', 'expected an object with a type (auto, any, tool or none)');
  if (choice.disable_parallel_tool_use !== undefined && typeof choice.disable_parallel_tool_use !== 'boolean') fail('tool_choice.disable_parallel_tool_use', 'expected a boolean');
  const names = (tools ?? []).map((t) => (t.function as { name: string }).name);
  switch (choice.type) {
    case 'auto':
      return 'auto';
    case 'none':
      return 'none';
    case 'any':
      if (names.length === 0) fail('tool_choice', '"any" needs tools: the request offers none');
      return 'required';
    case 'tool':
      if (typeof choice.name !== 'string') fail('tool_choice.name', 'expected a string');
      if (!names.includes(choice.name)) fail('tool_choice.name', `${JSON.stringify(choice.name)} is not among the request's tools`);
      return { type: 'function', function: { name: choice.name } };
    default:
      return fail('tool_choice.type', `expected auto, any, tool or none, got ${JSON.stringify(choice.type)}`);
  }
}

/** The template's `enable_thinking` for a `thinking` setting, or null to leave the model's default. */
function thinkingSwitch(thinking: unknown): boolean | null {
  if (thinking === undefined || thinking === null) return null;
  if (!isObject(thinking)) fail('thinking', 'expected an object with a type (enabled, adaptive or disabled)');
  if (thinking.type === 'disabled') return false;
  if (thinking.type === 'enabled' || thinking.type === 'adaptive') return true;
  return fail('thinking.type', `expected enabled, adaptive or disabled, got ${JSON.stringify(thinking.type)}`);
}

/**
 * A refusal of the chat pipeline restated in Messages terms: its `messages[k]` is the chat message
 * `k`, which `origins` maps back; the fields the translation renamed get their Messages names.
 */
export function restate(text: string, origins: readonly string[]): string {
  return text
    .replace(/messages\[(\d+)\](\.content)?/g, (whole, k: string, content: string | undefined) => {
      const from = origins[Number(k)];
      if (from === undefined) return whole;
      // A system prompt or a tool result is its own content.
      return from === 'system' || from.includes('.content[') ? from : `${from}${content ?? ''}`;
    })
    .replace(/tools\[(\d+)\]\.function\.parameters/g, 'tools[$1].input_schema')
    .replace(/tools\[(\d+)\]\.function\./g, 'tools[$1].')
    .replace(/^chat_template_kwargs\b/, 'thinking')
    .replace(/^stop\b/, 'stop_sequences');
}
