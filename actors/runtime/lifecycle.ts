import { ReefError } from './errors.js';

/**
 * The states every long-lived part of Reef goes through (STYLE.md §6):
 * - `starting`: resources being acquired (sockets bound, peers connected); takes no work yet.
 * - `running`: takes work.
 * - `draining`: takes no new work, finishes what it has.
 * - `stopped`: everything released; terminal.
 * - `failed`: gave up after an unrecoverable error; terminal.
 */
export type LifecycleState = 'starting' | 'running' | 'draining' | 'stopped' | 'failed';

export const LIFECYCLE_STATES: readonly LifecycleState[] = ['starting', 'running', 'draining', 'stopped', 'failed'];

/** Allowed moves. `starting → draining` covers a close() that arrives before start-up finished. */
export const TRANSITIONS: Readonly<Record<LifecycleState, readonly LifecycleState[]>> = {
  starting: ['running', 'draining', 'failed'],
  running: ['draining', 'failed'],
  draining: ['stopped', 'failed'],
  stopped: [],
  failed: [],
};

export function canTransition(from: LifecycleState, to: LifecycleState): boolean {
  return TRANSITIONS[from].includes(to);
}

export type LifecycleListener = (to: LifecycleState, from: LifecycleState, reason: string | null) => void;

export interface CloseSteps {
  /** Stop taking work and finish what is in flight. */
  drain: () => Promise<void>;
  /** Release sockets, timers, children. Runs even if drain failed. */
  destroy: () => Promise<void>;
}

export class Lifecycle {
  private current: LifecycleState = 'starting';
  private readonly listeners = new Set<LifecycleListener>();
  private closing: Promise<void> | null = null;

  /** @param what names the owner in errors, e.g. `mailbox prm-0`. */
  constructor(readonly what: string) {}

  get state(): LifecycleState {
    return this.current;
  }

  is(...states: LifecycleState[]): boolean {
    return states.includes(this.current);
  }

  /** Move to `to`; an illegal move throws REEF_ERR_LIFECYCLE, staying put is a no-op. */
  transition(to: LifecycleState, reason: string | null = null): void {
    const from = this.current;
    if (from === to) return;
    if (!canTransition(from, to)) throw new ReefError('REEF_ERR_LIFECYCLE', { what: this.what, from, to });
    this.current = to;
    for (const listener of [...this.listeners]) listener(to, from, reason);
  }

  /** Subscribe to changes; returns the unsubscribe function. */
  onChange(listener: LifecycleListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Resolves when the state is one of `states` (immediately if it already is). */
  waitFor(...states: LifecycleState[]): Promise<LifecycleState> {
    if (states.includes(this.current)) return Promise.resolve(this.current);
    return new Promise((resolve) => {
      const off = this.onChange((to) => {
        if (!states.includes(to)) return;
        off();
        resolve(to);
      });
    });
  }

  /**
   * Idempotent close: the first call drains then destroys, later calls get the same promise.
   * Ends in `stopped`, or in `failed` if a step threw (the error is rethrown to every caller).
   */
  close(steps: CloseSteps): Promise<void> {
    this.closing ??= (async () => {
      if (this.is('stopped', 'failed')) {
        await steps.destroy();
        return;
      }
      this.transition('draining', 'close');
      let failure: unknown = null;
      try {
        await steps.drain();
      } catch (err) {
        failure = err;
      }
      try {
        await steps.destroy();
      } catch (err) {
        failure ??= err;
      }
      if (failure !== null) {
        this.transition('failed', String(failure));
        throw failure;
      }
      this.transition('stopped', 'closed');
    })();
    return this.closing;
  }
}
