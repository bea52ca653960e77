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
  private waiters: Array<() => void> = [];
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
    await new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        clearTimeout(timer);
        this.waiters = this.waiters.filter((w) => w !== wake);
        reject(signal!.reason);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort);
        this.waiters = this.waiters.filter((w) => w !== wake);
        reject(new ReefError('REEF_ERR_ENGINE_DOWN', { engine: 'rollout', reason: `weights are being updated; waited ${this.admitTimeoutMs} ms` }));
      }, this.admitTimeoutMs);
      // Counted here, as resume() lets it through, not a turn later when the await returns: a
      // pause() right after that resume would otherwise find nothing in flight and not wait for it.
      const wake = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        this.inflightCount++;
        resolve();
      };
      this.waiters.push(wake);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
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
    for (const fn of w) fn();
  }
}
