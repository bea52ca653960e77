import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pythonBin, pythonEnv, smolModelDir } from '../../cluster/paths.js';
import { armOptions, runArm, type ArmSummary } from '../../recipes/openclawrl/demo/experiment.js';

/**
 * The real model through the whole loop, in miniature: SmolLM2-135M-Instruct (built by set-up)
 * serves a few sessions, one batch trains and goes live, and the held-out evaluation runs before
 * and after. The judge is reached the way a real LLM judge is, over the OpenAI API (`prm_api:
 * openai`): the rule double answers that API too, so the path the documented real-judge config
 * takes is the one that runs here. Figures are not asserted (2 samples say nothing); that every
 * stage ran, and what it wrote, is.
 */

const model = smolModelDir();
const out = mkdtempSync(join(tmpdir(), 'reef-smol-'));
let prm: ChildProcess | null = null;
let prmUrl = '';

beforeAll(async () => {
  if (!existsSync(join(model, 'model.safetensors'))) throw new Error(`SmolLM2 is not built at ${model}: run bash scripts/setup.sh`);
  prm = spawn(pythonBin(), ['-m', 'reef_shim.engines.rule_prm_server', '--host', '127.0.0.1', '--port', '0', '--tokenizer-path', model], { env: pythonEnv(), stdio: ['ignore', 'pipe', 'inherit'] });
  const ready = await new Promise<string>((resolve, reject) => {
    prm!.once('exit', (code) => reject(new Error(`rule PRM exited with ${code}`)));
    createInterface({ input: prm!.stdout! }).once('line', resolve);
  });
  prmUrl = (JSON.parse(ready) as { url: string }).url;
  process.env.REEF_SMOKE_JUDGE_KEY = 'not-checked-by-the-double';
}, 60_000);

afterAll(() => {
  prm?.kill('SIGTERM');
  delete process.env.REEF_SMOKE_JUDGE_KEY;
  rmSync(out, { recursive: true, force: true });
});

describe('SmolLM2 through the loop (smoke)', () => {
  let s: ArmSummary;
  const lines: string[] = [];

  it('runs sessions, trains one batch and releases it, and evaluates held-out replies before and after', async () => {
    // Two sessions of up to four turns make one batch of four; replies of 32 tokens and two
    // held-out samples keep it to about 85 s on two cores, most of it the stack, one SmolLM2 step
    // and the KL pass, which do not shrink further.
    const o = armOptions(['--sessions', '2', '--batch-size', '4', '--eval-samples', '2', '--no-greedy', '--max-tokens', '32', '--concurrency', '2',
      '--judge-url', `${prmUrl}/v1`, '--judge-model', 'reef-rule-prm', '--judge-api-key-env', 'REEF_SMOKE_JUDGE_KEY', '--out', out], (l) => lines.push(l));
    s = await runArm(o);
    expect(s.model).toMatch(/SmolLM2-135M-Instruct/);
    expect(s.doubles.judge).toBe(`LLM judge reef-rule-prm at ${prmUrl}/v1 (prm_api: openai)`);
    expect(s.training.releases, lines.join('\n')).toBeGreaterThanOrEqual(1);
    expect(s.training.steps[0]).toHaveProperty('loss');
    expect([s.heldout.before.habit_rate, s.heldout.after.habit_rate].every((r) => typeof r === 'number')).toBe(true);
    expect(s.heldout.kl_to_base?.tokens).toBeGreaterThan(0);
    const replies = JSON.parse(readFileSync(join(out, 'heldout-after.json'), 'utf8')) as { eval: { sampled: unknown[] } };
    expect(replies.eval.sampled).toHaveLength(2);
  }, 900_000);
});
