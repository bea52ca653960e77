import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ReefError } from '../../../actors/runtime/errors.js';
import { generateProblems, loadGsm8k, parseGsm8kRecord, PROBLEM_FAMILIES, prng, verifyProblem } from './problems.js';

describe('generated problems', () => {
  const problems = generateProblems();

  it('is 72 problems, the same for the same seed, different for another', () => {
    expect(problems).toHaveLength(72);
    expect(generateProblems()).toEqual(problems);
    expect(generateProblems(72, 7).map((p) => p.question)).not.toEqual(problems.map((p) => p.question));
    expect(new Set(problems.map((p) => p.id)).size).toBe(72);
  });

  it('has every family, evenly', () => {
    expect(PROBLEM_FAMILIES.length).toBeGreaterThanOrEqual(5);
    for (const f of PROBLEM_FAMILIES) expect(problems.filter((p) => p.family === f)).toHaveLength(72 / PROBLEM_FAMILIES.length);
  });

  it('has verified integer answers whose steps compute them', () => {
    for (const p of problems) {
      expect(verifyProblem(p), p.id).toEqual([]);
      expect(Number.isInteger(p.answer)).toBe(true);
      expect(p.answer).toBeGreaterThan(0);
      expect(p.solution_steps.length).toBeGreaterThanOrEqual(2);
    }
    expect(new Set(problems.map((p) => p.question)).size).toBe(72);
  });

  it('verification catches a wrong step and a wrong answer', () => {
    const p = problems[0]!;
    const badStep = { ...p, solution_steps: [p.solution_steps[0]!.replace(/= (\d+)/, (_m, n: string) => `= ${Number(n) + 1}`), ...p.solution_steps.slice(1)] };
    expect(verifyProblem(badStep).join()).toMatch(/does not hold/);
    expect(verifyProblem({ ...p, answer: p.answer + 1 }).join()).toMatch(/is not the answer/);
    expect(verifyProblem({ ...p, solution_steps: ['No work shown.'] }).join()).toMatch(/shows no equation/);
  });

  it('prng is deterministic and in [0, 1)', () => {
    const a = prng(42);
    const b = prng(42);
    const xs = Array.from({ length: 1000 }, () => a());
    expect(xs).toEqual(Array.from({ length: 1000 }, () => b()));
    expect(Math.min(...xs)).toBeGreaterThanOrEqual(0);
    expect(Math.max(...xs)).toBeLessThan(1);
  });
});

describe('GSM8K format', () => {
  const dir = mkdtempSync(join(tmpdir(), 'reef-gsm8k-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('parses the answer line, commas included, and strips calculator marks', () => {
    const p = parseGsm8kRecord({ question: ' How many? ', answer: 'She sold 48/2 = <<48/2=24>>24 clips.\nIn all 1,210 + 24 = <<1210+24=1234>>1,234.\n#### 1,234' }, 'x');
    expect(p).toEqual({ id: 'x', family: 'gsm8k', question: 'How many?', answer: 1234, solution_steps: ['She sold 48/2 = 24 clips.', 'In all 1,210 + 24 = 1,234.'] });
    expect(parseGsm8kRecord({ question: 'q', answer: '#### -5' }, 'y').answer).toBe(-5);
    expect(parseGsm8kRecord({ question: 'q', answer: 'x\n####  $70' }, 'y').answer).toBe(70);
  });

  it.each([
    [{ question: 'q', answer: 'no marker 5' }, /no "#### N"/],
    [{ question: 'q', answer: '#### 2.5' }, /not an integer/],
    [{ question: 'q', answer: '#### five' }, /not an integer/],
    [{ question: 'q' }, /question and answer/],
  ])('rejects %j', (rec, msg) => {
    expect(() => parseGsm8kRecord(rec, 'z')).toThrow(msg);
  });

  it('loads a JSONL file with a limit, naming the line of a bad record', () => {
    const ok = join(dir, 'ok.jsonl');
    writeFileSync(ok, [{ question: 'a', answer: '1 + 1 = 2\n#### 2' }, { question: 'b', answer: '#### 3' }, { question: 'c', answer: '#### 4' }].map((r) => JSON.stringify(r)).join('\n') + '\n\n');
    expect(loadGsm8k(ok).map((p) => [p.id, p.answer])).toEqual([['gsm8k-0001', 2], ['gsm8k-0002', 3], ['gsm8k-0003', 4]]);
    expect(loadGsm8k(ok, 2)).toHaveLength(2);
    const bad = join(dir, 'bad.jsonl');
    writeFileSync(bad, `${JSON.stringify({ question: 'a', answer: '#### 2' })}\n{not json\n`);
    expect(() => loadGsm8k(bad)).toThrow(/bad\.jsonl:2/);
    try {
      loadGsm8k(join(dir, 'missing.jsonl'));
      expect.unreachable();
    } catch (err) {
      expect((err as ReefError).code).toBe('REEF_ERR_INVALID_ARGUMENT');
    }
  });
});
