import { describe, expect, it } from 'vitest';
import type { EngineClient, GenerateResponse } from '../../cluster/engine-client.js';
import { completeOnce, type ChatDeps, type Prepared } from './chat.js';
import { settled, streamCompletion, type SseSink } from './chat-stream.js';
import { GenerationGate } from './generation-gate.js';
import { GatewayMetrics } from './metrics.js';
import { qwen3Parser } from './parsers/index.js';
import type { NewRecord } from './ports.js';

type Finish = GenerateResponse['meta_info']['finish_reason'];

function event(text: string, n: number, finish: Finish = null): GenerateResponse {
  return { text, output_ids: Array.from({ length: n }, (_, i) => 100 + i), meta_info: { id: 'r', finish_reason: finish, prompt_tokens: 3, completion_tokens: n, weight_version: 'v0' } };
}

/** The cumulative events of an engine that streams `texts`, one token each, the last with `finish`. */
function events(texts: string[], finish: Finish = { type: 'stop', matched: 2 }): GenerateResponse[] {
  return texts.map((t, i) => event(t, i + 1, i === texts.length - 1 ? finish : null));
}

/** streamCompletion and completeOnce against an engine replaying `evs`, a sink and a store in memory. */
function harness(evs: GenerateResponse[], prepared: Partial<Prepared> = {}) {
  const records: NewRecord[] = [];
  const engine = {
    async *generateStream(_body: Uint8Array, signal?: AbortSignal) {
      for (const e of evs) {
        if (signal?.aborted) throw signal.reason;
        yield e;
      }
    },
    generate: async () => evs.at(-1)!,
  } as unknown as EngineClient;
  const deps: ChatDeps = {
    tokenizer: { prepare: () => Promise.reject(new Error('not used')), contextLength: 4096 },
    parser: qwen3Parser,
    engine,
    engineName: 'fake',
    records: { newId: () => 'rec1', append: async (r) => (records.push(r), { id: r.id, offset: records.length }) },
    gate: new GenerationGate('v0'),
    metrics: new GatewayMetrics(),
    modelName: 'm',
    topK: 4,
    defaultMaxTokens: 16,
  };
  const p: Prepared = {
    id: 'rec1', ctx: { scenario: 's', keyId: 'open', tags: {}, sessionKey: null, startedAt: 0 }, body: new Uint8Array(2),
    promptIds: Int32Array.from([1, 2, 3]), engineBody: new Uint8Array(2), bodyLease: null,
    startsInThinking: false, tools: true, model: null, stream: true, includeUsage: true, ...prepared,
  };
  const sent: Array<Record<string, any>> = [];
  const sink: SseSink = { send: async (d) => void sent.push(d as Record<string, any>), sendDone: async (e = []) => void sent.push(...(e as Array<Record<string, any>>)), signal: new AbortController().signal };
  const streamed = (field: 'content' | 'reasoning_content') => sent.map((e) => e.choices?.[0]?.delta?.[field] ?? '').join('');
  return { deps, p, sink, sent, records, streamed };
}

