import { closeSync, fsyncSync, openSync, writeSync } from 'node:fs';
import { type Rand, seeded } from '../../test/helpers/seeded.js';

/**
 * The soak's client: concurrent tagged sessions through the gateway, streamed and not, each
 * receipt appended to a log and fsynced before the next request, so the log holds only receipts
 * the client really got, and all of them, whatever is killed meanwhile.
 */

/** Follow-ups the rule PRM double judges ±1 with a hint or as accepted, so most turns train. */
const FOLLOW_UPS = ['Please redo that without bold.', 'That is wrong, check it again.', 'Thanks, that looks good.'];
const OPENERS = ['What is 12 + 7?', 'Explain what a prime number is.', 'How many days are in a leap year?', 'What is 9 times 8?', 'Tell me about the sea.'];

export interface LoadOptions {
  gateway: string;
  sessions: number;
  receiptLog: string;
  seed: number;
  /** @default 12 */
  maxTokens?: number;
  /** The share of requests sent streamed (0–1). @default 0.5 */
  streamed?: number;
  log: (line: string) => void;
}

export interface LoadCounts {
  receipts: number;
  streamed: number;
  /** Requests that got no receipt (gateway down, reset, 5xx), each retried. */
  failures: number;
  conversations: number;
}

export class ReceiptLog {
  private readonly fd: number;

  constructor(path: string) {
    this.fd = openSync(path, 'a', 0o600);
  }

  /** One line, on disk before it returns: the log must outlive anything the soak kills. */
  append(entry: { id: string; session: string; stream: boolean; at: number }): void {
    writeSync(this.fd, `${JSON.stringify(entry)}\n`);
    fsyncSync(this.fd);
  }

  close(): void {
    closeSync(this.fd);
  }
}

type Message = { role: string; content: string };

/** One chat turn; its receipt and reply, or throws (no receipt). */
async function chat(gateway: string, session: string, messages: Message[], stream: boolean, maxTokens: number, cut: AbortSignal): Promise<{ id: string; content: string }> {
  // A signal of this request's own, tied to `cut` only while it runs: given `cut` itself, fetch
  // left a listener on it for each request that failed (thousands in a soak of 64 clients).
  const own = new AbortController();
  const abort = () => own.abort(cut.reason);
  if (cut.aborted) abort();
  else cut.addEventListener('abort', abort, { once: true });
  try {
    return await chatOnce(gateway, session, messages, stream, maxTokens, own.signal);
  } finally {
    cut.removeEventListener('abort', abort);
  }
}

async function chatOnce(gateway: string, session: string, messages: Message[], stream: boolean, maxTokens: number, signal: AbortSignal): Promise<{ id: string; content: string }> {
  const res = await fetch(`${gateway}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-reef-tag-session': session },
    body: JSON.stringify({ messages, max_tokens: maxTokens, temperature: 1.0, stream }),
    signal,
  });
  if (res.status !== 200) throw new Error(`status ${res.status}: ${(await res.text()).slice(0, 200)}`);
  if (!stream) {
    const body = (await res.json()) as { choices: Array<{ message: { content: string | null } }> };
    const id = res.headers.get('x-reef-agent-record-id');
    if (!id) throw new Error('no receipt header');
    return { id, content: body.choices[0]?.message.content ?? '' };
  }
  // The receipt chunk comes after the record committed and before [DONE]; a stream cut before it
  // holds no receipt, whatever text came.
  const text = await res.text();
  let id: string | null = null;
  let content = '';
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
    const chunk = JSON.parse(line.slice(6)) as { choices?: Array<{ delta?: { content?: string | null } }>; reef?: { agent_record_id?: string } };
    content += chunk.choices?.[0]?.delta?.content ?? '';
    if (chunk.reef?.agent_record_id) id = chunk.reef.agent_record_id;
  }
  if (id === null) throw new Error('stream ended without a receipt');
  return { id, content };
}

async function session(o: LoadOptions, worker: number, rand: Rand, receipts: ReceiptLog, counts: LoadCounts, stop: AbortSignal, cut: AbortSignal): Promise<void> {
  for (let conv = 0; !stop.aborted; conv++) {
    const tag = `soak-${o.seed}-${worker}-${conv}`;
    const messages: Message[] = [{ role: 'system', content: 'You help with homework.' }, { role: 'user', content: OPENERS[Math.floor(rand() * OPENERS.length)]! }];
    counts.conversations++;
    for (let turn = 0; turn <= FOLLOW_UPS.length && !stop.aborted; ) {
      const stream = rand() < (o.streamed ?? 0.5);
      try {
        const r = await chat(o.gateway, tag, messages, stream, o.maxTokens ?? 12, cut);
        receipts.append({ id: r.id, session: tag, stream, at: Date.now() });
        counts.receipts++;
        if (stream) counts.streamed++;
        if (turn < FOLLOW_UPS.length) messages.push({ role: 'assistant', content: r.content }, { role: 'user', content: FOLLOW_UPS[turn]! });
        turn++;
        // A user's pause: without it four sessions outran training on the tiny model several times
        // over, and the drain at the end took longer than the soak.
        await new Promise((r) => setTimeout(r, 500 + rand() * 1000));
      } catch (err) {
        if (stop.aborted) return;
        counts.failures++;
        // The same request again once the gateway is back: the session goes on where it was.
        if (counts.failures % 50 === 1) o.log(`request failed (${counts.failures} so far, retried): ${(err as Error).message}`);
        await new Promise((r) => setTimeout(r, 500 + rand() * 1000));
      }
    }
  }
}

/**
 * Runs `o.sessions` sessions until `stop` aborts, each finishing the request it has in flight
 * (its receipt is logged); `cut` aborts those requests too. Resolves once every session stopped.
 */
export async function runLoad(o: LoadOptions, stop: AbortSignal, cut: AbortSignal, counts: LoadCounts): Promise<void> {
  const receipts = new ReceiptLog(o.receiptLog);
  try {
    await Promise.all(Array.from({ length: o.sessions }, (_, w) => session(o, w, seeded(o.seed * 7919 + w + 1), receipts, counts, stop, cut)));
  } finally {
    receipts.close();
  }
}
