import type { AgentRecord, NewRecord } from './types.js';
import { prng } from '../../runtime/prng.js';

/**
 * Deterministic sample records for tests, the durability child and the benchmark: every field is
 * a function of `seed`, so a reader can rebuild what a writer stored and compare it exactly.
 */

export interface SampleOptions {
  /** @default 'default' */
  scenario?: string;
  /** @default 'k1d0e5f7' */
  keyId?: string | null;
  /** @default 24 */
  promptTokens?: number;
  /** @default 16 */
  outputTokens?: number;
  /** @default 4 */
  topK?: number;
}


export function sampleRecord(seed: number, options: SampleOptions = {}): NewRecord {
  const rand = prng(seed);
  const p = options.promptTokens ?? 24;
  const n = options.outputTokens ?? 16;
  const k = options.topK ?? 4;
  const ids = (len: number) => Int32Array.from({ length: len }, () => Math.floor(rand() * 150_000));
  const lps = (len: number) => Float32Array.from({ length: len }, () => -rand() * 12);
  const topkLogprobs = lps(n * k);
  // A masked candidate is -Infinity; it must round-trip bit for bit like any other value.
  if (topkLogprobs.length > 1) topkLogprobs[topkLogprobs.length - 1] = -Infinity;
  const startedAt = 1_700_000_000_000 + seed * 1000;
  return {
    scenario: options.scenario ?? 'default',
    keyId: options.keyId === undefined ? 'k1d0e5f7' : options.keyId,
    tags: { session: `s-${seed % 7}`, seed: String(seed) },
    status: 'ok',
    startedAt,
    finishedAt: startedAt + 250,
    request: {
      messages: [{ role: 'user', content: `question ${seed} — ünïcödé ✓` }],
      tools: seed % 2 === 0 ? null : [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object' } } }],
      params: { temperature: 0.7, max_tokens: n },
    },
    promptIds: ids(p),
    outputIds: ids(n),
    logprobs: lps(n),
    topK: k,
    topkIds: ids(n * k),
    topkLogprobs,
    finishReason: 'stop',
    usage: { promptTokens: p, completionTokens: n },
    weightVersion: seed % 3 === 0 ? null : `v${seed % 5}`,
    engine: 'hf-0',
    latencyMs: 250.5,
    error: null,
    response: { role: 'assistant', content: `answer ${seed}`, tool_calls: null },
  };
}

const bytesOf = (a: Int32Array | Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

/** Names of the fields where `stored` differs from `expected` (token arrays compared byte for byte). */
export function recordDiff(stored: AgentRecord, expected: NewRecord): string[] {
  const bad: string[] = [];
  for (const key of Object.keys(expected) as (keyof NewRecord)[]) {
    const want = expected[key];
    const got = stored[key as keyof AgentRecord];
    if (want instanceof Int32Array || want instanceof Float32Array) {
      const same = got?.constructor === want.constructor && bytesOf(got as typeof want).equals(bytesOf(want));
      if (!same) bad.push(key);
    } else if (JSON.stringify(got) !== JSON.stringify(want)) {
      bad.push(key);
    }
  }
  return bad;
}
