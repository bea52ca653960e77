import type { ParsedOutput } from '../parsers/index.js';

/**
 * The OpenAI Responses API in terms of chat completions. A Responses request (with the stored
 * conversation it continues) becomes the chat-completion body that asks the same thing, so that it
 * runs through the chat pipeline unchanged, prompt rendering, record and receipt included; the
 * assistant message that comes back becomes the response's output items.
 */

/** A chat message as the chat pipeline takes it (openai-schema.ts), built here from input items. */
export type ChatMessage = Record<string, unknown> & { role: string };

/** The assistant message the chat pipeline records (chat.ts `assistantMessage`). */
export type AssistantMessage = { role: 'assistant'; content: string | null; reasoning_content?: string; tool_calls?: ParsedOutput['tool_calls'] };

export interface ResponsesRequest {
  model: string | null;
  instructions: string | null;
  /** The request's input as a list of items (a string input is one user message). */
  inputItems: Record<string, unknown>[];
  /** The input as chat messages: what the conversation gains before the reply. */
  messages: ChatMessage[];
  /** As the client sent them, for the response's echo. */
  tools: Record<string, unknown>[];
  toolChoice: unknown;
  maxOutputTokens: number | null;
  temperature: number | null;
  topP: number | null;
  parallelToolCalls: boolean;
  stream: boolean;
  store: boolean;
  /** The id as sent (`resp_…`). */
  previousResponseId: string | null;
  metadata: Record<string, string>;
  /** The chat-completion fields the request maps to, messages and stream left out. */
  chat: Record<string, unknown>;
}

export interface Refused {
  error: string;
  param: string | null;
}

/** Accepted and left unused: they change nothing a self-hosted model can honour, or nothing at all. */
const IGNORED = new Set(['user', 'include', 'service_tier', 'prompt_cache_key', 'prompt_cache_retention', 'safety_identifier', 'stream_options', 'reasoning', 'truncation']);
/** Parts of the API this gateway does not serve: refused by name, rather than answered as if honoured. */
const UNSUPPORTED: Record<string, string> = {
  background: 'background responses are not supported: leave background out (or false) and wait for the response',
  conversation: 'the Conversations API is not supported: continue a conversation with previous_response_id, or send the whole input',
  prompt: 'stored prompt templates are not supported: send instructions and input',
  max_tool_calls: 'max_tool_calls is not supported (only function tools, which the client runs)',
  top_logprobs: 'top_logprobs is not supported by /v1/responses',
};
const KNOWN = new Set(['model', 'input', 'instructions', 'tools', 'tool_choice', 'max_output_tokens', 'temperature', 'top_p', 'parallel_tool_calls', 'stream', 'store', 'previous_response_id', 'metadata', 'text', ...IGNORED]);

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);
const kind = (v: unknown): string => (v === null ? 'null' : Array.isArray(v) ? 'an array' : typeof v);

class Refusal extends Error {
  constructor(readonly refused: Refused) {
    super(refused.error);
  }
}

/** Reads and checks a Responses create body; refused with the field it names. */
export function readResponsesRequest(body: unknown): ResponsesRequest | Refused {
  try {
    return readRequest(body);
  } catch (err) {
    if (err instanceof Refusal) return err.refused;
    throw err;
  }
}

