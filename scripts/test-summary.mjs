// Adds up vitest's JSON report and pytest's JUnit XML into one closing line that CI can read.
// Usage: node scripts/test-summary.mjs VITEST_JSON PYTEST_XML [VITEST_EXIT PYTEST_EXIT]
import { readFileSync, existsSync } from 'node:fs';

const [vitestPath, pytestPath, vitestExit, pytestExit] = process.argv.slice(2);
let passed = 0, failed = 0, skipped = 0;

/** A runner that exited non-zero must show as a failure even when its report names no failed test. */
function exitFailure(name, exit, failures) {
  if (exit === undefined || Number(exit) === 0 || failures > 0) return 0;
  console.log(`reef: ${name} exited ${exit} without a failed test in its report`);
  return 1;
}

let vitestFailed = 0;
if (existsSync(vitestPath)) {
  const r = JSON.parse(readFileSync(vitestPath, 'utf8'));
  // Counted per file from the assertions, not from numPendingTests: a file whose hook threw reports
  // its tests as skipped (and pending counts tests left running), and a file that did not load has
  // no tests at all; both only show in the file's own status.
  for (const file of r.testResults ?? []) {
    const statuses = (file.assertionResults ?? []).map((a) => a.status);
    const ok = statuses.filter((s) => s === 'passed').length;
    const bad = statuses.filter((s) => s === 'failed').length;
    const notRun = statuses.length - ok - bad;
    passed += ok;
    if (file.status === 'failed' && bad === 0) {
      console.log(`reef: ${file.name} failed outside its tests: ${(file.message || 'see the vitest output').split('\n')[0]}`);
      vitestFailed += Math.max(1, notRun);
    } else {
      vitestFailed += bad;
      skipped += notRun;
    }
  }
} else {
  console.log('reef: vitest wrote no report');
  vitestFailed += 1;
}
failed += vitestFailed + exitFailure('vitest', vitestExit, vitestFailed);

let pytestFailed = 0;
if (existsSync(pytestPath)) {
  const xml = readFileSync(pytestPath, 'utf8');
  const m = xml.match(/<testsuite [^>]*>/);
  const attr = (name) => Number((m?.[0].match(new RegExp(`${name}="(\\d+)"`)) ?? [])[1] ?? 0);
  const tests = attr('tests'), errors = attr('errors'), failures = attr('failures'), skips = attr('skipped');
  passed += tests - errors - failures - skips;
  pytestFailed += errors + failures;
  skipped += skips;
} else {
  console.log('reef: pytest wrote no report');
  pytestFailed += 1;
}
// pytest exits 5 when it collects nothing: a failure of the suite here, with nothing failed in the XML.
failed += pytestFailed + exitFailure('pytest', pytestExit, pytestFailed);

const total = passed + failed;
console.log(`reef: ${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(failed > 0 || total === 0 ? 1 : 0);
