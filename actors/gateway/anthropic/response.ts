import { createHash } from 'node:crypto';
import type { GenerateResponse } from '../../../cluster/engine-client.js';
import { ERRORS, isErrorCode } from '../../runtime/errors.js';
import type { SseFraming } from '../routes/openai.js';
import type { ToolCall } from '../parsers/index.js';
import { anthropicErrorBody, anthropicErrorOf } from './errors.js';

/**
 * The chat pipeline's answers (a chat.completion body, or the chunks of its stream) as the
 * Messages API's: a `message`, or the event sequence message_start, ping, content_block_start /
 * delta / stop per block, message_delta (stop reason, usage), message_stop (with the receipt).
 */

export type StopReason = 'end_turn' | 'max_tokens' | 'stop_sequence' | 'tool_use';

type Finish = GenerateResponse['meta_info']['finish_reason'] | undefined;

/** What the answer needs of the prepared request. */
export interface MessageContext {
  id: string;
  model: string;
  inputTokens: number;
  /** The request's stop sequences, to tell one from the end-of-turn token in the engine's `matched`. */
  stop: readonly string[] | null;
  /** The settled finish of the generation, once it ended (chat.ts `Prepared.finish`). */
  finish(): Finish;
}

/**
 * The Messages stop reason of a chat finish_reason. A `stop` is a stop sequence when the engine
 * matched one of the request's strings (its `matched` is the end-of-turn token id otherwise).
 */
export function stopReason(finishReason: string, finish: Finish, stop: readonly string[] | null): { stop_reason: StopReason; stop_sequence: string | null } {
  if (finishReason === 'length') return { stop_reason: 'max_tokens', stop_sequence: null };
  if (finishReason === 'tool_calls') return { stop_reason: 'tool_use', stop_sequence: null };
  const matched = finish?.matched;
  if (typeof matched === 'string' && stop?.includes(matched)) return { stop_reason: 'stop_sequence', stop_sequence: matched };
  return { stop_reason: 'end_turn', stop_sequence: null };
}

/**
 * A thinking block's `signature`. Clients pass thinking blocks back with theirs, and some drop or
 * rewrite a block that has none; Reef does not check it when it comes back (the block's text is
 * what the prompt is rendered from), so it is a digest of the text, not a secret.
 */
export function thinkingSignature(thinking: string): string {
  return `reef-sha256:${createHash('sha256').update(thinking).digest('base64url')}`;
}

function toolUse(call: ToolCall): { type: 'tool_use'; id: string; name: string; input: unknown } {
  // The parser only makes calls whose arguments are the JSON text of an object.
  return { type: 'tool_use', id: call.id, name: call.function.name, input: JSON.parse(call.function.arguments) };
}

function usage(input: number, output: number) {
  return { input_tokens: input, output_tokens: output, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 };
}

interface ChatCompletionBody {
  choices: [{ message: { content: string | null; reasoning_content?: string; tool_calls?: ToolCall[] }; finish_reason: string }];
  usage: { prompt_tokens: number; completion_tokens: number };
}

/** A non-streamed chat completion as a Messages `message`. */
export function toMessage(body: unknown, ctx: MessageContext) {
  const { choices, usage: u } = body as ChatCompletionBody;
  const m = choices[0].message;
  const content: unknown[] = [];
  if (m.reasoning_content) content.push({ type: 'thinking', thinking: m.reasoning_content, signature: thinkingSignature(m.reasoning_content) });
  if (m.content) content.push({ type: 'text', text: m.content });
  for (const call of m.tool_calls ?? []) content.push(toolUse(call));
  return {
    id: `msg_${ctx.id}`,
    type: 'message',
    role: 'assistant',
    model: ctx.model,
    content,
    ...stopReason(choices[0].finish_reason, ctx.finish(), ctx.stop),
    usage: usage(u.prompt_tokens, u.completion_tokens),
  };
}