function readRequest(body: unknown): ResponsesRequest | Refused {
  if (!isObject(body)) return { error: 'request body must be a JSON object', param: null };
  for (const [k, v] of Object.entries(body)) {
    if (v === undefined || v === null) continue;
    if (k in UNSUPPORTED && !(k === 'background' && v === false) && !(k === 'top_logprobs' && v === 0)) return { error: UNSUPPORTED[k]!, param: k };
    if (!KNOWN.has(k) && !(k in UNSUPPORTED)) return { error: `unknown parameter ${JSON.stringify(k)}`, param: k };
  }
  const opt = <T>(k: string, check: (v: unknown) => v is T, what: string): T | null => {
    const v = body[k];
    if (v === undefined || v === null) return null;
    if (!check(v)) throw new Refusal({ error: `${k} must be ${what}, got ${kind(v)}`, param: k });
    return v;
  };
  const isString = (v: unknown): v is string => typeof v === 'string';
  const isBool = (v: unknown): v is boolean => typeof v === 'boolean';
  const isNumber = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);
  const isPositiveInt = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 1;

  const model = opt('model', isString, 'a string');
  const instructions = opt('instructions', isString, 'a string');
  const maxOutputTokens = opt('max_output_tokens', isPositiveInt, 'a positive integer');
  const temperature = opt('temperature', isNumber, 'a number');
  const topP = opt('top_p', isNumber, 'a number');
  const parallel = opt('parallel_tool_calls', isBool, 'a boolean');
  const stream = opt('stream', isBool, 'a boolean');
  const store = opt('store', isBool, 'a boolean');
  const previous = opt('previous_response_id', isString, 'a string');
  const metadata = opt('metadata', isObject, 'an object');
  if (isObject(metadata) && Object.values(metadata).some((m) => typeof m !== 'string')) return { error: 'metadata values must be strings', param: 'metadata' };
  const text = body['text'];
  if (text !== undefined && text !== null) {
    if (!isObject(text)) return { error: `text must be an object, got ${kind(text)}`, param: 'text' };
    const format = text['format'];
    if (format !== undefined && format !== null && !(isObject(format) && format['type'] === 'text')) {
      return { error: 'text.format: only {"type": "text"} is supported (structured outputs are not)', param: 'text.format' };
    }
  }

  const input = body['input'];
  let inputItems: Record<string, unknown>[];
  if (typeof input === 'string') inputItems = [{ type: 'message', role: 'user', content: input }];
  else if (Array.isArray(input)) inputItems = input as Record<string, unknown>[];
  else if (input === undefined || input === null) {
    if (previous === null) return { error: 'input is required: a string, or a list of input items', param: 'input' };
    inputItems = [];
  } else return { error: `input must be a string or a list of input items, got ${kind(input)}`, param: 'input' };
  const messages = inputMessages(inputItems);
  if (isRefused(messages)) return messages;
  if (messages.length === 0 && previous === null) return { error: 'input is empty: send at least one message', param: 'input' };

  const tools = readTools(body['tools']);
  if (isRefused(tools)) return tools;
  const toolChoice = readToolChoice(body['tool_choice']);
  if (isRefused(toolChoice)) return toolChoice;

  const chat: Record<string, unknown> = {};
  if (model !== null) chat['model'] = model;
  if (tools.chat.length > 0) chat['tools'] = tools.chat;
  if (toolChoice !== null) chat['tool_choice'] = toolChoice.chat;
  if (maxOutputTokens !== null) chat['max_tokens'] = maxOutputTokens;
  if (temperature !== null) chat['temperature'] = temperature;
  if (topP !== null) chat['top_p'] = topP;
  if (parallel !== null) chat['parallel_tool_calls'] = parallel;
  return {
    model,
    instructions,
    inputItems,
    messages,
    tools: tools.echo,
    toolChoice: toolChoice?.echo ?? 'auto',
    maxOutputTokens,
    temperature,
    topP,
    parallelToolCalls: parallel ?? true,
    stream: stream ?? false,
    store: store ?? true,
    previousResponseId: previous,
    metadata: (metadata ?? {}) as Record<string, string>,
    chat,
  };
}

function isRefused(v: unknown): v is Refused {
  return isObject(v) && typeof v['error'] === 'string' && 'param' in v;
}

