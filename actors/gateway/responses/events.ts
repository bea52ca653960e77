import type { SseSink } from '../chat-stream.js';
import type { EventStream } from '../routes/common.js';
import { blank, functionCallItem, itemId, messageItem, outputText, reasoningItem, type AssistantMessage, type Usage } from './translate.js';

/**
 * Chat-completion chunks in, Responses API events out: an SseSink for `streamCompletion`, so that
 * a streamed response is the chat stream, recorded the same way, in the other API's events.
 */

export interface ResponseStreamHooks {
  responseId: string;
  /** The Response object with the fields so far. */
  snapshot(status: 'in_progress' | 'completed' | 'incomplete' | 'failed', output: Record<string, unknown>[], usage: Usage | null): Record<string, unknown>;
  /**
   * The reply, before the final event goes out: stores the response, so that a client that has
   * seen it complete can continue from it at once. A throw ends the stream with an error event.
   */
  complete(message: AssistantMessage, response: Record<string, unknown>): Promise<void>;
}

type Open =
  | { kind: 'reasoning'; index: number; id: string; text: string }
  | { kind: 'message'; index: number; id: string; text: string }
  | { kind: 'function_call'; index: number; id: string; callIndex: number; callId: string; name: string; args: string };

interface ChatChunk {
  choices?: { delta?: { role?: string; content?: string; reasoning_content?: string; tool_calls?: { index: number; id: string; function: { name: string; arguments: string } }[] }; finish_reason?: string | null }[];
  usage?: { prompt_tokens: number; completion_tokens: number };
  reef?: { agent_record_id: string };
  error?: { code: string; message: string; param: string | null };
}

