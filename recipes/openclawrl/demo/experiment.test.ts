import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import { STATE_KEY as JUDGE_STATE } from '../../../actors/judge/handler.js';
import { sampleRecord } from '../../../actors/gateway/store/fixtures.js';
import { armConfig, armOptions, clearRunState, describeArm, doublesOf, experimentProblems, hintCounts, judgedTurns, LR_DEFAULT, modelDirProblem, runArm, runStatePaths, trainingCaughtUp, type ArmSummary } from './experiment.js';

const dir = mkdtempSync(join(tmpdir(), 'reef-cpu-demo-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('arm options', () => {
  it('defaults to both terms on SmolLM2, seed 1, with the results folder named by arm and seed', () => {
    const o = armOptions([], () => {});
    expect([o.wRl, o.wOpd, o.control, o.seed, o.sessions, o.batchSize, o.lr, o.evalSamples, o.greedy]).toEqual([1, 1, false, 1, 72, 16, LR_DEFAULT, 100, true]);
    expect(o.modelDir).toMatch(/smollm2-135m-instruct$/);
    expect(o.out).toMatch(/results\/smollm2\/both-seed1$/);
    expect(armOptions(['--control', '--seed', '3'], () => {}).out).toMatch(/control-seed3$/);
    expect(armOptions(['--w-opd', '0'], () => {}).out).toMatch(/rl-seed1$/);
  });

  // README's main command runs the quick arm; its results must not land in (or be read as) the
  // full arm's folder, which the ablation's --kept reuses.
  it('--quick: 48 sessions, no greedy pass, its own results folder; an explicit --sessions still wins', () => {
    const q = armOptions(['--quick', '--control'], () => {});
    expect([q.sessions, q.greedy, q.evalSamples]).toEqual([48, false, 100]);
    expect(q.out).toMatch(/results\/smollm2\/control-seed1-quick$/);
    expect(armOptions(['--sessions', '8', '--quick'], () => {}).sessions).toBe(8);
    expect(armOptions(['--quick', '--out', '/tmp/q'], () => {}).out).toBe('/tmp/q');
  });

  it('keeps everything after the first = of an inline value', () => {
    expect(armOptions(['--out=/tmp/a=b', '--lr=1e-3'], () => {}).out).toBe('/tmp/a=b');
    expect(armOptions(['--lr=1e-3'], () => {}).lr).toBe(1e-3);
  });

  it.each([
    [['--sessions'], /--sessions needs a value/],
    [['--lr', 'fast'], /--lr: expected a non-negative number, got fast/],
    [['--lr', '0'], /--lr: expected a positive number, got 0/],
    [['--w-rl', '-1'], /--w-rl: expected a non-negative number/],
    [['--seed', '1.5'], /--seed: expected an integer of at least 0, got 1.5/],
    [['--wrl', '1'], /unknown option --wrl \(known: /],
    [['--eval-samples', '0'], /--eval-samples: expected an integer of at least 1, got 0/],
    [['--w-rl', '0', '--w-opd', '0'], /trains nothing but weight decay; for training off use --control/],
    [['--judge-url', 'http://x/v1'], /needs all three of --judge-url, --judge-model and --judge-api-key-env/],
  ])('%j is refused: %s', (argv, message) => {
    expect(() => armOptions(argv, () => {})).toThrow(message);
  });

  it('writes the control arm with training off, and a real judge over the OpenAI API', () => {
    const o = armOptions(['--control', '--judge-url', 'http://127.0.0.1:9/v1', '--judge-model', 'qwen3-8b', '--judge-api-key-env', 'JUDGE_KEY', '--train-option=--kl-coef=0.1'], () => {});
    const cfg = armConfig(o, null, 8000) as { training: { enabled: boolean; options: string[] }; pipeline: { record2record: { config: Record<string, unknown> } } };
    expect(cfg.training.enabled).toBe(false);
    expect(cfg.training.options.at(-1)).toBe('--kl-coef=0.1');
    expect(cfg.pipeline.record2record.config).toMatchObject({ prm_api: 'openai', prm_url: 'http://127.0.0.1:9', prm_model: 'qwen3-8b', prm_api_key_env: 'JUDGE_KEY' });
    expect(doublesOf(o.judge).judge).toBe('LLM judge qwen3-8b at http://127.0.0.1:9/v1 (prm_api: openai)');
    expect(doublesOf({ kind: 'rule' }).judge).toMatch(/^rule-following PRM double .*not a model/);
  });
});

describe('problems', () => {
  it('holds out problems that share no question with the training sessions', () => {
    const { train, heldout } = experimentProblems(72, 100);
    expect(train).toHaveLength(72);
    expect(heldout).toHaveLength(100);
    const seen = new Set(train.map((p) => p.question));
    expect(heldout.filter((p) => seen.has(p.question))).toEqual([]);
    expect(new Set(heldout.map((p) => p.id)).size).toBe(100);
  });
});

describe('the model', () => {
  it('is checked before anything starts, naming what is missing and how to build it', () => {
    const model = join(dir, 'model');
    mkdirSync(model, { recursive: true });
    writeFileSync(join(model, 'config.json'), '{}');
    expect(modelDirProblem(model)).toBe(`no model at ${model} (missing tokenizer.json, model.safetensors): \`npm run demo\` builds SmolLM2 (scripts/setup.sh), or pass --model DIR`);
    writeFileSync(join(model, 'tokenizer.json'), '{}');
    writeFileSync(join(model, 'model.safetensors'), '');
    expect(modelDirProblem(model)).toBeNull();
  });
});

describe('run state', () => {
  it('a new run starts without the data dir and the record lines of the last one', () => {
    const out = join(dir, 'again');
    const p = runStatePaths(out);
    mkdirSync(join(p.dataDir, 'run'), { recursive: true });
    writeFileSync(join(p.dataDir, 'records.sqlite'), 'old');
    // Regression: this file survived, and batch ids restart at 1, so the trainer-controller skipped
    // this run's lines as already written and the report counted the earlier run's batches.
    writeFileSync(p.prmRecordFile, '{"batch":1,"batch_id":"homework:openclawrl:1"}\n');
    mkdirSync(join(out, 'results'), { recursive: true });
    clearRunState(out);
    expect(existsSync(p.dataDir)).toBe(false);
    expect(existsSync(p.prmRecordFile)).toBe(false);
    expect(existsSync(join(out, 'results'))).toBe(true);
    clearRunState(join(dir, 'never-ran'));
  });

  it('leaves a data/ folder that is not a data dir, and says so', () => {
    const out = join(dir, 'home');
    mkdirSync(join(out, 'data', 'photos'), { recursive: true });
    writeFileSync(join(out, 'data', 'taxes.txt'), 'mine');
    expect(() => clearRunState(out)).toThrow(`--out ${out}: ${join(out, 'data')} holds photos, taxes.txt, not a data dir of an earlier run; choose another --out`);
    expect(readFileSync(join(out, 'data', 'taxes.txt'), 'utf8')).toBe('mine');
  });
});

describe('the closing summary', () => {
  const figures = (habit: number, answer: number) => ({ habit_rate: habit, habit_ci95: [habit - 0.05, habit + 0.05], answer_rate: answer, mean_tokens: 150, distinct_2: 0.5, greedy_accuracy: 0.1 });
  const summary = (adapted: number | null): ArmSummary => ({
    model: 'SmolLM2-135M-Instruct', model_dir: '/m', arm: 'both', seed: 2, w_rl: 1, w_opd: 1, training_enabled: true, lr: 3e-5, batch_size: 16, sessions: 72, training_options: [],
    doubles: doublesOf({ kind: 'rule' }),
    heldout: { n: 100, problems: 'p', temperature: 0.7, max_tokens: 256, before: figures(0.3, 0.8), after: figures(0.1, 0.78), habit_p_value: 0.0004, exact_match_kept: { base_correct: 10, still_correct: 9, rate: 0.9 }, kl_to_base: { tokens: 3000, mean_kl: 0.0123, max_kl: 1, reference: 'r' } },
    sessions_to_adaptation: adapted, pass_definition: 'no habit, an answer', session_results: { passed: 30, habit: 20, bold: 0, list: 5, ended: { done: 72 }, rolling: [] },
    training: { batches: 12, releases: 12, counters: {}, steps: [], hints: { turns: { '-1/hint': 3, '1/anchor': 2 }, hints: [{ hint: 'End with the answer.', turns: 2 }, { hint: 'No lists.', turns: 1 }] } }, wall_time_s: 1234, timings_s: { stack_up: 40, sessions: 700 },
  });

  it('names both stand-ins, gives the held-out figures with intervals, and says what to run next', () => {
    const text = describeArm(summary(null), '/o');
    expect(text).toContain('judge: rule-following PRM double');
    expect(text).toContain('student: scripted student');
    expect(text).toContain('held-out habit rate (bold, lists or headings; 100 fresh first replies at T=0.7): 30% [25%, 35%] before → 10% [5%, 15%] after (p = 0.000)');
    expect(text).toContain('exact match kept at T=0: 9 of the 10 the base got right');
    expect(text).toContain('KL to the base 0.0123 nats/token');
    expect(text).toContain('sessions_to_adaptation (first of 3 passed sessions in a row): not reached in 72');
    expect(text).toContain(`records and checkpoints: ${runStatePaths('/o').dataDir} (removed when this arm runs again); config: /o/serve.yaml`);
    expect(text).toContain('judged turns (reward/decision): -1/hint 3, 1/anchor 2; the teacher\'s hints, most used first: 2 × "End with the answer."; 1 × "No lists."');
    expect(text).toMatch(/^next: .*npm run demo:ablation/m);
    expect(describeArm(summary(5), '/o')).toContain('in a row): 5;');
  });
});

describe('waiting for training', () => {
  it('says so when it gives up waiting', async () => {
    const store = SqliteStore.open(join(dir, 'wait.sqlite'));
    try {
      const lines: string[] = [];
      await trainingCaughtUp(store, (l) => lines.push(l), undefined, 0);
      expect(lines).toEqual([]);
      await store.putState(JUDGE_STATE, { pending: [{ turn: 1 }] });
      await trainingCaughtUp(store, (l) => lines.push(l), undefined, 0);
      expect(lines).toEqual(['  judging and training not caught up after 0 s (judge behind, trainer done); going on']);
    } finally {
      await store.close();
    }
  });
});

describe('stopping the demo', () => {
  it('an abort while the rule PRM starts stops it and rejects', async () => {
    const pidFile = join(dir, 'prm.pid');
    const fake = join(dir, 'fake-python');
    // A rule PRM that never answers /health.
    writeFileSync(fake, `#!/bin/sh\necho $$ > '${pidFile}'\nexec sleep 300\n`);
    chmodSync(fake, 0o755);
    const prior = process.env.REEF_PYTHON;
    process.env.REEF_PYTHON = fake;
    const stop = new AbortController();
    try {
      const run = runArm({ ...armOptions(['--out', join(dir, 'out'), '--model', dir], () => {}), signal: stop.signal });
      const settled = run.then(() => 'resolved', (err: Error) => err.message);
      while (!existsSync(pidFile) || readFileSync(pidFile, 'utf8').trim() === '') await new Promise((r) => setTimeout(r, 20));
      const pid = Number(readFileSync(pidFile, 'utf8'));
      expect(alive(pid)).toBe(true);
      stop.abort(new Error('interrupted by SIGINT'));
      expect(await settled).toBe('interrupted by SIGINT');
      for (let i = 0; i < 250 && alive(pid); i++) await new Promise((r) => setTimeout(r, 20));
      expect(alive(pid)).toBe(false);
    } finally {
      if (prior === undefined) delete process.env.REEF_PYTHON;
      else process.env.REEF_PYTHON = prior;
    }
  });
});

describe("the judge's hints in the summary", () => {
  it('counts judged turns by reward and decision, and each hint by the turns it conditioned, most used first', () => {
    const h = hintCounts([
      { reward: -1, decision: 'hint', teacherCandidates: ['End with the answer.', 'No lists.'] },
      { reward: -1, decision: 'hint', teacherCandidates: ['End with the answer.'] },
      { reward: 1, decision: 'anchor', teacherCandidates: [null] },
      { reward: 0, decision: 'dropped', teacherCandidates: [] },
    ]);
    expect(h).toEqual({ turns: { '-1/hint': 2, '1/anchor': 1, '0/dropped': 1 }, hints: [{ hint: 'End with the answer.', turns: 2 }, { hint: 'No lists.', turns: 1 }] });
  });

  it("reads every judged turn of the arm's scenario from the store", async () => {
    const store = SqliteStore.open(join(dir, 'hints.sqlite'));
    try {
      for (const [i, scenario] of ['homework', 'eval', 'homework'].entries()) {
        const r = await store.append({ ...sampleRecord(i + 1), scenario });
        await store.appendJudgedTurn({ turnRecordId: r.id, nextStateRecordId: 'next', scenario, sessionKey: `s${i}`, decision: 'hint', reward: -1, teacherCandidates: [`hint ${i}`], judgment: {} });
      }
      expect((await judgedTurns(store, 'homework')).map((t) => t.teacherCandidates)).toEqual([['hint 0'], ['hint 2']]);
    } finally {
      await store.close();
    }
  });
});
