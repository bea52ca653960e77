import { ReefError } from '../runtime/errors.js';
import { RpcClient } from '../runtime/rpc.js';

/**
 * How long the gateway waits for the trainer-controller to finish a rollback. A rollback takes its
 * turn after the batch being trained (a step of up to 10 minutes on a real model), so it can
 * outlast this; HTTP clients rarely wait longer (undici's default is 300 s for the headers).
 */
export const ROLLBACK_RPC_TIMEOUT_MS = 300_000;

/**
 * Asks the trainer-controller at `mailbox` for a rollback and returns its reply. Running out of
 * time does not cancel the rollback, so that error is not retryable and says what to check: a
 * resent rollback without `release_id` would be resolved again, one release further back, or
 * forward to the release just undone once the first is through.
 */
export async function callRollback(mailbox: string, scenario: string, releaseId: string | null, keyId: string | null, timeoutMs = ROLLBACK_RPC_TIMEOUT_MS): Promise<Record<string, unknown>> {
  const rpc = new RpcClient(mailbox, { name: 'gateway→trainer-controller', defaultTimeoutMs: timeoutMs });
  try {
    const { type: _t, requestId: _r, ...reply } = (await rpc.call({ type: 'rollback', scenario, releaseId, keyId })) as Record<string, unknown>;
    return reply;
  } catch (err) {
    if (!(err instanceof ReefError) || err.code !== 'REEF_ERR_TIMEOUT') throw err;
    const pending = new ReefError('REEF_ERR_TIMEOUT', {}, {
      cause: err,
      message:
        `the trainer-controller did not finish the rollback within ${Math.round(timeoutMs / 1000)} s; it takes its turn after the batch being trained and may still go ahead. ` +
        `Check GET /reef/scenarios/${scenario}/releases before asking again: a second rollback without release_id would go one release further back, or forward again once the first is done`,
    });
    (pending as { retryable: boolean }).retryable = false;
    throw pending;
  } finally {
    await rpc.close();
  }
}
