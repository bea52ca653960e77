import { describe, expect, it } from 'vitest';
import { waitFor } from '../../test/helpers/wait.js';
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

  // A call evicted by maxKeys while running, then failing, deleted the entry of the later call
  // with its key: a duplicate of that later call ran it a second time.
  it('a call evicted while running does not clear the entry of a later call with the same key', async () => {
    const gates = new Map<string, (err: Error | null) => void>();
    const runs: string[] = [];
    const fn = withDedupe(
      (req: { key: string; run: string }) => {
        runs.push(req.run);
        if (runs.length > 3) return Promise.resolve(req.run);
        return new Promise<string>((resolve, reject) => gates.set(req.run, (err) => (err === null ? resolve(req.run) : reject(err))));
      },
      { key: (req) => req.key, maxKeys: 1 },
    );
    const first = fn({ key: 'a', run: 'a1' });
    const other = fn({ key: 'b', run: 'b1' }); // evicts a1's entry
    const second = fn({ key: 'a', run: 'a2' });
    await waitFor(() => runs.length === 3, { what: 'three runs to start' });
    gates.get('a1')!(new Error('a1 failed'));
    await expect(first).rejects.toThrow('a1 failed');
    const duplicate = fn({ key: 'a', run: 'a3' });
    gates.get('a2')!(null);
    gates.get('b1')!(null);
    expect(await Promise.all([second, duplicate, other])).toEqual(['a2', 'a2', 'b1']);
    expect(runs).toEqual(['a1', 'b1', 'a2']);
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