describe('streamCompletion', () => {
  it('a character split across tokens does not stop the stream (regression: an emitted U+FFFD failed every later prefix check)', async () => {
    const h = harness(events(['Caf', 'Caf\uFFFD', 'Café au', 'Café au lait']));
    expect(await streamCompletion(h.deps, h.p, h.sink)).toMatchObject({ status: 'ok' });
    expect(h.streamed('content')).toBe('Café au lait');
    expect(h.records[0]!.response).toEqual({ role: 'assistant', content: 'Café au lait' });
  });

  it('the start of a stop string is held back until the engine decides (regression: SGLang trims it from the last event only, and the client kept "</ans")', async () => {
    const h = harness(events(['Hello', 'Hello wor', 'Hello world</', 'Hello world</ans', 'Hello world'], { type: 'stop', matched: '</answer>' }), { stop: ['</answer>'] });
    await streamCompletion(h.deps, h.p, h.sink);
    expect(h.streamed('content')).toBe('Hello world');
    expect(h.records[0]!.response).toEqual({ role: 'assistant', content: 'Hello world' });
  });

  it('a stop string completed by the last token the budget allows is cut and answered stop, as one token earlier (SGLang answers length with it in the text)', async () => {
    const h = harness(events(['Hello', 'Hello world</', 'Hello world</answer>'], { type: 'length', matched: null }), { stop: ['</answer>'] });
    await streamCompletion(h.deps, h.p, h.sink);
    expect(h.streamed('content')).toBe('Hello world');
    expect(h.sent.find((e) => e.choices?.[0]?.finish_reason)?.choices[0].finish_reason).toBe('stop');
    expect(h.records[0]).toMatchObject({ finishReason: 'stop', response: { role: 'assistant', content: 'Hello world' } });
    // Non-streamed alike; and a length with no stop string in its text stays a length.
    const once = (await completeOnce(h.deps, h.p))!.body as { choices: Array<{ message: { content: string }; finish_reason: string }> };
    expect([once.choices[0]!.message.content, once.choices[0]!.finish_reason]).toEqual(['Hello world', 'stop']);
    const cut = harness(events(['Hello', 'Hello world</an'], { type: 'length', matched: null }), { stop: ['</answer>'] });
    await streamCompletion(cut.deps, cut.p, cut.sink);
    expect(cut.streamed('content')).toBe('Hello world</an');
    expect(cut.records[0]!.finishReason).toBe('length');
  });

  it('a held-back stop-string start that turns out to be text is sent', async () => {
    const h = harness(events(['a <', 'a </an', 'a </and> b']), { stop: ['</answer>'] });
    await streamCompletion(h.deps, h.p, h.sink);
    expect(h.streamed('content')).toBe('a </and> b');
  });

  it('a generation the engine aborted ends with an error event and a failed record, not finish_reason stop (regression)', async () => {
    const h = harness(events(['Half', 'Half an'], { type: 'abort', matched: null }));
    expect(await streamCompletion(h.deps, h.p, h.sink)).toMatchObject({ status: 'failed' });
    expect(h.sent.some((e) => e.choices?.[0]?.finish_reason != null)).toBe(false);
    expect(h.sent.at(-1)).toMatchObject({ error: { code: 'REEF_ERR_ENGINE_FAILED' } });
    expect(h.records.map((r) => r.status)).toEqual(['failed']);
    expect(h.deps.gate.inflight).toBe(0);
  });

  it('a stream that ends before its final event (no finish_reason) ends with an error event and a failed record (regression: answered stop, recorded ok)', async () => {
    const h = harness(events(['Half', 'Half an'], null));
    expect(await streamCompletion(h.deps, h.p, h.sink)).toMatchObject({ status: 'failed' });
    expect(h.sent.some((e) => e.choices?.[0]?.finish_reason != null)).toBe(false);
    expect(h.sent.at(-1)).toMatchObject({ error: { code: 'REEF_ERR_ENGINE_FAILED', message: expect.stringContaining('no finish_reason') } });
    expect(h.records[0]).toMatchObject({ status: 'failed' });
    expect(h.records[0]!.outputIds.length).toBe(2);
    expect(h.deps.gate.inflight).toBe(0);
  });

  it('streamed content, reasoning and tool calls add up to the non-streamed message, whatever the chunking', async () => {
    const full = '<think>\nplan it\n</think>\n\nCalling.\n<tool_call>\n{"name": "f", "arguments": {"q": "日本"}}\n</tool_call>\nDone.';
    const once = await completeOnce(harness([event(full, 9, { type: 'stop', matched: 2 })]).deps, harness([]).p);
    const message = (once!.body as { choices: [{ message: Record<string, unknown>; finish_reason: string }] }).choices[0];
    for (const size of [1, 3, 7]) {
      const texts: string[] = [];
      for (let i = size; i < full.length + size; i += size) texts.push(full.slice(0, i));
      const h = harness(events(texts));
      await streamCompletion(h.deps, h.p, h.sink);
      expect(h.streamed('content')).toBe(message.message.content);
      expect(h.streamed('reasoning_content')).toBe(message.message.reasoning_content);
      const calls = h.sent.flatMap((e) => e.choices?.[0]?.delta?.tool_calls ?? []);
      expect(calls.map((c: { function: unknown }) => c.function)).toEqual((message.message.tool_calls as Array<{ function: unknown }>).map((c) => c.function));
      expect(h.sent.find((e) => e.choices?.[0]?.finish_reason)?.choices[0].finish_reason).toBe(message.finish_reason);
    }
  });
});

