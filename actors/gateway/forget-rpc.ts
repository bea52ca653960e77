import { ReefError } from '../runtime/errors.js';
import { RpcClient } from '../runtime/rpc.js';

/**
 * Deletion on request (store/deletion.ts) asks the actors that hold turns in memory to drop them:
 * the judge (pending judgments) and the trainer-controller (unbatched tasks, untrained batches).
 * The controller answers after the batch being trained, as for a rollback, hence the long wait.
 */
export const FORGET_RPC_TIMEOUT_MS = 300_000;

/** What each actor dropped; null for one not running in this stack (nothing of it is in memory). */
export interface Forgotten {
  judge: number | null;
  trainerController: number | null;
}

/**
 * Calls `forget-records` on each actor whose mailbox `lookup` finds. An actor that is running but
 * does not answer fails the call (REEF_ERR_TIMEOUT, retryable): the deletion's intent stays, and
 * asking again (or the gateway's next start) finishes it.
 */
export async function callForget(lookup: (actor: string) => Promise<string | null>, recordIds: string[], timeoutMs = FORGET_RPC_TIMEOUT_MS): Promise<Forgotten> {
  const ask = async (actor: string): Promise<number | null> => {
    const mailbox = await lookup(actor);
    if (mailbox === null) return null;
    const rpc = new RpcClient(mailbox, { name: `gateway→${actor} forget`, defaultTimeoutMs: timeoutMs });
    try {
      const reply = (await rpc.call({ type: 'forget-records', recordIds })) as { dropped?: unknown };
      if (typeof reply.dropped !== 'number') throw new ReefError('REEF_ERR_HANDLER', { messageType: 'forget-records', reason: `${actor} answered without a count` });
      return reply.dropped;
    } finally {
      await rpc.close();
    }
  };
  const [judge, trainerController] = await Promise.all([ask('judge'), ask('trainer-controller')]);
  return { judge, trainerController };
}

/**
 * Finishes, in the background, the deletions an earlier run left unfinished (store
 * `resumeDeletions`): soon after start, since the judge and the trainer-controller may start after
 * the gateway, and again every `everyMs` while one fails. Answers a stop function.
 */
export function resumeDeletionsLater(
  store: { resumeDeletions(forget: (ids: string[]) => Promise<void>): Promise<number> },
  forget: ((ids: string[]) => Promise<unknown>) | null,
  log: (line: string) => void,
  everyMs = 30_000,
): () => void {
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  const run = async () => {
    try {
      const n = await store.resumeDeletions(async (ids) => void (await forget?.(ids)));
      if (n > 0) log(`deletion on request: finished ${n} deletion(s) an earlier run left unfinished`);
    } catch (err) {
      if (stopped) return;
      log(`deletion on request: an unfinished deletion could not be finished yet (${(err as Error).message}); trying again in ${Math.round(everyMs / 1000)} s`);
      timer = setTimeout(() => void run(), everyMs);
      timer.unref();
    }
  };
  timer = setTimeout(() => void run(), Math.min(everyMs, 5_000));
  timer.unref();
  return () => {
    stopped = true;
    if (timer !== null) clearTimeout(timer);
  };
}
