import { beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { STATE_KEY } from '../../actors/trainer-controller/messages.js';
import { pythonBin, pythonEnv, repoRoot } from '../../cluster/paths.js';
import { demoOptions, runDemo, type DemoResult } from '../../recipes/openclawrl/demo/cpu-demo.js';

/**
 * A short run of the closed-loop CPU demo (the README's first command): the real pipeline, the
 * demo model with its bold habit, the scripted student and the rule PRM double. The habit must
 * fall, and every batch's record line must agree with what the store holds.
 */

const BATCH = 8;

describe('closed-loop CPU demo (short)', () => {
  const out = mkdtempSync(join(tmpdir(), 'reef-demo-'));
  const modelDir = process.env.REEF_DEMO_MODEL ?? join(repoRoot(), '.cache', 'demo-model');
  let result: DemoResult;

  beforeAll(() => {
    if (!existsSync(join(modelDir, 'model.safetensors'))) {
      execFileSync(pythonBin(), ['-m', 'reef_shim.demo_model', '--out', modelDir, '--quiet'], { env: pythonEnv(), stdio: 'inherit' });
    }
  });

  it('runs sessions, trains batches and the bold habit falls', async () => {
    const lines: string[] = [];
    const o = demoOptions(['--sessions', '36', '--batch-size', String(BATCH), '--eval-samples', '30', '--out', out, '--model', modelDir], (l) => lines.push(l));
    result = await runDemo(o);
    const { before, after, summary } = result;
    expect(summary.sessions).toBe(36);
    expect(summary.batches?.length ?? 0).toBeGreaterThanOrEqual(6);
    // The base model has the habit; training removes most of it. Each rate is read off 30 sampled
    // replies, so the bound leaves room for sampling noise: a cap of 15% failed one run in several
    // (5 of 30 bold, 17%, after 14 batches; P(≥5 of 30) is ~18% at a true rate of 10%). At most
    // half the base rate and at most 25% (≥8 of 30: under 1% at 10%) still fails a run that did
    // not learn, whose rate stays near the base model's ~55%.
    expect(before.bold, lines.join('\n')).toBeGreaterThanOrEqual(0.35);
    expect(after.bold, lines.join('\n')).toBeLessThanOrEqual(Math.min(0.25, before.bold / 2));
    for (const f of [summary.files.rates_plot, summary.files.rewards_plot, summary.files.summary, summary.files.sessions]) expect(existsSync(f)).toBe(true);
    // The whole loop takes 110-125 s on this 2-core machine (the same before and after this
    // session's trainer changes: 113.9 s and 120.5 s in one A/B), too close to the suite's 120 s
    // default for a guard against a hang.
  }, 300_000);

  it("writes one record line per released batch, agreeing with the store's judged turns", async () => {
    const recordLines = readFileSync(join(out, 'prm-records.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { batch: number; batch_id: string; samples: number; rewards: Record<string, number> });
    expect(recordLines.map((l) => l.batch_id)).toEqual(result.releasedBatches);
    expect(recordLines.map((l) => l.batch)).toEqual(recordLines.map((_, i) => i + 1));

    const store = SqliteStore.open(join(out, 'data', 'records.sqlite'));
    try {
      const state = (await store.getState(STATE_KEY)) as { counters: Record<string, number> };
      expect(state.counters.stale ?? 0).toBe(0);
      // With no stale turn, batch k holds the k-th run of BATCH trained turns in judged order.
      const trained = (await store.readJudgedTurns(0, 100_000)).filter((t) => t.scenario === 'homework' && t.decision !== 'dropped');
      recordLines.forEach((line, k) => {
        const turns = trained.slice(k * BATCH, (k + 1) * BATCH);
        const split = { '1': 0, '-1': 0, '0': 0 };
        for (const t of turns) split[t.reward > 0 ? '1' : t.reward < 0 ? '-1' : '0']++;
        expect(line.samples).toBe(BATCH);
        expect(line.rewards).toEqual(split);
      });
      // Every judged turn refers to a stored record of the same scenario.
      for (const t of trained.slice(0, recordLines.length * BATCH)) expect((await store.get(t.turnRecordId))?.scenario).toBe('homework');
    } finally {
      await store.close();
    }
  });
});
