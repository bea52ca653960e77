import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { STATE_KEY as JUDGE_STATE_KEY } from '../judge/handler.js';
import { STATE_KEY as TRAINER_STATE_KEY } from '../trainer-controller/messages.js';
import { parsePrometheusText } from '../../test/helpers/prometheus-text.js';
import { PipelineStatus } from './pipeline-status.js';
import { SqliteStore } from './store/sqlite-store.js';

describe('PipelineStatus', () => {
  let dir: string;
  let store: SqliteStore;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'reef-pipeline-'));
    store = SqliteStore.open(join(dir, 'records.sqlite'));
  });
  afterEach(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Counts the reads of saved states' contents (not of their write times). */
  function counting(): { reads: () => number } {
    let n = 0;
    const read = store.getStateFields.bind(store);
    store.getStateFields = (key, paths) => {
      n++;
      return read(key, paths);
    };
    return { reads: () => n };
  }

  it('reads the counters, not the sessions beside them, and only again once a state was written', async () => {
    const sessions = Object.fromEntries(Array.from({ length: 200 }, (_, i) => [`s${i}`, { text: 'x'.repeat(100) }]));
    await store.commitConsumer('judge', 3, JUDGE_STATE_KEY, { correlator: { counters: { tagged: 4 }, sessions }, counters: { judged: 2 } });
    await store.putState(TRAINER_STATE_KEY, { releases: [{ weightVersion: 'v1' }, { weightVersion: 'v2' }], counters: { batches: 2 }, pending: [] });
    const { reads } = counting();
    const status = new PipelineStatus(store, 60_000);
    expect(await status.refresh()).toEqual({ correlation: { tagged: 4 }, correlationWarnings: [], judge: { judged: 2 }, training: { releases: 2, weightVersion: 'v2', counters: { batches: 2 } } });
    expect(reads()).toBe(2);
    // A write in the same ms as that read may have come after it: wait past it, then nothing is read.
    await new Promise((r) => setTimeout(r, 5));
    await status.refresh();
    await status.refresh();
    const settled = reads();
    await status.refresh();
    expect(reads()).toBe(settled);
    await store.commitConsumer('judge', 4, JUDGE_STATE_KEY, { correlator: { counters: { tagged: 5 }, sessions }, counters: { judged: 3 } });
    expect((await status.refresh()).correlation).toEqual({ tagged: 5 });
    // What the correlator saved of its warnings comes back as warnings, each saying what to do.
    await store.commitConsumer('judge', 5, JUDGE_STATE_KEY, { correlator: { counters: { tagged: 5 }, warned: { untagged: true, evictions: false, unboundAt: 1234 } }, counters: {} });
    expect((await status.refresh()).correlationWarnings).toEqual([
      { code: 'untagged-traffic', at: null, message: expect.stringContaining('x-reef-tag-session') },
      { code: 'unbound-turns', at: 1234, message: expect.stringContaining('reef correlate') },
    ]);
    expect(reads()).toBeGreaterThan(settled);
    // A state deleted reads as none.
    await store.deleteState(TRAINER_STATE_KEY);
    expect((await status.refresh()).training).toEqual({ releases: 0, weightVersion: null, counters: {} });
  });

  it('escapes counter names read from saved state in its Prometheus labels (regression: a quote or newline broke the whole scrape)', async () => {
    const odd = 'say "hi"\\now\nnext';
    await store.putState(JUDGE_STATE_KEY, { correlator: { counters: { [odd]: 3, tagged: 1 } }, counters: { judged: 2 } });
    const status = new PipelineStatus(store, 60_000);
    await status.refresh();
    const samples = parsePrometheusText(`${status.render()}\n`);
    expect(samples.find((s) => s.name === 'reef_correlation' && s.labels.counter === odd)?.value).toBe(3);
    expect(samples.find((s) => s.name === 'reef_correlation' && s.labels.counter === 'tagged')?.value).toBe(1);
    expect(samples.find((s) => s.name === 'reef_judge' && s.labels.counter === 'judged')?.value).toBe(2);
  });
});
