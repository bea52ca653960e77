import { ReefError } from '../runtime/errors.js';

/**
 * Brackets a weight swap: `pause()` stops admitting new generations and waits (bounded) for those
 * in flight to finish; `resume()` lets the waiting ones through. New requests wait instead of
 * failing, up to `admitTimeoutMs`, after which they get a retryable 503.
 */
export class GenerationGate {
  private inflightCount = 0;
  private paused = false;
  private waiters: Array<() => void> = [];
  private drained: Array<() => void> = [];
  private version: string | null;

  constructor(initialWeightVersion: string | null, private readonly admitTimeoutMs = 60_000) {
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
    if (this.paused) {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          this.waiters = this.waiters.filter((w) => w !== wake);
          reject(new ReefError('REEF_ERR_ENGINE_DOWN', { engine: 'rollout', reason: `weights are being updated; waited ${this.admitTimeoutMs} ms` }));
        }, this.admitTimeoutMs);
        const wake = () => {
          clearTimeout(timer);
          resolve();
        };
        this.waiters.push(wake);
        signal?.addEventListener('abort', () => {
          clearTimeout(timer);
          this.waiters = this.waiters.filter((w) => w !== wake);
          reject(signal.reason);
        }, { once: true });
      });
    }
    this.inflightCount++;
  }

  leave(): void {
    this.inflightCount--;
    if (this.inflightCount === 0) {
      const d = this.drained;
      this.drained = [];
      for (const fn of d) fn();
    }
  }

  /** Stops admitting and waits for in-flight generations; resolves with how many were still running at the deadline. */
  async pause(drainTimeoutMs: number): Promise<{ drained: boolean; inflight: number }> {
    this.paused = true;
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
    const w = this.waiters;
    this.waiters = [];
    for (const fn of w) fn();
  }
}