describe('completeOnce', () => {
  it('answers the message as the SDK types it, refusal: null included (regression: absent), and records the parsed message', async () => {
    const h = harness([event('<think>hm</think>Hi.', 3, { type: 'stop', matched: 2 })]);
    const body = (await completeOnce(h.deps, h.p))!.body as { choices: Array<Record<string, unknown>> };
    expect(body.choices).toEqual([{ index: 0, message: { role: 'assistant', content: 'Hi.', reasoning_content: 'hm', refusal: null }, finish_reason: 'stop', logprobs: null }]);
    expect(h.records[0]!.response).toEqual({ role: 'assistant', content: 'Hi.', reasoning_content: 'hm' });
  });

  it('a generation the engine aborted is an error, not a complete reply (regression: answered finish_reason stop)', async () => {
    const h = harness(events(['Half an'], { type: 'abort', matched: null }));
    await expect(completeOnce(h.deps, h.p)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_FAILED' });
    expect(h.records).toEqual([]);
    expect(h.deps.gate.inflight).toBe(0);
  });
});

describe('the weight version of a record', () => {
  /**
   * An engine that reports no weight version and holds its answer until `release()`; meanwhile a
   * swap whose drain ran out goes ahead (the engine finishes the generation on the old weights first).
   */
  function versionless() {
    const evs = events(['Hel', 'Hello']).map((e) => ({ ...e, meta_info: { ...e.meta_info, weight_version: null } }));
    const h = harness(evs);
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    h.deps.engine = {
      async *generateStream() {
        yield evs[0]!;
        await held;
        yield evs[1]!;
      },
      generate: async () => (await held, evs[1]!),
    } as unknown as EngineClient;
    const swapMidGeneration = async () => {
      await new Promise((r) => setImmediate(r));
      expect(h.deps.gate.inflight).toBe(1);
      expect(await h.deps.gate.pause(1)).toMatchObject({ drained: false });
      h.deps.gate.resume('v1');
      release();
    };
    return { h, swapMidGeneration };
  }

  it('is the one the generation was let through on when the engine reports none, streamed or not (regression: a swap before the record named the next weights)', async () => {
    const s = versionless();
    const [streamed] = await Promise.all([streamCompletion(s.h.deps, s.h.p, s.h.sink), s.swapMidGeneration()]);
    expect(streamed.status).toBe('ok');
    expect(s.h.records[0]!.weightVersion).toBe('v0');

    const o = versionless();
    await Promise.all([completeOnce(o.h.deps, { ...o.h.p, stream: false }), o.swapMidGeneration()]);
    expect(o.h.records[0]!.weightVersion).toBe('v0');
    // Later requests are let through on the new weights.
    expect(o.h.deps.gate.weightVersion).toBe('v1');
  });
});

describe('settled', () => {
  it.each([
    ['plain', 'abc', null, 3],
    ['split character', 'ab\uFFFD', null, 2],
    ['stop start', 'ab</an', ['</answer>'], 2],
    ['longest of several stops', 'ab##', ['#', '###'], 2],
    ['a stop start before a split character', 'a<\uFFFD', ['<x'], 1],
    ['no stop start', 'ab</b', ['</answer>'], 5],
  ] as const)('%s', (_n, text, stop, want) => {
    expect(settled(text, stop)).toBe(want);
  });
});