function readTools(raw: unknown): { echo: Record<string, unknown>[]; chat: unknown[] } | Refused {
  if (raw === undefined || raw === null) return { echo: [], chat: [] };
  if (!Array.isArray(raw)) return { error: `tools must be a list, got ${kind(raw)}`, param: 'tools' };
  const chat: unknown[] = [];
  for (let i = 0; i < raw.length; i++) {
    const t: unknown = raw[i];
    const at = `tools[${i}]`;
    if (!isObject(t)) return { error: `${at} must be an object`, param: at };
    if (t['type'] !== 'function') {
      return { error: `${at}.type ${JSON.stringify(t['type'])} is not supported: this gateway serves function tools only (built-in tools such as web search, file search or code interpreter are not available)`, param: `${at}.type` };
    }
    if (typeof t['name'] !== 'string' || t['name'] === '') return { error: `${at}.name must be a non-empty string`, param: `${at}.name` };
    if (t['parameters'] !== undefined && t['parameters'] !== null && !isObject(t['parameters'])) return { error: `${at}.parameters must be a JSON Schema object`, param: `${at}.parameters` };
    if (t['description'] !== undefined && t['description'] !== null && typeof t['description'] !== 'string') return { error: `${at}.description must be a string`, param: `${at}.description` };
    const fn: Record<string, unknown> = { name: t['name'] };
    if (typeof t['description'] === 'string') fn['description'] = t['description'];
    if (isObject(t['parameters'])) fn['parameters'] = t['parameters'];
    if (typeof t['strict'] === 'boolean') fn['strict'] = t['strict'];
    chat.push({ type: 'function', function: fn });
  }
  return { echo: raw as Record<string, unknown>[], chat };
}

function readToolChoice(raw: unknown): { echo: unknown; chat: unknown } | null | Refused {
  if (raw === undefined || raw === null) return null;
  if (raw === 'auto' || raw === 'none' || raw === 'required') return { echo: raw, chat: raw };
  if (isObject(raw) && raw['type'] === 'function' && typeof raw['name'] === 'string') return { echo: raw, chat: { type: 'function', function: { name: raw['name'] } } };
  return { error: 'tool_choice must be "auto", "none", "required" or {"type": "function", "name": …} (hosted and custom tools are not supported)', param: 'tool_choice' };
}

/** The text of a content list's parts, or a refusal naming the part that is not text. */
function partsText(parts: unknown[], at: string, allowed: readonly string[]): string[] | Refused {
  const out: string[] = [];
  for (let j = 0; j < parts.length; j++) {
    const part = parts[j];
    const pat = `${at}[${j}]`;
    if (!isObject(part)) return { error: `${pat} must be an object`, param: pat };
    const type = part['type'];
    if (typeof type !== 'string' || !allowed.includes(type)) {
      return { error: `${pat}.type ${JSON.stringify(type)} is not supported here: expected ${allowed.join(' or ')} (images, files and audio are not supported)`, param: `${pat}.type` };
    }
    const text = type === 'refusal' ? part['refusal'] : part['text'];
    if (typeof text !== 'string') return { error: `${pat}.${type === 'refusal' ? 'refusal' : 'text'} must be a string`, param: `${pat}.${type === 'refusal' ? 'refusal' : 'text'}` };
    out.push(text);
  }
  return out;
}

/**
 * Input items as chat messages. One assistant turn is several items in the Responses API
 * (reasoning, message, function calls) and one message in chat: consecutive assistant-side items
 * fold into one assistant message, in the order the recorded reply keeps its fields.
 */
