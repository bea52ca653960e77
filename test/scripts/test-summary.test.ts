import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cluster/paths.js';

/** scripts/test-summary.mjs: the closing line of `npm test` and its exit code. */

const dir = mkdtempSync(join(tmpdir(), 'reef-test-summary-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Status = 'passed' | 'failed' | 'skipped' | 'pending' | 'todo';
const file = (name: string, status: 'passed' | 'failed', tests: Status[], message = '') => ({ name, status, message, assertionResults: tests.map((s, i) => ({ title: `t${i}`, status: s })) });

/** Written the way vitest's JSON reporter writes it (its counters as vitest computes them). */
function vitestReport(files: ReturnType<typeof file>[]): string {
  const all = files.flatMap((f) => f.assertionResults.map((a) => a.status));
  const path = join(dir, `vitest-${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(path, JSON.stringify({
    numFailedTestSuites: files.filter((f) => f.status === 'failed').length,
    numPassedTests: all.filter((s) => s === 'passed').length,
    numFailedTests: all.filter((s) => s === 'failed').length,
    numPendingTests: all.filter((s) => s === 'skipped' || s === 'pending').length,
    numTodoTests: all.filter((s) => s === 'todo').length,
    success: files.every((f) => f.status === 'passed'),
    testResults: files,
  }));
  return path;
}

function pytestReport(tests: number, failures = 0, errors = 0, skipped = 0): string {
  const path = join(dir, `pytest-${tests}-${failures}-${errors}-${skipped}.xml`);
  writeFileSync(path, `<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="${errors}" failures="${failures}" skipped="${skipped}" tests="${tests}" time="1.0"></testsuite></testsuites>`);
  return path;
}

function summary(...args: string[]): { line: string; out: string; code: number | null } {
  const r = spawnSync(process.execPath, [join(repoRoot(), 'scripts', 'test-summary.mjs'), ...args], { encoding: 'utf8' });
  const out = r.stdout;
  return { line: out.trim().split('\n').at(-1)!, out, code: r.status };
}

const pytestOk = pytestReport(5, 0, 0, 1);

describe('test summary', () => {
  it('adds both reports up', () => {
    const v = vitestReport([file('a.test.ts', 'passed', ['passed', 'passed', 'skipped', 'todo'])]);
    expect(summary(v, pytestOk, '0', '0')).toMatchObject({ line: 'reef: 6 passed, 0 failed, 3 skipped', code: 0 });
    expect(summary(v, pytestOk)).toMatchObject({ line: 'reef: 6 passed, 0 failed, 3 skipped', code: 0 });
  });

  it('counts the tests of a file whose beforeAll threw as failed, not skipped', () => {
    // vitest marks such tests skipped and numFailedTests stays 0 (regression: "0 failed", exit 0).
    const v = vitestReport([file('a.test.ts', 'passed', ['passed']), file('b.test.ts', 'failed', ['skipped', 'skipped'], 'boom')]);
    const s = summary(v, pytestOk, '1', '0');
    expect(s).toMatchObject({ line: 'reef: 5 passed, 2 failed, 1 skipped', code: 1 });
    expect(s.out).toContain('b.test.ts failed outside its tests: boom');
  });

  it('counts a file that did not load as a failure', () => {
    const v = vitestReport([file('a.test.ts', 'passed', ['passed']), file('c.test.ts', 'failed', [], 'Cannot find module')]);
    expect(summary(v, pytestOk, '1', '0')).toMatchObject({ line: 'reef: 5 passed, 1 failed, 1 skipped', code: 1 });
  });

  it('fails when a runner exited non-zero with no failed test in its report', () => {
    const v = vitestReport([file('a.test.ts', 'passed', ['passed'])]);
    const unhandled = summary(v, pytestOk, '1', '0');
    expect(unhandled).toMatchObject({ line: 'reef: 5 passed, 1 failed, 1 skipped', code: 1 });
    expect(unhandled.out).toContain('vitest exited 1 without a failed test');
    // pytest's exit 5: it collected nothing.
    expect(summary(v, pytestReport(0), '0', '5')).toMatchObject({ line: 'reef: 1 passed, 1 failed, 0 skipped', code: 1 });
  });

  it('counts pytest failures and errors, and a missing report', () => {
    const v = vitestReport([file('a.test.ts', 'passed', ['passed'])]);
    expect(summary(v, pytestReport(6, 1, 1, 1), '0', '1')).toMatchObject({ line: 'reef: 4 passed, 2 failed, 1 skipped', code: 1 });
    expect(summary(v, join(dir, 'none.xml'), '0', '4')).toMatchObject({ line: 'reef: 1 passed, 1 failed, 0 skipped', code: 1 });
    expect(summary(join(dir, 'none.json'), pytestOk, '1', '0')).toMatchObject({ line: 'reef: 4 passed, 1 failed, 1 skipped', code: 1 });
  });
});
