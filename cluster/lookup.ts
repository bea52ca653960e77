import type { LogFn } from '../actors/runtime/log.js';
import { RpcClient } from '../actors/runtime/rpc.js';
import { lookupReply } from './supervisor-messages.js';

/**
 * The mailbox of an instance of `actor`, found through the supervisor's `lookup`; null when no
 * instance has one (or, with `running`, when none is running). Actors call this again after a
 * failed call, since a restarted actor binds a new port.
 */
export async function lookupMailbox(supervisor: string, actor: string, opts: { running?: boolean; timeoutMs?: number; log?: LogFn } = {}): Promise<string | null> {
  const sup = new RpcClient(supervisor, { name: `lookup ${actor}`, defaultTimeoutMs: opts.timeoutMs ?? 5_000, ...(opts.log ? { log: opts.log } : {}) });
  try {
    const { instances } = await sup.call({ type: 'lookup', actor }, { schema: lookupReply });
    return instances.find((i) => i.mailbox !== null && (!opts.running || i.state === 'running'))?.mailbox ?? null;
  } finally {
    await sup.close();
  }
}
