/**
 * Bounded polling for tests: wait for a condition instead of asserting on timing. Every wait names
 * what it waits for, so a failure says which condition never became true.
 */
export interface WaitOptions {
  /** What is awaited, used in the error. */
  what: string;
  /** @default 10000 */
  timeoutMs?: number;
  /** @default 25 */
  intervalMs?: number;
}

/**
 * Resolve with the first truthy value of `cond()` (sync or async); throw after `timeoutMs`.
 * An exception thrown by `cond` counts as "not yet" and is reported if the wait times out.
 */
export async function waitFor<T>(cond: () => T | Promise<T>, options: WaitOptions): Promise<NonNullable<T>> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown = null;
  for (;;) {
    try {
      const value = await cond();
      if (value) return value as NonNullable<T>;
      lastError = null;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() >= deadline) {
      const why = lastError === null ? '' : ` (last error: ${lastError instanceof Error ? lastError.message : String(lastError)})`;
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${options.what}${why}`);
    }
    await new Promise((resolve) => setTimeout(resolve, options.intervalMs ?? 25));
  }
}

/** True while a process with this pid exists (one definition, shared with the CLI). */
export { pidAlive } from '../../cluster/run-file.js';
