import { describe, expect, it } from 'vitest';
import { deepFreeze } from './tokenize/frozen.js';
import { fastChatRequest } from './chat-request-fast.js';
import { ChatCompletionRequest, parseChatRequest } from './openai-schema.js';
import { TWELVE_TOOLS } from '../../test/parity/corpus.js';

/** Keys in order, `undefined` values and all: equal dumps mean the same object down to key order. */
function dump(v: unknown): string {
  if (v === undefined) return 'undefined';
  if (v === null || typeof v !== 'object') return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(dump).join(',')}]`;
  return `{${Object.keys(v).map((k) => `${JSON.stringify(k)}:${dump((v as Record<string, unknown>)[k])}`).join(',')}}`;
}

/** `parseChatRequest`'s answer: zod's, but for the body's own tools once they are valid. */
function asParsed(data: unknown, body: unknown): unknown {
  const d = data as Record<string, unknown>;
  return Array.isArray(d.tools) ? { ...d, tools: (body as { tools: unknown }).tools } : d;
}

let seed = 20;
// The LCG's high bits: its low bits repeat with short periods.
const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), Math.floor((seed / 2 ** 31) * n));
const pick = <T>(xs: readonly T[]): T => xs[rand(xs.length)]!;

const call = (id: string, name: string) => ({ id, type: 'function', function: { name, arguments: '{"q": 1}' } });
function baseRequest(): Record<string, unknown> {
  return {
    model: 'tiny',
    messages: [
      { role: 'system', content: 'You are careful.' },
      { role: 'user', content: [{ type: 'text', text: 'hi' }] },
      { role: 'assistant', content: null, reasoning_content: 'hmm', tool_calls: [call('c1', 'get_weather')] },
      { role: 'tool', content: '{"t": 9}', tool_call_id: 'c1' },
      { role: 'assistant', content: 'Done.' },
      { role: 'user', content: 'again', name: 'me' },
    ],
    temperature: 0.5, top_p: 1, top_k: 20, max_tokens: 16, stop: ['\n\n'], stream: true, stream_options: { include_usage: true },
    tools: structuredClone(TWELVE_TOOLS).slice(0, 3), tool_choice: 'auto', seed: 3, user: 'u',
  };
}

/** Every object and array in a value, except inside tool parameters (free-form JSON, where any change is valid). */
function nodes(v: unknown, out: Array<Record<string, unknown> | unknown[]> = []): Array<Record<string, unknown> | unknown[]> {
  if (v !== null && typeof v === 'object') {
    out.push(v as Record<string, unknown>);
    for (const [k, c] of Object.entries(v)) if (k !== 'parameters') nodes(c, out);
  }
  return out;
}

const ODD_VALUES: unknown[] = [null, 0, -1, 1.5, 3, 2 ** 60, '', 'x', 'function', 'text', 'user', true, [], [1], {}, { type: 'text' }, 'a'.repeat(70)];

/** One random change somewhere: a value replaced, a key dropped or added, keys reordered. */
function mutate(req: Record<string, unknown>): void {
  const target = pick(nodes(req));
  const keys = Object.keys(target);
  const kind = rand(5);
  if (Array.isArray(target)) {
    if (kind === 0) target.length = 0;
    else if (target.length > 0) target[rand(target.length)] = structuredClone(pick(ODD_VALUES));
    return;
  }
  const obj = target as Record<string, unknown>;
  if (kind === 0 && keys.length > 0) delete obj[pick(keys)];
  else if (kind === 1) obj[pick(['extra', 'type', 'name', 'role', 'content', 'n', 'arguments', 'text', 'parameters', 'strict'])] = structuredClone(pick(ODD_VALUES));
  else if (kind === 2 && keys.length > 1) {
    // The same entries in another order.
    const entries = Object.entries(obj);
    for (const k of keys) delete obj[k];
    for (const [k, v] of entries.reverse()) obj[k] = v;
  } else if (keys.length > 0) obj[pick(keys)] = structuredClone(pick(ODD_VALUES));
}

describe('fastChatRequest', () => {
  it('answers only with the schema\'s own result, key order included, over thousands of generated bodies', () => {
    let fast = 0;
    let refused = 0;
    for (let i = 0; i < 6000; i++) {
      const req = baseRequest();
      const changes = rand(4); // 0: the plain request; more: one to three random changes
      for (let c = 0; c < changes; c++) mutate(req);
      const body = JSON.parse(JSON.stringify(req)) as unknown;
      const before = dump(body);
      const parsed = ChatCompletionRequest.safeParse(structuredClone(body));
      const out = fastChatRequest(body);
      expect(dump(body), 'the body itself is never changed').toBe(before);
      if (out !== null) {
        fast++;
        expect(parsed.success, before).toBe(true);
        expect(dump(out), before).toBe(dump(asParsed(parsed.data, body)));
      } else if (!parsed.success) refused++;
      // A deeply frozen body (how a session's remembered messages and tools arrive) gets the same
      // answer, the first time and from the kept answers of its parts.
      const frozen = deepFreeze(JSON.parse(JSON.stringify(req)) as unknown);
      for (let round = 0; round < 2; round++) {
        const again = fastChatRequest(frozen);
        expect(again === null, before).toBe(out === null);
        if (again !== null) expect(dump(again), before).toBe(dump(out));
      }
    }
    // Both kinds were generated: many bodies settled fast, many left to zod to refuse.
    expect(fast).toBeGreaterThan(1500);
    expect(refused).toBeGreaterThan(1500);
  });

  it('puts out what zod would: keys in the schema\'s order, a default filled in, stripped keys gone; leaves other content parts to zod', () => {
    const plain = baseRequest();
    expect(fastChatRequest(plain)).toBe(plain);
    const noType = baseRequest();
    delete ((noType.messages as Array<{ tool_calls?: Array<Record<string, unknown>> }>)[2]!.tool_calls![0]!).type;
    const reordered = baseRequest();
    (reordered.messages as unknown[])[0] = { content: 'You are careful.', extra: 1, role: 'system' };
    const stripped = baseRequest();
    (stripped.messages as Array<{ tool_calls?: Array<{ function: Record<string, unknown> }> }>)[2]!.tool_calls![0]!.function.extra = 1;
    for (const body of [noType, reordered, stripped]) {
      const out = fastChatRequest(body);
      expect(out).not.toBe(body);
      expect(dump(out)).toBe(dump(asParsed(ChatCompletionRequest.parse(body), body)));
    }
    expect(dump((fastChatRequest(reordered)!.messages as unknown[])[0])).toBe('{"role":"system","content":"You are careful.","extra":1}');
    const unknownFirst = baseRequest();
    (unknownFirst.messages as unknown[])[0] = { extra: 1, role: 'system', content: 'You are careful.' };
    expect(dump((fastChatRequest(unknownFirst)!.messages as unknown[])[0])).toBe('{"role":"system","content":"You are careful.","extra":1}');
    const image = baseRequest();
    (image.messages as unknown[])[1] = { role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] };
    expect(fastChatRequest(image)).toBeNull();
    expect(ChatCompletionRequest.safeParse(image).success).toBe(true);
  });

  it('answers valid tools as the client sent them, not in zod\'s key order: the template prints them, as Python prints the client\'s dicts', () => {
    const tools = [
      { type: 'function', function: { name: 'f', parameters: { type: 'object' }, description: 'd' } },
      { function: { strict: null, name: 'g', extra: 1 }, type: 'function', id: 'x' },
    ];
    expect(dump(ChatCompletionRequest.parse({ ...baseRequest(), tools }).tools)).not.toBe(dump(tools));
    const body = { ...baseRequest(), tools };
    expect(fastChatRequest(body)!.tools).toBe(tools);
    // A session's frozen tool list comes back as the same array, so the tokenizer's caches keyed by
    // identity keep finding it.
    const frozen = deepFreeze({ ...baseRequest(), tools: structuredClone(tools) });
    expect(fastChatRequest(frozen)!.tools).toBe(frozen.tools);
    expect(fastChatRequest(frozen)!.tools).toBe(frozen.tools);
    // So does zod's path (a message of an odd prototype, which only zod settles).
    const odd = { ...baseRequest(), tools, messages: [Object.assign(Object.create({ inherited: 1 }) as object, { role: 'user', content: 'hi' })] };
    expect(fastChatRequest(odd)).toBeNull();
    const parsed = parseChatRequest(odd);
    expect(parsed.ok && parsed.value.tools).toBe(tools);
  });

  it('agrees with the schema at the edges of every bound', () => {
    const tool = (name: string) => ({ type: 'function', function: { name } });
    const edges: Array<Record<string, unknown>> = [
      { temperature: 2 }, { temperature: 2.01 }, { temperature: 0 }, { temperature: -0.1 }, { top_p: 0 }, { top_p: 1 }, { top_p: 1.01 },
      { top_k: -1 }, { top_k: 1 }, { top_k: 0 }, { top_k: -2 }, { top_k: 2.5 }, { top_k: 2 ** 53 }, { top_k: null },
      { max_tokens: 1 }, { max_tokens: 0 }, { max_tokens: 1.5 }, { max_completion_tokens: 2 ** 53 }, { seed: -3 }, { n: 2 }, { n: null },
      { stop: ['a', 'b', 'c', 'd'] }, { stop: ['a', 'b', 'c', 'd', 'e'] }, { stop: '' }, { stop: [1] },
      { tools: [tool('a'.repeat(64))] }, { tools: [tool('a'.repeat(65))] }, { tools: [tool('')] }, { tools: [] }, { tools: null },
      { tool_choice: 'none' }, { tool_choice: 'any' }, { tool_choice: { type: 'function', function: { name: 'f', x: 1 } } },
      { stream_options: null }, { stream_options: { include_usage: 'yes' } }, { model: null }, { user: null }, { messages: [] },
      { messages: [{ role: 'assistant' }] }, { messages: [{ role: 'assistant', tool_calls: null }] }, { messages: [{ role: 'tool', content: 'x' }] },
      { messages: [{ role: 'user', content: [] }] }, { messages: [{ role: 'user', content: [{ type: 'text' }] }] }, { messages: [{ role: 'function', content: 'x' }] },
    ];
    for (const edge of edges) {
      const body = { ...baseRequest(), ...edge };
      const parsed = ChatCompletionRequest.safeParse(structuredClone(body));
      const out = fastChatRequest(body);
      if (out !== null) {
        expect(parsed.success, JSON.stringify(edge)).toBe(true);
        expect(dump(out), JSON.stringify(edge)).toBe(dump(asParsed(parsed.data, body)));
      }
    }
  });
});