export function inputMessages(items: readonly unknown[]): ChatMessage[] | Refused {
  const out: ChatMessage[] = [];
  let turn: AssistantMessage | null = null;
  const flush = () => {
    if (turn !== null) out.push(turn);
    turn = null;
  };
  for (let i = 0; i < items.length; i++) {
    const item = items[i];
    const at = `input[${i}]`;
    if (!isObject(item)) return { error: `${at} must be an object`, param: at };
    const type = item['type'] ?? (item['role'] !== undefined ? 'message' : undefined);
    if (type === 'message') {
      const role = item['role'];
      const content = item['content'];
      if (role !== 'user' && role !== 'system' && role !== 'developer' && role !== 'assistant') {
        return { error: `${at}.role ${JSON.stringify(role)} is not one of user, system, developer or assistant`, param: `${at}.role` };
      }
      let text: string | string[];
      if (typeof content === 'string') text = content;
      else if (Array.isArray(content)) {
        const parts = partsText(content, `${at}.content`, role === 'assistant' ? ['output_text', 'refusal'] : ['input_text']);
        if (isRefused(parts)) return parts;
        text = parts;
      } else return { error: `${at}.content must be a string or a list of content parts, got ${kind(content)}`, param: `${at}.content` };
      if (role === 'assistant') {
        const s = typeof text === 'string' ? text : text.join('');
        if (turn !== null && (turn.content !== null || turn.tool_calls !== undefined)) flush();
        turn ??= { role: 'assistant', content: null };
        turn.content = s;
        continue;
      }
      flush();
      // One text part is the string it holds; several stay parts, for the chat template to join.
      out.push({ role, content: typeof text === 'string' ? text : text.length === 1 ? text[0]! : text.map((t) => ({ type: 'text', text: t })) });
    } else if (type === 'function_call') {
      for (const k of ['call_id', 'name', 'arguments'] as const) {
        if (typeof item[k] !== 'string' || (k !== 'arguments' && item[k] === '')) return { error: `${at}.${k} must be a ${k === 'arguments' ? '' : 'non-empty '}string`, param: `${at}.${k}` };
      }
      turn ??= { role: 'assistant', content: null };
      (turn.tool_calls ??= []).push({ id: item['call_id'] as string, type: 'function', function: { name: item['name'] as string, arguments: item['arguments'] as string } });
    } else if (type === 'function_call_output') {
      if (typeof item['call_id'] !== 'string' || item['call_id'] === '') return { error: `${at}.call_id must be a non-empty string`, param: `${at}.call_id` };
      const output = item['output'];
      let text: string;
      if (typeof output === 'string') text = output;
      else if (Array.isArray(output)) {
        const parts = partsText(output, `${at}.output`, ['input_text']);
        if (isRefused(parts)) return parts;
        text = parts.join('');
      } else return { error: `${at}.output must be a string or a list of input_text parts, got ${kind(output)}`, param: `${at}.output` };
      flush();
      out.push({ role: 'tool', tool_call_id: item['call_id'], content: text });
    } else if (type === 'reasoning') {
      const content = item['content'];
      const summary = item['summary'];
      let text: string[] = [];
      if (Array.isArray(content) && content.length > 0) {
        const parts = partsText(content, `${at}.content`, ['reasoning_text']);
        if (isRefused(parts)) return parts;
        text = parts;
      } else if (Array.isArray(summary)) {
        const parts = partsText(summary, `${at}.summary`, ['summary_text']);
        if (isRefused(parts)) return parts;
        text = parts;
      } else if (summary !== undefined) return { error: `${at}.summary must be a list of summary_text parts`, param: `${at}.summary` };
      // A reasoning item that carries only encrypted content (from another provider) has no text to give the model.
      if (text.length === 0) continue;
      if (turn !== null) flush();
      turn = { role: 'assistant', content: null, reasoning_content: text.join('\n\n') };
    } else if (type === 'item_reference') {
      return { error: `${at}: item references are not supported: send the item itself, or continue with previous_response_id`, param: `${at}.type` };
    } else {
      return { error: `${at}.type ${JSON.stringify(type)} is not supported: expected message, function_call, function_call_output or reasoning`, param: `${at}.type` };
    }
  }
  flush();
  return out;
}

/** An output item's id: it names the response it came from, so that a client resending it can be placed in its conversation. */
export function itemId(prefix: 'rs' | 'msg' | 'fc', responseId: string, index: number): string {
  return `${prefix}_${responseId}_${index}`;
}

