import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { STATE_KEY as JUDGE_STATE_KEY } from '../../actors/judge/handler.js';
import { STATE_KEY as TRAINER_STATE_KEY } from '../../actors/trainer-controller/messages.js';
import { startStack, type Stack } from './harness.js';

/** Correlation, judge and training counters reach /reef/status and /metrics from the store. */
describe('pipeline counters in /reef/status and /metrics', () => {
  let s: Stack;
  const correlation = { tagged: 7, untagged: 2, bound: 5, dropped_unbound: 1, evicted: 0, retries: 1, side: 1 };

  beforeAll(async () => {
    s = await startStack();
    // What the judge and the trainer-controller persist (their own tests cover how they get there).
    await s.gw.store.putState(JUDGE_STATE_KEY, { version: 1, correlator: { counters: correlation }, pending: [], counters: { votes_ok: 12, votes_failed: 1, judged: 5 } });
    await s.gw.store.putState(TRAINER_STATE_KEY, { releases: [{ weightVersion: 'v1' }, { weightVersion: 'v2' }], counters: { batches: 2, stale: 0 } });
  });
  afterAll(async () => {
    await s?.close();
  });

  it('shows every correlation counter, the judge counters and training in /reef/status', async () => {
    const body = (await (await fetch(`${s.url}/reef/status`)).json()) as Record<string, any>;
    expect(body.correlation).toEqual(correlation);
    expect(body.judge).toMatchObject({ votes_ok: 12, votes_failed: 1, judged: 5 });
    expect(body.training).toEqual({ releases: 2, weightVersion: 'v2', counters: { batches: 2, stale: 0 } });
  });

  it('exports them to Prometheus', async () => {
    // /reef/status refreshed the snapshot; /metrics renders it without touching the store.
    const text = await (await fetch(`${s.url}/metrics`)).text();
    for (const [k, v] of Object.entries(correlation)) expect(text).toContain(`reef_correlation{counter="${k}"} ${v}`);
    expect(text).toContain('reef_judge{counter="votes_ok"} 12');
    expect(text).toContain('reef_training{counter="releases"} 2');
  });
});
