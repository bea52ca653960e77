import { ReefError } from '../runtime/errors.js';

/**
 * Brackets a weight swap: `pause()` stops admitting new generations and waits (bounded) for those
 * in flight to finish; `resume()` lets the waiting ones through. New requests wait instead of
 * failing, up to `admitTimeoutMs`, after which they get a retryable 503.
 */
/**
 * How long a pause lasts when its caller names no bound: longer than any weight swap should take
 * (drain, push and load each bounded by minutes), short enough that a trainer-controller that died
 * mid-swap does not stop the gateway for good.
 */
export const DEFAULT_MAX_PAUSE_MS = 15 * 60_000;

export class GenerationGate {
  private inflightCount = 0;
  private paused = false;
  private lease: NodeJS.Timeout | null = null;
  private waiters: Array<{ wake: () => void; refuse: (err: Error) => void }> = [];
  private closed = false;
  private drained: Array<() => void> = [];
  private version: string | null;

  /** @param onLeaseExpired told when a pause outlived its bound and the gate resumed by itself */
  constructor(
    initialWeightVersion: string | null,
    private readonly admitTimeoutMs = 60_000,
    private readonly onLeaseExpired: ((maxPauseMs: number) => void) | null = null,
  ) {
    this.version = initialWeightVersion;
  }

  get inflight(): number {
    return this.inflightCount;
  }

  get isPaused(): boolean {
    return this.paused;
  }

  get weightVersion(): string | null {
    return this.version;
  }

  /** Waits until generation is allowed, then counts the caller as in flight. Call `leave()` after. */
  async enter(signal?: AbortSignal): Promise<void> {
    if (!this.paused) {
      this.inflightCount++;
      return;
    }
    // A signal that has already fired never fires again: its client would wait out the pause.
    if (signal?.aborted) throw signal.reason;
    if (this.closed) throw draining();
    await new Promise<void>((resolve, reject) => {
      const refuse = (err: Error) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(err);
      };
      const onAbort = () => refuse(signal!.reason as Error);
      const timer = setTimeout(() => refuse(new ReefError('REEF_ERR_ENGINE_DOWN', { engine: 'rollout', reason: `weights are being updated; waited ${this.admitTimeoutMs} ms` })), this.admitTimeoutMs);
      // Counted here, as resume() lets it through, not a turn later when the await returns: a
      // pause() right after that resume would otherwise find nothing in flight and not wait for it.
      const wake = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.inflightCount++;
        resolve();
      };
      const waiter = { wake, refuse };
      this.waiters.push(waiter);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /**
   * The gateway is closing: requests waiting for a resume are refused with a retryable 503 now, as
   * are any that arrive while paused. Held until the admission bound, they kept the server's close
   * (which waits for every request) from finishing, past the time a supervisor gives it to stop.
   */
  close(): void {
    this.closed = true;
    if (this.lease !== null) {
      clearTimeout(this.lease);
      this.lease = null;
    }
    for (const w of [...this.waiters]) w.refuse(draining());
  }

  leave(): void {
    this.inflightCount--;
    if (this.inflightCount === 0) {
      const d = this.drained;
      this.drained = [];
      for (const fn of d) fn();
    }
  }

  /**
   * Stops admitting and waits for in-flight generations; resolves with how many were still running
   * at the deadline. Admission comes back with `resume()`, or by itself after `maxPauseMs` (weight
   * version unchanged), so that a caller that dies before its resume leaves no gateway paused.
   */
  async pause(drainTimeoutMs: number, maxPauseMs = DEFAULT_MAX_PAUSE_MS): Promise<{ drained: boolean; inflight: number }> {
    this.paused = true;
    if (this.lease !== null) clearTimeout(this.lease);
    this.lease = setTimeout(() => {
      this.lease = null;
      this.resume(null);
      this.onLeaseExpired?.(maxPauseMs);
    }, maxPauseMs);
    // A lease must not keep a gateway that is shutting down alive.
    this.lease.unref();
    if (this.inflightCount === 0) return { drained: true, inflight: 0 };
    const ok = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), drainTimeoutMs);
      this.drained.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
    return { drained: ok, inflight: this.inflightCount };
  }

  resume(weightVersion: string | null): void {
    if (weightVersion !== null) this.version = weightVersion;
    this.paused = false;
    if (this.lease !== null) {
      clearTimeout(this.lease);
      this.lease = null;
    }
    const w = this.waiters;
    this.waiters = [];
    for (const { wake } of w) wake();
  }
}

function draining(): ReefError {
  return new ReefError('REEF_ERR_ACTOR_DRAINING', { actor: 'gateway' });
}