const ITEM_ID_RE = /^(?:rs|msg|fc)_([0-9A-HJKMNP-TV-Z]{26})_\d+$/;

/** The response an input item came from, by the id this gateway gave it; null for any other. */
export function responseOfItem(item: unknown): string | null {
  if (!isObject(item) || typeof item['id'] !== 'string') return null;
  return ITEM_ID_RE.exec(item['id'])?.[1] ?? null;
}

/** The stored id of an API response id (`resp_<record id>`), or null when it is not one of this gateway's. */
export function storedIdOf(apiId: string): string | null {
  return /^resp_([0-9A-HJKMNP-TV-Z]{26})$/.exec(apiId)?.[1] ?? null;
}

/** Whether content the model wrote is only the whitespace before its tool calls. */
export const blank = (s: string): boolean => s.trim() === '';

/**
 * The output items of a reply, in the order the model wrote them: reasoning, text, calls. Cut off
 * by the token budget, the last item is the one left `incomplete`.
 */
export function outputItems(responseId: string, message: AssistantMessage, status: 'completed' | 'incomplete'): Record<string, unknown>[] {
  const items: Record<string, unknown>[] = [];
  if (message.reasoning_content !== undefined) items.push(reasoningItem(itemId('rs', responseId, items.length), message.reasoning_content, 'completed'));
  const calls = message.tool_calls ?? [];
  if (message.content !== null && (!blank(message.content) || calls.length === 0)) items.push(messageItem(itemId('msg', responseId, items.length), message.content, 'completed'));
  for (const c of calls) items.push(functionCallItem(itemId('fc', responseId, items.length), c.id, c.function.name, c.function.arguments, 'completed'));
  if (status === 'incomplete' && items.length > 0) items[items.length - 1]!['status'] = 'incomplete';
  return items;
}

export function reasoningItem(id: string, text: string | null, status: string): Record<string, unknown> {
  return { id, type: 'reasoning', summary: [], content: text === null ? [] : [{ type: 'reasoning_text', text }], status };
}

export function messageItem(id: string, text: string | null, status: string): Record<string, unknown> {
  return { id, type: 'message', status, role: 'assistant', content: text === null ? [] : [outputText(text)] };
}

export function outputText(text: string): Record<string, unknown> {
  return { type: 'output_text', text, annotations: [], logprobs: [] };
}

export function functionCallItem(id: string, callId: string, name: string, args: string, status: string): Record<string, unknown> {
  return { id, type: 'function_call', status, call_id: callId, name, arguments: args };
}

export interface Usage {
  prompt: number;
  completion: number;
}

/** The Response object. */
export function responseObject(
  req: ResponsesRequest,
  fields: { id: string; createdAt: number; model: string; status: 'in_progress' | 'completed' | 'incomplete' | 'failed'; output: Record<string, unknown>[]; usage: Usage | null; error?: { code: string; message: string } | null },
): Record<string, unknown> {
  return {
    id: `resp_${fields.id}`,
    object: 'response',
    created_at: Math.floor(fields.createdAt / 1000),
    status: fields.status,
    error: fields.error ?? null,
    incomplete_details: fields.status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
    instructions: req.instructions,
    max_output_tokens: req.maxOutputTokens,
    model: fields.model,
    output: fields.output,
    parallel_tool_calls: req.parallelToolCalls,
    previous_response_id: req.previousResponseId,
    reasoning: null,
    store: req.store,
    temperature: req.temperature,
    text: { format: { type: 'text' } },
    tool_choice: req.toolChoice,
    tools: req.tools,
    top_p: req.topP,
    truncation: 'disabled',
    usage:
      fields.usage === null
        ? null
        : { input_tokens: fields.usage.prompt, input_tokens_details: { cached_tokens: 0 }, output_tokens: fields.usage.completion, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: fields.usage.prompt + fields.usage.completion },
    metadata: req.metadata,
  };
}
