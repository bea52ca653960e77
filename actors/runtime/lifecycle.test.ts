import { describe, expect, it } from 'vitest';
import { ReefError } from './errors.js';
import { LIFECYCLE_STATES, Lifecycle, type LifecycleState, TRANSITIONS, canTransition } from './lifecycle.js';

describe('Lifecycle', () => {
  it.each([
    ['starting', 'running', true],
    ['starting', 'draining', true],
    ['running', 'draining', true],
    ['running', 'failed', true],
    ['draining', 'stopped', true],
    ['running', 'stopped', false],
    ['stopped', 'running', false],
    ['failed', 'running', false],
    ['draining', 'running', false],
  ] as [LifecycleState, LifecycleState, boolean][])('%s → %s allowed: %s', (from, to, allowed) => {
    expect(canTransition(from, to)).toBe(allowed);
  });

  it('terminal states have no way out', () => {
    expect(TRANSITIONS.stopped).toEqual([]);
    expect(TRANSITIONS.failed).toEqual([]);
    expect(Object.keys(TRANSITIONS).sort()).toEqual([...LIFECYCLE_STATES].sort());
  });

  it('throws REEF_ERR_LIFECYCLE on an illegal move and notifies listeners on a legal one', () => {
    const lc = new Lifecycle('thing');
    const seen: string[] = [];
    const off = lc.onChange((to, from, reason) => seen.push(`${from}>${to}:${reason}`));
    lc.transition('running', 'bound');
    lc.transition('running');
    expect(() => lc.transition('stopped')).toThrow(ReefError);
    try {
      lc.transition('starting');
    } catch (err) {
      expect((err as ReefError).code).toBe('REEF_ERR_LIFECYCLE');
    }
    off();
    lc.transition('draining');
    expect(seen).toEqual(['starting>running:bound']);
    expect(lc.state).toBe('draining');
  });

  it('close is idempotent, drains before destroying, and ends stopped', async () => {
    const lc = new Lifecycle('thing');
    lc.transition('running');
    const order: string[] = [];
    let drains = 0;
    const steps = {
      drain: async () => {
        drains++;
        order.push(`drain:${lc.state}`);
      },
      destroy: async () => {
        order.push('destroy');
      },
    };
    const stoppedSeen = lc.waitFor('stopped');
    const a = lc.close(steps);
    const b = lc.close(steps);
    expect(a).toBe(b);
    await a;
    expect(await stoppedSeen).toBe('stopped');
    expect(drains).toBe(1);
    expect(order).toEqual(['drain:draining', 'destroy']);
    await lc.close(steps);
    expect(drains).toBe(1);
  });

  it('a failing drain still destroys, ends failed and rethrows', async () => {
    const lc = new Lifecycle('thing');
    lc.transition('running');
    let destroyed = false;
    const closing = lc.close({
      drain: async () => {
        throw new Error('stuck');
      },
      destroy: async () => {
        destroyed = true;
      },
    });
    await expect(closing).rejects.toThrow('stuck');
    expect(destroyed).toBe(true);
    expect(lc.state).toBe('failed');
  });
});
