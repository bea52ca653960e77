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

export interface GroupCommitOptions {
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
}

interface Waiter<R> {
  item: R;
  resolve: (offset: number) => void;
  reject: (err: unknown) => void;
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
  private commits = 0;
  private records = 0;
  private failed = 0;
  private readonly batchSize = new HistogramCounter(BATCH_SIZE_BOUNDS);
  private readonly commitMs = new HistogramCounter(COMMIT_MS_BOUNDS);

  constructor(
    private readonly write: BatchWriter<R>,
    private readonly options: GroupCommitOptions,
  ) {}

  enqueue(item: R): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      this.queue.push({ item, resolve, reject });
      if (this.queue.length >= this.options.maxBatch || (this.queue.length === 1 && this.options.company?.() === false)) this.flush();
      else if (this.timer === null) {
        this.timer = this.options.maxDelayMs > 0 ? setTimeout(() => this.flush(), this.options.maxDelayMs) : setImmediate(() => this.flush());
      }
    });
  }

  /** Commits everything queued, synchronously. */
  flush(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer as NodeJS.Timeout);
      clearImmediate(this.timer as NodeJS.Immediate);
      this.timer = null;
    }
    const batch = this.queue;
    this.queue = [];
    if (batch.length === 0) return;
    if (this.tryCommit(batch)) return;
    // One bad record (a duplicate id, say) must not fail its neighbours: retry them one by one.
    if (batch.length > 1) for (const w of batch) this.tryCommit([w]);
  }

  /**
   * Settles the waiters when the transaction commits, or when it fails for all of them alike, and
   * answers true; leaves them pending when it fails in a group for what may be one item.
   */
  private tryCommit(batch: Waiter<R>[]): boolean {
    const started = performance.now();
    let offsets: number[];
    try {
      offsets = this.write(batch.map((w) => w.item));
    } catch (err) {
      if (batch.length === 1 || failsEveryItem(err)) {
        this.failed += batch.length;
        for (const w of batch) w.reject(err);
        return true;
      }
      return false;
    }
    const ms = performance.now() - started;
    this.commitMs.observe(ms);
    this.batchSize.observe(batch.length);
    this.commits += 1;
    this.records += batch.length;
    this.options.onCommit?.(ms, batch.length);
    batch.forEach((w, i) => w.resolve(offsets[i]!));
    return true;
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
      batchSize: this.batchSize.snapshot(),
      commitMs: this.commitMs.snapshot(),
    };
  }
}
