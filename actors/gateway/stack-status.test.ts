import { describe, expect, it } from 'vitest';
import { stackStatus } from './stack-status.js';

describe('stackStatus', () => {
  it('asks once per interval, one question at a time, hides mailboxes, and keeps the last answer when the supervisor is silent', async () => {
    let t = 0;
    let asked = 0;
    let fail = false;
    const view = stackStatus(async () => {
      asked++;
      if (fail) throw new Error('timed out');
      return { actors: [{ id: 'judge-0', state: 'running', mailbox: 'tcp://127.0.0.1:4000' }], engines: [{ name: 'rollout', healthy: true }], groups: [] };
    }, 5000, () => t);
    const [a, b] = await Promise.all([view(), view()]);
    expect(asked).toBe(1);
    expect(a).toEqual({ actors: [{ id: 'judge-0', state: 'running' }], engines: [{ name: 'rollout', healthy: true }], groups: [], stackError: null });
    expect(b).toBe(a);
    t = 4999;
    await view();
    expect(asked).toBe(1);
    t = 10_000;
    fail = true;
    const stale = await view();
    expect(asked).toBe(2);
    expect(stale).toMatchObject({ actors: [{ id: 'judge-0', state: 'running' }], stackError: 'the supervisor did not answer: timed out' });
  });
});
