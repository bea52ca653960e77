import { backoffMs, isBusy, type LockWait } from './lock-wait.js';
import type { Histogram } from './types.js';

/**
 * Group commit: appends queue up and one transaction writes them all, so N concurrent receipts
 * cost one WAL sync instead of N. Each append's promise settles only after the transaction that
 * holds it has committed (or failed).
 */

export class HistogramCounter {
  private readonly buckets: number[];
  private sum = 0;
  private count = 0;

  constructor(private readonly bounds: readonly number[]) {
    this.buckets = new Array<number>(bounds.length).fill(0);
  }

  observe(value: number): void {
    this.sum += value;
    this.count += 1;
    const i = this.bounds.findIndex((b) => value <= b);
    if (i >= 0) this.buckets[i]! += 1;
  }

  snapshot(): Histogram {
    let running = 0;
    const counts = this.buckets.map((c) => (running += c));
    return { bounds: [...this.bounds], counts, sum: this.sum, count: this.count };
  }
}

export const COMMIT_MS_BOUNDS = [0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500];
export const BATCH_SIZE_BOUNDS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

export interface GroupCommitOptions<R = unknown> {
  /** Commit at once when this many appends are queued. @default 256 */
  maxBatch: number;
  /**
   * How long the first queued append waits for company before its commit. 0 commits on the next
   * turn of the event loop, after the I/O callbacks already due (which is when concurrent requests
   * enqueue), so batching happens without adding a timer's latency. @default 0
   */
  maxDelayMs: number;
  /** Called after each committed transaction (benchmarks, tracing). @default null */
  onCommit?: ((ms: number, records: number) => void) | null;
  /**
   * Whether another append may still join a lone queued one. When it answers false the append
   * commits at once: waiting a turn of the event loop for company that cannot come only delays
   * the receipt (~0.1 ms measured in the gateway, a quarter of its commit). The gateway answers
   * from its count of requests in flight. @default null (always wait a turn)
   */
  company?: (() => boolean) | null;
  /**
   * With `mode: 'async'`, a batch that finds the write lock held (SQLITE_BUSY; the store's
   * busy_timeout is then 0) waits for it on a timer and is tried again, appends that come
   * meanwhile joining it behind; an append still uncommitted `budgetMs` after it was queued is
   * rejected with `busyError`. @default null (a busy batch fails, as after SQLite's own busy wait)
   */
  lockWait?: (LockWait & { busyError: (item: R, waitedMs: number, cause: unknown) => unknown }) | null;
}

interface Waiter<R> {
  item: R;
  resolve: (offset: number) => void;
  reject: (err: unknown) => void;
  /** performance.now() when it was queued: its lock-wait budget runs from here. */
  since: number;
}

/**
 * Whether a failed transaction found the database locked by another process past the busy timeout.
 * That is no item's fault and each alone fails the same way, after holding the event loop for the
 * whole busy timeout again: retrying a batch of 256 one by one blocked the gateway for 256 × 5 s.
 * Other failures are retried item by item, and fail fast if they are not an item's (disk full).
 */
function failsEveryItem(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^SQLITE_(BUSY|LOCKED)/.test(code);
}

/** `write` runs the items in ONE transaction and returns their offsets, or throws (rolled back). */
export type BatchWriter<R> = (items: R[]) => number[];

export class GroupCommitter<R> {
  private queue: Waiter<R>[] = [];
  private timer: NodeJS.Immediate | NodeJS.Timeout | null = null;
  /** The next try of a batch that found the write lock held (`lockWait` async). */
  private retry: NodeJS.Timeout | null = null;
  /** Tries in a row that found the lock held: the backoff's exponent. */
  private busyTries = 0;
  private lockBusy = 0;
  private lastBusy: unknown = null;
  private idleWaiters: (() => void)[] = [];
  private commits = 0;
  private records = 0;
  private failed = 0;
  private readonly batchSize = new HistogramCounter(BATCH_SIZE_BOUNDS);
  private readonly commitMs = new HistogramCounter(COMMIT_MS_BOUNDS);

  constructor(
    private readonly write: BatchWriter<R>,
    private readonly options: GroupCommitOptions<R>,
  ) {}

