import { describe, expect, it } from 'vitest';
import { errorBody } from '../http-errors.js';
import { MessagesFraming, stopReason, thinkingSignature, toMessage, type MessageContext } from './response.js';

const ctx = (finish: MessageContext['finish'] = () => ({ type: 'stop', matched: 151645 })): MessageContext => ({ id: 'R1', model: 'tiny', inputTokens: 7, stop: ['END'], finish });

/** Parses framed text back into [event, data] pairs. */
function events(text: string): Array<[string, Record<string, any>]> {
  return text.split('\n\n').filter(Boolean).map((e) => {
    const [ev, data] = e.split('\n');
    return [ev!.slice('event: '.length), JSON.parse(data!.slice('data: '.length))];
  });
}

describe('Messages answers', () => {
  it.each([
    ['length', { type: 'length', matched: null }, 'max_tokens', null],
    ['tool_calls', { type: 'stop', matched: 'END' }, 'tool_use', null],
    ['stop', { type: 'stop', matched: 'END' }, 'stop_sequence', 'END'],
    // The end-of-turn token, and a string the request did not ask to stop at.
    ['stop', { type: 'stop', matched: 151645 }, 'end_turn', null],
    ['stop', { type: 'stop', matched: '<|im_end|>' }, 'end_turn', null],
  ] as const)('finish_reason %s with %j → %s', (fr, finish, reason, seq) => {
    expect(stopReason(fr, finish, ['END'])).toEqual({ stop_reason: reason, stop_sequence: seq });
  });

  it('a completion body becomes thinking, text and tool_use blocks', () => {
    const body = { choices: [{ message: { role: 'assistant', content: 'On it.', reasoning_content: 'hmm', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: '{"a":[1]}' } }] }, finish_reason: 'tool_calls' }], usage: { prompt_tokens: 7, completion_tokens: 9 } };
    expect(toMessage(body, ctx())).toEqual({
      id: 'msg_R1', type: 'message', role: 'assistant', model: 'tiny',
      content: [{ type: 'thinking', thinking: 'hmm', signature: thinkingSignature('hmm') }, { type: 'text', text: 'On it.' }, { type: 'tool_use', id: 'call_1', name: 'f', input: { a: [1] } }],
      stop_reason: 'tool_use', stop_sequence: null,
      usage: { input_tokens: 7, output_tokens: 9, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
    });
  });

  it('frames chunks as Messages events: a block per run, closed before the next opens', () => {
    const f = new MessagesFraming(ctx(() => ({ type: 'stop', matched: 'END' })));
    const chunk = (delta: object, finish: string | null = null) => ({ choices: [{ index: 0, delta, finish_reason: finish }] });
    let text = f.event(chunk({ role: 'assistant', content: '' }));
    text += f.event(chunk({ content: 'a' })) + f.event(chunk({ content: 'b' }));
    text += f.event(chunk({ tool_calls: [{ index: 0, id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] }));
    text += f.event(chunk({ content: 'c' }));
    text += f.end([chunk({}, 'stop'), { choices: [], usage: { completion_tokens: 4 } }, { choices: [], reef: { agent_record_id: 'R1' } }]);
    const got = events(text);
    expect(got.map(([e, d]) => `${e}${d.index !== undefined ? `#${d.index}` : ''}`)).toEqual([
      'message_start', 'ping',
      'content_block_start#0', 'content_block_delta#0', 'content_block_delta#0', 'content_block_stop#0',
      'content_block_start#1', 'content_block_delta#1', 'content_block_stop#1',
      'content_block_start#2', 'content_block_delta#2', 'content_block_stop#2',
      'message_delta', 'message_stop',
    ]);
    expect(got.every(([e, d]) => d.type === e)).toBe(true);
    expect(got.at(-2)![1]).toEqual({ type: 'message_delta', delta: { stop_reason: 'stop_sequence', stop_sequence: 'END' }, usage: { input_tokens: 7, output_tokens: 4 } });
    expect(got.at(-1)![1]).toEqual({ type: 'message_stop', reef: { agent_record_id: 'R1' } });
  });

  it('frames the pipeline\'s error body as an error event in Anthropic\'s body', () => {
    const got = events(new MessagesFraming(ctx()).event(errorBody('REEF_ERR_STORE', 'record store: disk I/O error')));
    expect(got).toEqual([['error', { type: 'error', error: { type: 'api_error', message: 'record store: disk I/O error', details: { error_code: 'REEF_ERR_STORE' } } }]]);
  });
});
