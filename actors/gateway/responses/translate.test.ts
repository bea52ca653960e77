import { describe, expect, it } from 'vitest';
import type { SseSink } from '../chat-stream.js';
import type { EventStream } from '../routes/common.js';
import { responseEventSink } from './events.js';
import { inputMessages, outputItems, readResponsesRequest, responseOfItem, type AssistantMessage } from './translate.js';

const ID = '01JABCDEFGHJKMNPQRSTVWXYZ0';

describe('Responses input as chat messages', () => {
  it('folds one assistant turn (reasoning, text, calls) into one message, and splits where a new turn starts', () => {
    expect(inputMessages([
      { role: 'developer', content: [{ type: 'input_text', text: 'a' }, { type: 'input_text', text: 'b' }] },
      { role: 'user', content: [{ type: 'input_text', text: 'hi' }] },
      { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'short' }], content: [{ type: 'reasoning_text', text: 'long' }] },
      { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'let me look' }] },
      { type: 'function_call', call_id: 'c1', name: 'f', arguments: '{}' },
      { type: 'function_call', call_id: 'c2', name: 'g', arguments: '{"a":1}' },
      { type: 'function_call_output', call_id: 'c1', output: 'one' },
      { type: 'function_call_output', call_id: 'c2', output: [{ type: 'input_text', text: 'two' }] },
      { type: 'reasoning', summary: [{ type: 'summary_text', text: 's1' }, { type: 'summary_text', text: 's2' }] },
      { role: 'assistant', content: 'done' },
      { role: 'assistant', content: 'and more' },
    ])).toEqual([
      { role: 'developer', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] },
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'let me look', reasoning_content: 'long', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }, { id: 'c2', type: 'function', function: { name: 'g', arguments: '{"a":1}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'one' },
      { role: 'tool', tool_call_id: 'c2', content: 'two' },
      { role: 'assistant', content: 'done', reasoning_content: 's1\n\ns2' },
      { role: 'assistant', content: 'and more' },
    ]);
  });

  it('refuses what it cannot say in chat, naming the item', () => {
    expect(inputMessages([{ role: 'user', content: 'x' }, { type: 'function_call', call_id: '', name: 'f', arguments: '{}' }])).toEqual({ error: 'input[1].call_id must be a non-empty string', param: 'input[1].call_id' });
    expect(inputMessages([{ role: 'tool', content: 'x' }])).toMatchObject({ param: 'input[0].role' });
    expect(inputMessages([{ type: 'item_reference', id: 'msg_1' }])).toMatchObject({ param: 'input[0].type' });
    expect(readResponsesRequest({ input: 'x', frobnicate: 1 })).toEqual({ error: 'unknown parameter "frobnicate"', param: 'frobnicate' });
    expect(readResponsesRequest({ input: 'x', tool_choice: { type: 'web_search' } })).toMatchObject({ param: 'tool_choice' });
    expect(readResponsesRequest({ input: 'x', background: false, top_logprobs: 0, include: [], truncation: 'disabled' })).toMatchObject({ store: true, stream: false });
  });

  it('maps the request fields onto the chat body', () => {
    const r = readResponsesRequest({ model: 'm', input: 'x', tools: [{ type: 'function', name: 'f', parameters: { type: 'object' } }], tool_choice: { type: 'function', name: 'f' }, max_output_tokens: 7, temperature: 0, top_p: 0.5, parallel_tool_calls: false });
    expect(r).toMatchObject({ chat: { model: 'm', tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }], tool_choice: { type: 'function', function: { name: 'f' } }, max_tokens: 7, temperature: 0, top_p: 0.5, parallel_tool_calls: false } });
  });

  it('finds the response an item came from by the ids this gateway gives, and no other', () => {
    expect(responseOfItem({ id: `fc_${ID}_2` })).toBe(ID);
    expect(responseOfItem({ id: 'fc_abc_2' })).toBeNull();
    expect(responseOfItem({ type: 'message' })).toBeNull();
  });
});

/** Runs chat chunks through the event sink and returns the final response's output items. */
async function streamed(chunks: unknown[], message: AssistantMessage): Promise<{ types: string[]; output: unknown[] }> {
  let text = '';
  const sse: EventStream = { write: async (t) => void (text += t), end: (t) => void (text += t), signal: new AbortController().signal, started: true, close: () => {} };
  let output: unknown[] = [];
  const sink: SseSink = responseEventSink(sse, {
    responseId: ID,
    snapshot: (status, out) => ({ status, output: out }),
    complete: async (_m, response) => void (output = response['output'] as unknown[]),
  });
  const chunk = (delta: unknown, finish: string | null = null) => ({ choices: [{ index: 0, delta, finish_reason: finish }] });
  await sink.send(chunk({ role: 'assistant', content: '' }));
  for (const c of chunks) await sink.send(chunk(c));
  sink.recorded!(message as never);
  await sink.sendDone([chunk({}, 'stop'), { choices: [], reef: { agent_record_id: ID } }]);
  const types = [...text.matchAll(/^event: (.+)$/gm)].map((m) => m[1]!);
  return { types, output };
}

describe('streamed response events', () => {
  it('give the same items as the answer that is not streamed: whitespace before a call is not a message, whitespace alone is', async () => {
    const call = { id: 'call_1', type: 'function' as const, function: { name: 'f', arguments: '{"a":1}' } };
    const withCall: AssistantMessage = { role: 'assistant', content: '\n\n', tool_calls: [call] };
    const s1 = await streamed([{ content: '\n' }, { content: '\n' }, { tool_calls: [{ index: 0, ...call, function: { name: 'f', arguments: '' } }] }, { tool_calls: [{ index: 0, ...call, function: { name: 'f', arguments: '{"a":1}' } }] }], withCall);
    expect(s1.output).toEqual(outputItems(ID, withCall, 'completed'));
    expect(s1.types).toEqual(['response.created', 'response.in_progress', 'response.output_item.added', 'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done', 'response.completed']);

    const blankOnly: AssistantMessage = { role: 'assistant', content: ' ' };
    expect((await streamed([{ content: ' ' }], blankOnly)).output).toEqual(outputItems(ID, blankOnly, 'completed'));

    const thought: AssistantMessage = { role: 'assistant', content: 'ok', reasoning_content: 'hm' };
    const s3 = await streamed([{ reasoning_content: 'h' }, { reasoning_content: 'm' }, { content: 'o' }, { content: 'k' }], thought);
    expect(s3.output).toEqual(outputItems(ID, thought, 'completed'));
  });
});
