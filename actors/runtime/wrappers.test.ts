import { describe, expect, it } from 'vitest';
import { ReefError } from './errors.js';
import { withDedupe, withRetry, withTimeout, withTracing } from './wrappers.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('withTimeout', () => {
  it('passes results through and rejects a call that never settles with REEF_ERR_TIMEOUT', async () => {
    const quick = withTimeout(async (x: number) => x * 2, { ms: 1000, what: 'double' });
    expect(await quick(21)).toBe(42);
    const never = withTimeout(() => new Promise<number>(() => {}), { ms: 20, what: 'never' });
    await expect(never()).rejects.toMatchObject({ code: 'REEF_ERR_TIMEOUT', message: 'never timed out after 20 ms' });
  });

  it('passes errors through unchanged', async () => {
    const bad = withTimeout(async () => {
      throw new ReefError('REEF_ERR_NOT_FOUND', { what: 'x' });
    }, { ms: 1000, what: 'bad' });
    await expect(bad()).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
  });
});

describe('withRetry', () => {
  it('retries retryable errors with doubling delays until success', async () => {
    let calls = 0;
    const delays: number[] = [];
    const flaky = withRetry(
      async () => {
        calls++;
        if (calls < 3) throw new ReefError('REEF_ERR_TIMEOUT', { what: 'x', ms: 1 });
        return 'ok';
      },
      { attempts: 5, baseMs: 1, onRetry: (_e, _a, d) => delays.push(d) },
    );
    expect(await flaky()).toBe('ok');
    expect(calls).toBe(3);
    expect(delays).toEqual([1, 2]);
  });

  it('does not retry a non-retryable error', async () => {
    let calls = 0;
    const fn = withRetry(async () => {
      calls++;
      throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: 'no' });
    }, { attempts: 5, baseMs: 1 });
    await expect(fn()).rejects.toMatchObject({ code: 'REEF_ERR_BAD_MESSAGE' });
    expect(calls).toBe(1);
  });

  it('gives up after `attempts` and rethrows the last error', async () => {
    let calls = 0;
    const fn = withRetry(async () => {
      calls++;
      throw new ReefError('REEF_ERR_ACTOR_DRAINING', { actor: `a${calls}` });
    }, { attempts: 3, baseMs: 1 });
    await expect(fn()).rejects.toThrow('actor a3 is draining');
    expect(calls).toBe(3);
  });
});

describe('withDedupe', () => {
  it('runs concurrent and recent calls with the same key once, different keys separately', async () => {
    let runs = 0;
    const fn = withDedupe(
      async (req: { id: string | null; v: number }) => {
        runs++;
        await sleep(5);
        return req.v;
      },
      { key: (req) => req.id },
    );
    const [a, b] = await Promise.all([fn({ id: 'k', v: 1 }), fn({ id: 'k', v: 2 })]);
    expect([a, b]).toEqual([1, 1]);
    expect(await fn({ id: 'k', v: 3 })).toBe(1);
    expect(await fn({ id: 'other', v: 4 })).toBe(4);
    expect(await fn({ id: null, v: 5 })).toBe(5);
    expect(await fn({ id: null, v: 6 })).toBe(6);
    expect(runs).toBe(4);
  });

  it('forgets failures so a retry runs again, and expires results after ttl', async () => {
    let runs = 0;
    const fn = withDedupe(
      async () => {
        runs++;
        if (runs === 1) throw new Error('first fails');
        return runs;
      },
      { key: () => 'same', ttlMs: 10 },
    );
    await expect(fn()).rejects.toThrow('first fails');
    expect(await fn()).toBe(2);
    expect(await fn()).toBe(2);
    await sleep(20);
    expect(await fn()).toBe(3);
  });
});

describe('withTracing', () => {
  it('logs outcome and duration of each call', async () => {
    const lines: string[] = [];
    const ok = withTracing(async () => 1, { name: 'op', log: (l) => lines.push(l) });
    const bad = withTracing(async () => {
      throw new ReefError('REEF_ERR_HANDLER', { messageType: 'x', reason: 'y' });
    }, { name: 'op', log: (l) => lines.push(l) });
    expect(await ok()).toBe(1);
    await expect(bad()).rejects.toMatchObject({ code: 'REEF_ERR_HANDLER' });
    expect(lines[0]).toMatch(/^op ok \d+\.\d ms$/);
    expect(lines[1]).toMatch(/^op failed REEF_ERR_HANDLER \d+\.\d ms$/);
  });
});