export function responseEventSink(sse: EventStream, hooks: ResponseStreamHooks): SseSink {
  let seq = 0;
  let created = false;
  let open: Open | null = null;
  /** Whitespace the model wrote before anything else of its text: content only if no tool call follows. */
  let heldBlank = '';
  let sawCall = false;
  let finish: string | null = null;
  let usage: Usage | null = null;
  let message: AssistantMessage | null = null;
  const output: Record<string, unknown>[] = [];
  const { responseId } = hooks;

  const frame = (type: string, fields: Record<string, unknown>): string => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...fields })}\n\n`;

  const start = (): string => {
    if (created) return '';
    created = true;
    const r = hooks.snapshot('in_progress', [], null);
    return frame('response.created', { response: r }) + frame('response.in_progress', { response: r });
  };

  const close = (status: 'completed' | 'incomplete' = 'completed'): string => {
    if (open === null) return '';
    const o = open;
    open = null;
    const at = { item_id: o.id, output_index: o.index };
    let text = '';
    let item: Record<string, unknown>;
    if (o.kind === 'reasoning') {
      const part = { type: 'reasoning_text', text: o.text };
      text += frame('response.reasoning_text.done', { ...at, content_index: 0, text: o.text });
      text += frame('response.content_part.done', { ...at, content_index: 0, part });
      item = reasoningItem(o.id, o.text, status);
    } else if (o.kind === 'message') {
      text += frame('response.output_text.done', { ...at, content_index: 0, text: o.text, logprobs: [] });
      text += frame('response.content_part.done', { ...at, content_index: 0, part: outputText(o.text) });
      item = messageItem(o.id, o.text, status);
    } else {
      text += frame('response.function_call_arguments.done', { ...at, name: o.name, arguments: o.args });
      item = functionCallItem(o.id, o.callId, o.name, o.args, status);
    }
    output[o.index] = item;
    return text + frame('response.output_item.done', { output_index: o.index, item });
  };

  const openItem = (o: Open, item: Record<string, unknown>, part: Record<string, unknown> | null): string => {
    let text = close();
    open = o;
    output[o.index] = item;
    text += frame('response.output_item.added', { output_index: o.index, item });
    if (part !== null) text += frame('response.content_part.added', { item_id: o.id, output_index: o.index, content_index: 0, part });
    return text;
  };

  const content = (delta: string, force = false): string => {
    if (open?.kind !== 'message' && !force) {
      if (blank(heldBlank + delta)) {
        heldBlank += delta;
        return '';
      }
      delta = heldBlank + delta;
      heldBlank = '';
    }
    let text = '';
    if (open?.kind !== 'message') {
      const id = itemId('msg', responseId, output.length);
      text += openItem({ kind: 'message', index: output.length, id, text: '' }, messageItem(id, null, 'in_progress'), outputText(''));
    }
    const o = open as unknown as Extract<Open, { kind: 'message' }>;
    o.text += delta;
    return text + frame('response.output_text.delta', { item_id: o.id, output_index: o.index, content_index: 0, delta, logprobs: [] });
  };

  const translate = (data: ChatChunk): string => {
    if (data.error) {
      const failed = hooks.snapshot('failed', output.filter(Boolean), usage);
      failed['error'] = { code: 'server_error', message: data.error.message };
      return start() + frame('error', { code: data.error.code, message: data.error.message, param: data.error.param }) + frame('response.failed', { response: failed });
    }
    if (data.usage) usage = { prompt: data.usage.prompt_tokens, completion: data.usage.completion_tokens };
    const choice = data.choices?.[0];
    if (choice === undefined) return '';
    let text = start();
    const d = choice.delta ?? {};
    if (typeof d.reasoning_content === 'string' && d.reasoning_content !== '') {
      if (open?.kind !== 'reasoning') {
        const id = itemId('rs', responseId, output.length);
        text += openItem({ kind: 'reasoning', index: output.length, id, text: '' }, reasoningItem(id, null, 'in_progress'), { type: 'reasoning_text', text: '' });
      }
      const o = open as unknown as Extract<Open, { kind: 'reasoning' }>;
      o.text += d.reasoning_content;
      text += frame('response.reasoning_text.delta', { item_id: o.id, output_index: o.index, content_index: 0, delta: d.reasoning_content });
    }
    if (typeof d.content === 'string' && d.content !== '') text += content(d.content);
    for (const call of d.tool_calls ?? []) {
      sawCall = true;
      heldBlank = '';
      let o = open as Open | null;
      if (o?.kind !== 'function_call' || o.callIndex !== call.index) {
        const id = itemId('fc', responseId, output.length);
        o = { kind: 'function_call', index: output.length, id, callIndex: call.index, callId: call.id, name: call.function.name, args: '' };
        text += openItem(o, functionCallItem(id, call.id, call.function.name, '', 'in_progress'), null);
      }
      if (call.function.arguments !== '') {
        o.args += call.function.arguments;
        text += frame('response.function_call_arguments.delta', { item_id: o.id, output_index: o.index, delta: call.function.arguments });
      }
    }
    if (choice.finish_reason) finish = choice.finish_reason;
    return text;
  };

  return {
    send: (data) => {
      const text = translate(data as ChatChunk);
      return text === '' ? Promise.resolve() : sse.write(text);
    },
    sendDone: async (events = []) => {
      let text = '';
      let recordId: string | null = null;
      for (const e of events as ChatChunk[]) {
        text += translate(e);
        if (e.reef) recordId = e.reef.agent_record_id;
      }
      // Whitespace alone, with no call after it, is the reply's text, as the non-streamed answer has it.
      if (heldBlank !== '' && !sawCall) {
        const held = heldBlank;
        heldBlank = '';
        text += content(held, true);
      }
      const status = finish === 'length' ? 'incomplete' : 'completed';
      text += close(status);
      const response = hooks.snapshot(status, output, usage);
      try {
        await hooks.complete(message ?? { role: 'assistant', content: null }, response);
      } catch (err) {
        sse.end(text + frame('error', { code: 'REEF_ERR_STORE', message: `the response was generated and recorded${recordId === null ? '' : ` (record ${recordId})`}, but could not be stored: ${(err as Error).message}`, param: null }));
        return;
      }
      sse.end(text + frame(status === 'incomplete' ? 'response.incomplete' : 'response.completed', { response, ...(recordId === null ? {} : { reef: { agent_record_id: recordId } }) }));
    },
    signal: sse.signal,
    recorded: (m) => {
      message = m;
    },
  };
}
