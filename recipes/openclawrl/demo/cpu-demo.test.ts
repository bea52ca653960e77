import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import { STATE_KEY as JUDGE_STATE } from '../../../actors/judge/handler.js';
import { clearRunState, demoOptions, describeSummary, modelDirProblem, runDemo, runStatePaths, trainingCaughtUp, type DemoResult } from './cpu-demo.js';

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

describe('demo options', () => {
  it('keeps everything after the first = of an inline value', () => {
    expect(demoOptions(['--out=/tmp/a=b', '--lr=1e-3'], () => {}).out).toBe('/tmp/a=b');
    expect(demoOptions(['--lr=1e-3'], () => {}).lr).toBe(1e-3);
  });

  it.each([
    [['--sessions'], /--sessions needs a value/],
    [['--lr', 'fast'], /--lr: expected a non-negative number, got fast/],
    [['--lr', '0'], /--lr: expected a positive number, got 0/],
    [['--w-rl', '-1'], /--w-rl: expected a non-negative number/],
    [['--wrl', '1'], /unknown option --wrl \(known: /],
    [['--eval-samples', '0'], /--eval-samples: expected at least 1, got 0/],
  ])('%j is refused: %s', (argv, message) => {
    expect(() => demoOptions(argv, () => {})).toThrow(message);
  });
});

describe('the demo model', () => {
  it('is checked before anything starts, naming what is missing and how to build it', () => {
    const model = join(dir, 'model');
    mkdirSync(model, { recursive: true });
    writeFileSync(join(model, 'config.json'), '{}');
    expect(modelDirProblem(model)).toBe(`no demo model at ${model} (missing tokenizer.json, model.safetensors): \`npm run demo\` builds it (scripts/setup.sh), or pass --model DIR`);
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
  const result = (adapted: number | null): DemoResult => ({
    summary: {
      sessions: 8, passed: 3, bold: 4, list: 0, ended: { done: 8 }, rolling_window: 10,
      rolling_start: { session: 8, pass: 0.375, bold: 0.5, list: 0 }, rolling_end: { session: 8, pass: 0.375, bold: 0.5, list: 0 },
      rolling: [{ session: 8, pass: 0.375, bold: 0.5, list: 0 }], sessions_to_adaptation: adapted, wall_time_s: 61.4,
      batches: [{ batch: 'homework:openclawrl:1', rewards: { '1': 4, '-1': 12, '0': 0 } }],
      files: { sessions: '/o/results/sessions.jsonl', summary: '/o/results/summary.json', rates_plot: '/o/results/rates.svg', rewards_plot: '/o/results/rewards.svg' },
    },
    before: { samples: 40, bold: 0.6, list: 0 },
    after: { samples: 40, bold: 0.05, list: 0 },
    releasedBatches: ['homework:openclawrl:1'],
  });

  it('says what the adaptation count means, where the run state went and what to try next', () => {
    const text = describeSummary(result(null), '/o');
    expect(text).toContain('bold rate of 40 fresh first replies: 60% with the base weights → 5% after training');
    expect(text).toContain('bold rate (last 10): 50% at session 8 → 50% at session 8');
    expect(text).toContain('sessions_to_adaptation (first of 3 passed sessions in a row): not reached in 8');
    expect(text).toContain(`records and checkpoints: ${runStatePaths('/o').dataDir} (removed when the demo runs again); config: /o/serve.yaml`);
    expect(text).toMatch(/^next: .*npm run demo -- --w-opd 0/m);
    expect(describeSummary(result(5), '/o')).toContain('in a row): 5\n');
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
      const run = runDemo({ ...demoOptions(['--out', join(dir, 'out')], () => {}), signal: stop.signal });
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
