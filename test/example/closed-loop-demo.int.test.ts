import { beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { CONSUMER, STATE_KEY } from '../../actors/trainer-controller/messages.js';
import { pythonBin, pythonEnv, repoRoot } from '../../cluster/paths.js';
import { armOptions, runArm, type ArmSummary } from '../../recipes/openclawrl/demo/experiment.js';

/**
 * A short arm of the experiment on the toy demo model (the real-model run is the README's `npm run
 * demo`, far too long for the suite): the real pipeline, the scripted student and the rule PRM
 * double, with the toy's planted bold habit. A plumbing test: the toy was pre-trained to answer a
 * hinted prompt plainly, so its habit falling shows that judged turns reach the trainer and releases
 * reach the engine, not that Reef teaches a real model (docs/experiment.md has that result).
 */

const BATCH = 8;

describe('closed-loop experiment arm on the toy model (short)', () => {
  const out = mkdtempSync(join(tmpdir(), 'reef-demo-'));
  const modelDir = process.env.REEF_DEMO_MODEL ?? join(repoRoot(), '.cache', 'demo-model');
  let result: ArmSummary;
  const lines: string[] = [];

  beforeAll(() => {
    if (!existsSync(join(modelDir, 'model.safetensors'))) {
      execFileSync(pythonBin(), ['-m', 'reef_shim.demo_model', '--out', modelDir, '--quiet'], { env: pythonEnv(), stdio: 'inherit' });
    }
  });

  it('runs sessions in waves, trains batches, evaluates held-out replies and the planted habit falls', async () => {
    const o = armOptions(['--model', modelDir, '--sessions', '36', '--batch-size', String(BATCH), '--eval-samples', '30', '--concurrency', '6', '--lr', '3e-4', '--max-tokens', '160', '--no-greedy', '--out', out], (l) => lines.push(l));
    result = await runArm(o);
    expect(result.sessions).toBe(36);
    expect(result.training.releases).toBeGreaterThanOrEqual(4);
    expect(result.training.releases).toBe(result.training.batches);
    expect(result.heldout.n).toBe(30);
    // Every stand-in is named on the console and in the summary.
    expect(lines).toContain(`judge: ${result.doubles.judge}`);
    expect(lines).toContain(`student: ${result.doubles.student}`);
    const before = result.heldout.before.habit_rate as number;
    const after = result.heldout.after.habit_rate as number;
    expect(before, lines.join('\n')).toBeGreaterThanOrEqual(0.3);
    expect(after, lines.join('\n')).toBeLessThanOrEqual(before / 2);
    expect(result.heldout.kl_to_base?.mean_kl).toBeGreaterThan(0);
    for (const f of ['summary.json', 'heldout-before.json', 'heldout-after.json', 'reference.jsonl', 'results/rates.svg', 'results/sessions.jsonl']) expect(existsSync(join(out, f)), f).toBe(true);
  }, 600_000);

  it("writes one record line per released batch, agreeing with the trainer's steps and the store's judged turns", async () => {
    const recordLines = readFileSync(join(out, 'prm-records.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { batch: number; batch_id: string; samples: number; rewards: Record<string, number> });
    expect(recordLines).toHaveLength(result.training.releases);
    expect(recordLines.map((l) => l.batch)).toEqual(recordLines.map((_, i) => i + 1));
    // Each line counts what its step trained: a batch narrowed by turns gone stale before their
    // step trains fewer than BATCH, and its line says so.
    recordLines.forEach((line, k) => {
      expect(line.samples).toBeLessThanOrEqual(BATCH);
      expect(Object.values(line.rewards).reduce((a, b) => a + b, 0)).toBe(line.samples);
      expect(line.samples).toBe(result.training.steps[k]!.samples);
    });

    const store = SqliteStore.open(join(out, 'data', 'records.sqlite'));
    try {
      // Sessions run as a pool while the toy trains in seconds, so some turns come from weights
      // more than max_staleness releases old and are skipped: counted, never trained. Every
      // trainable turn the controller has read is then in exactly one place: a trained batch, the
      // stale or untrainable count, a pending batch, or the batcher's partial one.
      type Counted = { counters: Record<string, number>; pending: Array<{ tasks: unknown[] }>; batcher: { pending: Record<string, unknown[]> } };
      const state = (await store.getState(STATE_KEY)) as Counted;
      const readUpTo = await store.getOffset(CONSUMER);
      const judged = await store.readJudgedTurns(0, 100_000);
      expect(judged.length).toBeGreaterThan(0);
      const trainable = judged.filter((t) => t.offset < readUpTo && t.decision !== 'dropped');
      const c = (k: string) => state.counters[k] ?? 0;
      const placed =
        recordLines.reduce((a, l) => a + l.samples, 0) + c('stale') + c('untrainable') + c('missing_records') +
        state.pending.reduce((a, b) => a + b.tasks.length, 0) + Object.values(state.batcher.pending).reduce((a, p) => a + p.length, 0);
      expect(placed).toBe(trainable.length);
      // The lines' rewards are a sub-multiset of the read turns' rewards.
      const split = { '1': 0, '-1': 0, '0': 0 };
      for (const t of trainable) split[t.reward > 0 ? '1' : t.reward < 0 ? '-1' : '0']++;
      for (const r of ['1', '-1', '0'] as const) expect(recordLines.reduce((a, l) => a + (l.rewards[r] ?? 0), 0)).toBeLessThanOrEqual(split[r]);
      // Every judged turn refers to a stored record of the same scenario.
      for (const t of trainable) expect((await store.get(t.turnRecordId))?.scenario).toBe('homework');
    } finally {
      await store.close();
    }
  });
});