  enqueue(item: R): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      this.queue.push({ item, resolve, reject, since: performance.now() });
      // While a batch waits for the lock, newcomers queue behind it and go with its next try.
      if (this.retry !== null) return;
      if (this.queue.length >= this.options.maxBatch || (this.queue.length === 1 && this.options.company?.() === false)) this.flush();
      else if (this.timer === null) {
        this.timer = this.options.maxDelayMs > 0 ? setTimeout(() => this.flush(), this.options.maxDelayMs) : setImmediate(() => this.flush());
      }
    });
  }

  /**
   * Commits everything queued, synchronously, unless the write lock is held and `lockWait` is
   * async: then what is left waits for the lock on a timer (`idle()` tells when it is done).
   */
  flush(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer as NodeJS.Timeout);
      clearImmediate(this.timer as NodeJS.Immediate);
      this.timer = null;
    }
    if (this.retry !== null) return;
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, this.options.maxBatch);
      const left = this.commitBatch(batch);
      if (left.length > 0) {
        // In queue order, ahead of newcomers: offsets keep following the order appends came in.
        this.queue.unshift(...left);
        this.waitForLock(this.lastBusy);
        return;
      }
    }
    this.busyTries = 0;
    this.settleIdle();
  }

  /** Resolves once nothing is queued or waiting for the lock (close() awaits it). */
  idle(): Promise<void> {
    if (this.queue.length === 0 && this.retry === null) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private settleIdle(): void {
    if (this.queue.length > 0 || this.retry !== null) return;
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  /** Commits `batch`; answers the waiters left unsettled because the lock was held (async lockWait). */
  private commitBatch(batch: Waiter<R>[]): Waiter<R>[] {
    const outcome = this.tryCommit(batch);
    if (outcome === 'busy') return batch;
    if (outcome === 'settled' || batch.length === 1) return [];
    // One bad record (a duplicate id, say) must not fail its neighbours: retry them one by one.
    // Another process may take the lock between two of them; those committed stay committed.
    for (let i = 0; i < batch.length; i++) if (this.tryCommit([batch[i]!]) === 'busy') return batch.slice(i);
    return [];
  }

  /**
   * Fails the queued appends whose budget is spent (a busy transaction failed at its BEGIN
   * IMMEDIATE and wrote nothing of theirs) and schedules the next try for the others.
   */
  private waitForLock(cause: unknown): void {
    const lock = this.options.lockWait!;
    const now = performance.now();
    const keep: Waiter<R>[] = [];
    for (const w of this.queue) {
      if (now - w.since < lock.budgetMs) keep.push(w);
      else {
        this.failed += 1;
        w.reject(lock.busyError(w.item, now - w.since, cause));
      }
    }
    this.queue = keep;
    if (keep.length === 0) {
      this.busyTries = 0;
      this.settleIdle();
      return;
    }
    this.busyTries += 1;
    // The queue's head is its oldest: no one waits past its budget for the next try.
    const ms = Math.min(backoffMs(lock, this.busyTries), lock.budgetMs - (now - keep[0]!.since));
    this.retry = setTimeout(() => {
      this.retry = null;
      this.flush();
    }, Math.max(0, ms));
  }

  /**
   * Settles the waiters when the transaction commits, or when it fails for all of them alike
   * ('settled'); leaves them pending when it fails in a group for what may be one item ('split'),
   * or when it found the write lock held and waits for it on a timer ('busy').
   */
  private tryCommit(batch: Waiter<R>[]): 'settled' | 'split' | 'busy' {
    const started = performance.now();
    let offsets: number[];
    try {
      offsets = this.write(batch.map((w) => w.item));
    } catch (err) {
      if (this.options.lockWait?.mode === 'async' && isBusy(err)) {
        this.lockBusy += 1;
        this.lastBusy = err;
        return 'busy';
      }
      if (batch.length === 1 || failsEveryItem(err)) {
        this.failed += batch.length;
        for (const w of batch) w.reject(err);
        return 'settled';
      }
      return 'split';
    }
    const ms = performance.now() - started;
    this.commitMs.observe(ms);
    this.batchSize.observe(batch.length);
    this.commits += 1;
    this.records += batch.length;
    this.options.onCommit?.(ms, batch.length);
    batch.forEach((w, i) => w.resolve(offsets[i]!));
    return 'settled';
  }

  /** Rejects an append that never reached the queue (a record that failed validation). */
  countRejected(): void {
    this.failed += 1;
  }

  get pending(): number {
    return this.queue.length;
  }

  snapshot() {
    return {
      commits: this.commits,
      records: this.records,
      failedAppends: this.failed,
      pending: this.queue.length,
      lockBusy: this.lockBusy,
      batchSize: this.batchSize.snapshot(),
      commitMs: this.commitMs.snapshot(),
    };
  }
}
