import { ReefError } from '../../runtime/errors.js';

/**
 * How a write waits for SQLite's write lock while another process holds it (the judge or the
 * trainer-controller committing its state, security review M1).
 *
 * - `'block'`: SQLite's busy handler (`busy_timeout`) sleeps on the calling thread. For a process
 *   that serves nobody while it waits, that is the simplest correct wait.
 * - `'async'`: `busy_timeout` is 0, so a write that finds the lock held fails at once; every write
 *   starts with `BEGIN IMMEDIATE` (or is one statement), so it fails at its start, before it wrote
 *   anything, and is tried again from a timer with backoff while the event loop serves everyone
 *   else. The gateway waits this way: a blocked loop stops every stream it is serving.
 */
export type LockWaitMode = 'block' | 'async';

export interface LockWait {
  readonly mode: LockWaitMode;
  /** Longest a write waits for the lock, from when it was asked for. */
  readonly budgetMs: number;
  /** What sets `budgetMs`, for the error's message. */
  readonly setting: string;
  /** First pause between tries (`'async'`), doubling up to `maxMs`. */
  readonly firstMs: number;
  readonly maxMs: number;
}

/** SQLITE_BUSY and its extended codes: another connection holds a lock this write needs. */
export function isBusy(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && code.startsWith('SQLITE_BUSY');
}

/** The error a write gets once its budget is spent: retryable, and nothing of it was written. */
export function lockBusyError(wait: LockWait, path: string, what: string, waitedMs: number, cause: unknown): ReefError {
  return new ReefError('REEF_ERR_STORE_BUSY', { path, what, waitedMs: Math.round(waitedMs), setting: wait.setting }, { cause });
}

/** The pause before try `n + 1` (n ≥ 1) after `n` found the lock held. */
export function backoffMs(wait: LockWait, n: number): number {
  return Math.min(wait.maxMs, wait.firstMs * 2 ** Math.min(n - 1, 30));
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Runs `attempt` (one transaction, or one statement) and, in `'async'` mode, tries it again while
 * it fails with SQLITE_BUSY, until `wait.budgetMs` is spent; then REEF_ERR_STORE_BUSY naming
 * `what`. A busy attempt wrote nothing, so trying again cannot write anything twice.
 */
export async function withWriteLock<T>(wait: LockWait, path: string, what: string, attempt: () => T): Promise<T> {
  if (wait.mode === 'block') return attempt();
  const started = performance.now();
  for (let n = 1; ; n++) {
    try {
      return attempt();
    } catch (err) {
      if (!isBusy(err)) throw err;
      const waited = performance.now() - started;
      if (waited >= wait.budgetMs) throw lockBusyError(wait, path, what, waited, err);
      await sleep(Math.min(backoffMs(wait, n), wait.budgetMs - waited));
    }
  }
}
