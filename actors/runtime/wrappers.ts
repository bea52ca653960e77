import { ReefError } from './errors.js';
import type { LogFn } from './log.js';

/**
 * Cross-cutting behaviour as wrappers around any async function — a mailbox handler
 * `(msg, ctx) => reply` or an RPC call `(msg) => rpc.call(msg)` — composed at wiring time
 * (STYLE.md §7) so that handlers hold only their own logic.
 */
export type AsyncFn<A extends unknown[], R> = (...args: A) => Promise<R>;

export interface TimeoutOptions {
  ms: number;
  /** Named in the REEF_ERR_TIMEOUT message. */
  what: string;
}

/** Reject with REEF_ERR_TIMEOUT after `ms`. The wrapped work is not cancelled, only no longer awaited. */
export function withTimeout<A extends unknown[], R>(fn: (...args: A) => Promise<R> | R, options: TimeoutOptions): AsyncFn<A, R> {
  return (...args) =>
    new Promise<R>((resolve, reject) => {
      const timer = setTimeout(() => reject(new ReefError('REEF_ERR_TIMEOUT', { what: options.what, ms: options.ms })), options.ms);
      Promise.resolve()
        .then(() => fn(...args))
        .then(resolve, reject)
        .finally(() => clearTimeout(timer));
    });
}

export interface RetryOptions {
  /** Tries in all, the first included. @default 3 */
  attempts?: number;
  /** Delay before the first retry, doubled each time. @default 50 */
  baseMs?: number;
  /** @default 2000 */
  maxMs?: number;
  /** @default a ReefError whose `retryable` is true */
  retryable?: (err: unknown) => boolean;
  /** Called before each retry (for logs and tests). */
  onRetry?: (err: unknown, attempt: number, delayMs: number) => void;
}

export const isRetryable = (err: unknown): boolean => err instanceof ReefError && err.retryable;

/** Retry only what is marked retryable, with doubling backoff; the last error is rethrown. */
export function withRetry<A extends unknown[], R>(fn: (...args: A) => Promise<R> | R, options: RetryOptions = {}): AsyncFn<A, R> {
  const attempts = options.attempts ?? 3;
  const retryable = options.retryable ?? isRetryable;
  return async (...args) => {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn(...args);
      } catch (err) {
        if (attempt >= attempts || !retryable(err)) throw err;
        const delayMs = Math.min((options.baseMs ?? 50) * 2 ** (attempt - 1), options.maxMs ?? 2000);
        options.onRetry?.(err, attempt, delayMs);
        await new Promise((resolve) => setTimeout(resolve, delayMs));
      }
    }
  };
}

export interface DedupeOptions<A extends unknown[]> {
  /** The idempotency key of a call; null = never deduplicated. */
  key: (...args: A) => string | null;
  /** How long a settled result is replayed. @default 60000 */
  ttlMs?: number;
  /** Keys remembered at most (oldest forgotten first). @default 10000 */
  maxKeys?: number;
}

/**
 * Calls with the same key share one execution: concurrent duplicates await the first, later ones
 * get its result for `ttlMs`. Failures are not remembered, so a retry runs again.
 */
export function withDedupe<A extends unknown[], R>(fn: (...args: A) => Promise<R> | R, options: DedupeOptions<A>): AsyncFn<A, R> {
  const seen = new Map<string, { result: Promise<R>; expires: number }>();
  return (...args) => {
    const key = options.key(...args);
    if (key === null) return Promise.resolve().then(() => fn(...args));
    const now = Date.now();
    const hit = seen.get(key);
    if (hit !== undefined && hit.expires > now) return hit.result;
    const result = Promise.resolve().then(() => fn(...args));
    seen.set(key, { result, expires: Number.POSITIVE_INFINITY });
    // Only while the entry is still this call's: once evicted by maxKeys, a later call with the
    // same key owns it, and this call failing must not make that one's duplicates run again.
    const own = (): boolean => seen.get(key)?.result === result;
    result.then(
      () => own() && seen.set(key, { result, expires: Date.now() + (options.ttlMs ?? 60_000) }),
      () => own() && seen.delete(key),
    );
    if (seen.size > (options.maxKeys ?? 10_000)) seen.delete(seen.keys().next().value as string);
    return result;
  };
}

export interface TracingOptions {
  name: string;
  log: LogFn;
  /** Only calls at least this slow are logged (0 = all). @default 0 */
  slowMs?: number;
}

/** Log each call's duration and outcome (`name ok 12.3 ms` / `name failed REEF_ERR_TIMEOUT 5000.1 ms`). */
export function withTracing<A extends unknown[], R>(fn: (...args: A) => Promise<R> | R, options: TracingOptions): AsyncFn<A, R> {
  return async (...args) => {
    const start = performance.now();
    const done = (outcome: string): void => {
      const ms = performance.now() - start;
      if (ms >= (options.slowMs ?? 0)) options.log(`${options.name} ${outcome} ${ms.toFixed(1)} ms`);
    };
    try {
      const result = await fn(...args);
      done('ok');
      return result;
    } catch (err) {
      done(`failed ${err instanceof ReefError ? err.code : err instanceof Error ? err.name : 'error'}`);
      throw err;
    }
  };
}