function sse(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

interface Chunk {
  choices?: Array<{ delta: { role?: string; content?: string; reasoning_content?: string; tool_calls?: [{ id: string; function: { name: string; arguments: string } }] }; finish_reason: string | null }>;
  usage?: { completion_tokens: number };
  reef?: { agent_record_id: string };
  error?: { code: string; message: string };
}

/**
 * The framing of a Messages stream: each chunk the chat pipeline sends (chat-stream.ts) becomes the
 * Messages events it stands for. One block is open at a time; a delta of another kind (thinking,
 * text, a tool call) closes it and opens the next. A tool call arrives whole, so its block carries
 * the input's JSON in one input_json_delta. The pipeline must be asked for its usage chunk
 * (`includeUsage`): message_delta goes out with it.
 */
export class MessagesFraming implements SseFraming {
  private index = -1;
  private open: 'text' | 'thinking' | 'tool_use' | null = null;
  private thinking = '';
  private finishReason: string | null = null;

  constructor(private readonly ctx: MessageContext) {}

  event(data: unknown): string {
    const c = data as Chunk;
    if (c.error) {
      const code = isErrorCode(c.error.code) ? c.error.code : 'REEF_ERR_HANDLER';
      return sse('error', anthropicErrorBody(anthropicErrorOf(ERRORS[code].status ?? 500).type, code, c.error.message));
    }
    if (c.reef) return sse('message_stop', { type: 'message_stop', reef: { agent_record_id: c.reef.agent_record_id } });
    const choice = c.choices?.[0];
    if (choice === undefined) {
      if (!c.usage) return '';
      const reason = stopReason(this.finishReason ?? 'stop', this.ctx.finish(), this.ctx.stop);
      return sse('message_delta', { type: 'message_delta', delta: reason, usage: { input_tokens: this.ctx.inputTokens, output_tokens: c.usage.completion_tokens } });
    }
    const d = choice.delta;
    let out = '';
    if (d.role !== undefined) {
      const message = { id: `msg_${this.ctx.id}`, type: 'message', role: 'assistant', model: this.ctx.model, content: [], stop_reason: null, stop_sequence: null, usage: usage(this.ctx.inputTokens, 0) };
      out += sse('message_start', { type: 'message_start', message }) + sse('ping', { type: 'ping' });
    }
    if (d.reasoning_content) {
      if (this.open !== 'thinking') out += this.start('thinking', { type: 'thinking', thinking: '', signature: '' });
      this.thinking += d.reasoning_content;
      out += sse('content_block_delta', { type: 'content_block_delta', index: this.index, delta: { type: 'thinking_delta', thinking: d.reasoning_content } });
    }
    if (d.content) {
      if (this.open !== 'text') out += this.start('text', { type: 'text', text: '' });
      out += sse('content_block_delta', { type: 'content_block_delta', index: this.index, delta: { type: 'text_delta', text: d.content } });
    }
    if (d.tool_calls) {
      const call = d.tool_calls[0];
      out += this.start('tool_use', { type: 'tool_use', id: call.id, name: call.function.name, input: {} });
      out += sse('content_block_delta', { type: 'content_block_delta', index: this.index, delta: { type: 'input_json_delta', partial_json: call.function.arguments } });
      out += this.close();
    }
    if (choice.finish_reason !== null) {
      this.finishReason = choice.finish_reason;
      out += this.close();
    }
    return out;
  }

  end(events: readonly unknown[]): string {
    let out = '';
    for (const e of events) out += this.event(e);
    return out;
  }

  private start(kind: 'text' | 'thinking' | 'tool_use', block: unknown): string {
    const out = this.close() + sse('content_block_start', { type: 'content_block_start', index: ++this.index, content_block: block });
    this.open = kind;
    return out;
  }

  private close(): string {
    if (this.open === null) return '';
    let out = '';
    if (this.open === 'thinking') {
      out += sse('content_block_delta', { type: 'content_block_delta', index: this.index, delta: { type: 'signature_delta', signature: thinkingSignature(this.thinking) } });
      this.thinking = '';
    }
    this.open = null;
    return out + sse('content_block_stop', { type: 'content_block_stop', index: this.index });
  }
}
