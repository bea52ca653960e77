import { ReefError } from '../../runtime/errors.js';
import { perFrozen } from './frozen.js';

/** A message as the chat template sees it (after `normalizeMessages`). */
export type TemplateMessage = Record<string, unknown> & { role: string };

/**
 * OpenAI request messages → what the chat template is rendered with.
 *
 * - `developer` becomes `system`: templates written for open models know only `system`.
 * - Content-part arrays are joined into one string (text parts concatenated with nothing between
 *   them, the way the tiny model's and Qwen's templates join them). A plain string works with every
 *   template, whereas a list only with those that loop over parts. Non-text parts are refused:
 *   no served model takes images.
 * - `tool_calls[].function.arguments` stay as the client's raw JSON string: templates print a string
 *   argument verbatim, so no float formatting or key order is changed by a parse/re-serialise round
 *   trip (Python prints `1.0`, JavaScript `1`). An object is passed through as the client sent it.
 * - `null` stays `null`; the renderer drops null keys the way transformers does.
 */
export function normalizeMessages(messages: readonly unknown[]): TemplateMessage[] {
  return messages.map((raw, index) => normalizeMessage(raw, index));
}

/**
 * One message. The messages a session's requests share (deeply frozen by body-memo.ts) are
 * normalised once, and keep their identity for the tokenizer's per-message cache.
 */
const normalizeMessage = perFrozen((raw: unknown, index: number): TemplateMessage => {
  if (!raw || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `messages[${index}] must be an object` });
  }
  const msg = { ...(raw as Record<string, unknown>) };
  if (typeof msg.role !== 'string') {
    throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `messages[${index}].role must be a string` });
  }
  if (msg.role === 'developer') msg.role = 'system';
  if (Array.isArray(msg.content)) msg.content = joinTextParts(msg.content, index);
  if (Array.isArray(msg.tool_calls)) msg.tool_calls = msg.tool_calls.map((c, i) => normalizeToolCall(c, index, i));
  return msg as TemplateMessage;
});

function joinTextParts(parts: unknown[], index: number): string {
  let text = '';
  parts.forEach((part, i) => {
    const p = part as { type?: unknown; text?: unknown } | null;
    if (typeof part === 'string') text += part;
    else if (p && p.type === 'text' && typeof p.text === 'string') text += p.text;
    else {
      const kind = p && typeof p.type === 'string' ? p.type : typeof part;
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `messages[${index}].content[${i}]: content part of type ${kind} is not supported (text only)` });
    }
  });
  return text;
}

function normalizeToolCall(call: unknown, index: number, i: number): unknown {
  const c = call as { function?: { name?: unknown; arguments?: unknown } } | null;
  if (!c || typeof c !== 'object' || !c.function || typeof c.function.name !== 'string') {
    throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `messages[${index}].tool_calls[${i}] needs function.name` });
  }
  const args = c.function.arguments;
  if (args !== undefined && args !== null && typeof args !== 'string' && typeof args !== 'object') {
    throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `messages[${index}].tool_calls[${i}].function.arguments must be a JSON string or an object` });
  }
  return call;
}

/**
 * What transformers 5 does to each message before rendering: drop the keys whose value is null
 * (templates handle a missing key, not `None`), and copy reasoning under all the names templates
 * read (`reasoning_content`, `thinking`, `reasoning`) with the same key order Python produces.
 */
export function templateView(messages: readonly TemplateMessage[]): TemplateMessage[] {
  return messages.map(templateViewOf);
}

/** `templateView` of one message. */
export function templateViewOf(m: TemplateMessage): TemplateMessage {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(m)) if (v !== null && v !== undefined) out[k] = v;
  const reasoning = [out.reasoning_content, out.thinking, out.reasoning].find((v) => v !== undefined);
  if (reasoning === undefined) return out as TemplateMessage;
  const aliased: Record<string, unknown> = { thinking: reasoning };
  for (const [k, v] of Object.entries(out)) aliased[k] = v;
  aliased.reasoning_content = reasoning;
  return aliased as TemplateMessage;
}

/** Refuse a request whose prompt plus requested completion does not fit the model's context. */
export function checkContextLength(promptTokens: number, maxTokens: number, contextLength: number | null): void {
  if (contextLength === null) return;
  if (promptTokens + maxTokens > contextLength) {
    // OpenAI's wording: agents recognise a context overflow by it (OpenClaw matches "maximum context
    // length") and compact their history; any other wording left them resending the same transcript.
    throw new ReefError('REEF_ERR_CONTEXT_LENGTH', { promptTokens, maxTokens, contextLength, requested: promptTokens + maxTokens });
  }
}
