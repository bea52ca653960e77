import { randomBytes } from 'node:crypto';
import { renderPrompt, scoreKindOf, type PromptKind } from '../../recipes/openclawrl/judge/prompts.js';
import type { CallResult } from '../../recipes/openclawrl/judge/votes.js';
import { ReefError } from '../runtime/errors.js';
import type { JudgeTurn } from '../judge/messages.js';
import type { PrmCaller } from './prm-client.js';

/** Bounds the PRM calls in flight across all turns of one actor (`prm_concurrency`). */
export class Semaphore {
  private free: number;
  private readonly queue: (() => void)[] = [];

  constructor(readonly size: number) {
    this.free = size;
  }

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.free > 0) this.free--;
    else await new Promise<void>((resolve) => this.queue.push(resolve));
    try {
      return await fn();
    } finally {
      const next = this.queue.shift();
      if (next !== undefined) next();
      else this.free++;
    }
  }
}

export interface TurnVotes {
  scoreCalls: CallResult[];
  hintCalls: CallResult[];
  url: string;
  /** No call got a reply, each for want of a reachable PRM: the turn was not judged at all. */
  unreachable: boolean;
}

/** This process's mark in the rids it sends. */
const CALLER = randomBytes(4).toString('hex');

/**
 * `m` score calls and `m` hint calls for one turn, all started at once and admitted by the
 * semaphore. A call that fails or times out is a failed vote (its error is kept), not a failed turn,
 * unless no call reached the PRM at all (`unreachable`).
 */
export async function voteTurn(turn: JudgeTurn, prm: PrmCaller, m: number, limit: Semaphore, signal: AbortSignal, attempt = 1): Promise<TurnVotes> {
  // A try's calls get rids of their own: the engine may still hold a timed-out call of the last
  // try, and SGLang keys its requests, and the abort it sends once it sees that caller gone, by rid.
  // And rids of this process: a lease that ran out goes to another PRM actor while this one's
  // calls may still be held by the engine, whose abort of them would reach the same rids there.
  const tail = `${attempt === 1 ? '' : `-try${attempt}`}.${CALLER}`;
  let url = '';
  let down = 0;
  const one = async (kind: PromptKind, i: number): Promise<CallResult> => {
    const prompt = renderPrompt(kind, turn);
    try {
      const reply = await limit.run(() => {
        if (signal.aborted) throw new ReefError('REEF_ERR_ACTOR_DRAINING', { actor: 'prm' });
        return prm.call(prompt, { rid: `${turn.turnRecordId}-${kind}-${i}${tail}`, signal });
      });
      url = reply.url;
      return { output: reply.text, error: null };
    } catch (err) {
      if (err instanceof ReefError && err.code === 'REEF_ERR_ENGINE_DOWN') down++;
      const code = err instanceof ReefError ? `${err.code}: ` : '';
      return { output: null, error: `${code}${err instanceof Error ? err.message : String(err)}` };
    }
  };
  const idx = Array.from({ length: m }, (_, i) => i);
  // An agent step's score votes ask whether the step advanced the task with a valid tool call.
  const scoreKind = scoreKindOf(turn);
  const [scoreCalls, hintCalls] = await Promise.all([Promise.all(idx.map((i) => one(scoreKind, i))), Promise.all(idx.map((i) => one('hint', i)))]);
  return { scoreCalls, hintCalls, url, unreachable: down === 2 * m };
}
