import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import type { NewRecord } from '../../actors/gateway/store/types.js';

/**
 * Agent traffic for judge tests: tagged conversations whose requests resend the growing
 * transcript, as a harness does. Request i of a conversation carries the user's reaction to reply
 * i-1, so a conversation of n requests finishes n-1 turns.
 */

export type Message = { role: string; content: string };

/** What the user says after reply `i` of conversation `c`: alternately accepting and complaining. */
export function reaction(c: number, i: number): string {
  return i % 2 === 0 ? `Thanks, that works. Next question ${c}.${i + 1}?` : `No, redo it without the bullet list (${c}.${i + 1}).`;
}

export const replyText = (c: number, i: number): string => `Answer ${c}.${i}: here is what you asked for.`;

/** The records of conversation `c` with `n` requests, in order. */
export function conversation(c: number, n: number, opts: { session?: string | null; at?: number } = {}): NewRecord[] {
  const out: NewRecord[] = [];
  const messages: Message[] = [{ role: 'system', content: 'You are a helpful assistant.' }, { role: 'user', content: `Question ${c}.0?` }];
  for (let i = 0; i < n; i++) {
    const base = sampleRecord(c * 1000 + i, { promptTokens: 8, outputTokens: 4, topK: 2 });
    const at = (opts.at ?? Date.now()) + i;
    const session = opts.session === undefined ? `conv-${c}` : opts.session;
    out.push({
      ...base,
      tags: session === null ? {} : { session },
      startedAt: at - 5,
      finishedAt: at,
      request: { messages: messages.map((m) => ({ ...m })), tools: null, params: {} },
      response: { role: 'assistant', content: replyText(c, i), tool_calls: null },
    });
    messages.push({ role: 'assistant', content: replyText(c, i) }, { role: 'user', content: reaction(c, i) });
  }
  return out;
}

/** Interleave conversations request by request (concurrent users). */
export function interleave(convs: NewRecord[][]): NewRecord[] {
  const out: NewRecord[] = [];
  for (let i = 0; convs.some((c) => i < c.length); i++) for (const c of convs) if (i < c.length) out.push(c[i]!);
  return out;
}
