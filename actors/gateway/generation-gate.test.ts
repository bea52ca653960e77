import { afterEach, describe, expect, it, vi } from 'vitest';
import { GenerationGate } from './generation-gate.js';
import { pauseGeneration } from './messages.js';
import { maxPauseMs } from '../trainer-controller/index.js';

afterEach(() => {
  vi.useRealTimers();
});

describe('GenerationGate', () => {
  it('a client already gone when it reaches a paused gate is refused at once, not held until resume (regression)', async () => {
    const gate = new GenerationGate('v0', 60_000);
    await gate.pause(0);
    const gone = new AbortController();
    gone.abort(new Error('client disconnected'));
    let outcome = 'waiting';
    gate.enter(gone.signal).then(() => (outcome = 'entered'), (e: Error) => (outcome = e.message));
    await new Promise((r) => setImmediate(r));
    expect(outcome).toBe('client disconnected');
    gate.resume(null);
    await new Promise((r) => setImmediate(r));
    expect(gate.inflight).toBe(0);
  });

  it('a waiter let through by resume counts as in flight at once: a pause right after it waits for it (regression: counted a turn later, it drained to 0)', async () => {
    const gate = new GenerationGate('v0', 60_000);
    await gate.pause(0);
    const entered = gate.enter();
    gate.resume('v1');
    let drained = false;
    const drain = gate.pause(60_000).then((d) => ((drained = true), d));
    await entered;
    await new Promise((r) => setImmediate(r));
    expect(drained).toBe(false);
    gate.leave();
    expect(await drain).toEqual({ drained: true, inflight: 0 });
    expect(gate.inflight).toBe(0);
    gate.resume(null);
  });

  it('waits are bounded and leave no timers behind', async () => {
    vi.useFakeTimers();
    const gate = new GenerationGate('v0', 1_000);
    await gate.enter();
    const drain = gate.pause(500, 10_000);
    const waiter = gate.enter();
    const refused = expect(waiter).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN' });
    await vi.advanceTimersByTimeAsync(500);
    expect(await drain).toEqual({ drained: false, inflight: 1 });
    await vi.advanceTimersByTimeAsync(500);
    await refused;
    gate.leave();
    gate.resume('v1');
    expect(vi.getTimerCount()).toBe(0);
    expect(gate.inflight).toBe(0);
    expect(gate.weightVersion).toBe('v1');
  });

  it('closing refuses the requests waiting for a resume, and those that come after, as draining; nothing is left waiting', async () => {
    vi.useFakeTimers();
    const gate = new GenerationGate('v0', 60_000);
    await gate.pause(0, 600_000);
    const waiter = gate.enter();
    const refused = expect(waiter).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_DRAINING', status: 503 });
    gate.close();
    await refused;
    await expect(gate.enter()).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_DRAINING' });
    expect(vi.getTimerCount()).toBe(0);
    expect(gate.inflight).toBe(0);
  });

  it('a pause never resumed ends by itself after its bound and lets the waiters in', async () => {
    vi.useFakeTimers();
    const expired: number[] = [];
    const gate = new GenerationGate('v0', 60_000, (ms) => expired.push(ms));
    await gate.pause(0, 5_000);
    const waiter = gate.enter();
    await vi.advanceTimersByTimeAsync(5_000);
    await waiter;
    expect(expired).toEqual([5_000]);
    expect(gate.isPaused).toBe(false);
    expect(gate.inflight).toBe(1);
    gate.leave();
    expect(vi.getTimerCount()).toBe(0);
  });

  it('a pause-generation longer than a swap can need is refused (one message stopped generation for up to 24.8 days; past 2^31-1 ms the timer fired at once and resumed mid-swap)', () => {
    const msg = { type: 'pause-generation', requestId: 'p', drainTimeoutMs: 30_000 };
    expect(pauseGeneration.safeParse({ ...msg, maxPauseMs: maxPauseMs(true) }).success).toBe(true);
    expect(pauseGeneration.safeParse({ ...msg, maxPauseMs: 15 * 60_000 }).success).toBe(true);
    expect(pauseGeneration.safeParse({ ...msg, maxPauseMs: 15 * 60_000 + 1 }).success).toBe(false);
    expect(pauseGeneration.safeParse({ ...msg, maxPauseMs: 2 ** 31 - 1 }).success).toBe(false);
    expect(pauseGeneration.safeParse({ ...msg, drainTimeoutMs: 5 * 60_000 + 1 }).success).toBe(false);
    expect(pauseGeneration.safeParse({ ...msg, drainTimeoutMs: 2 ** 31 }).success).toBe(false);
  });
});
