// Adds up vitest's JSON report and pytest's JUnit XML into one closing line that CI can read.
import { readFileSync, existsSync } from 'node:fs';

const [vitestPath, pytestPath] = process.argv.slice(2);
let passed = 0, failed = 0, skipped = 0;

if (existsSync(vitestPath)) {
  const r = JSON.parse(readFileSync(vitestPath, 'utf8'));
  passed += r.numPassedTests ?? 0;
  failed += (r.numFailedTests ?? 0);
  skipped += (r.numPendingTests ?? 0) + (r.numTodoTests ?? 0);
  if (r.numFailedTestSuites) failed += 0; // suite-level failures already fail the vitest exit code
} else {
  console.log('reef: vitest wrote no report');
  failed += 1;
}
if (existsSync(pytestPath)) {
  const xml = readFileSync(pytestPath, 'utf8');
  const m = xml.match(/<testsuite [^>]*>/);
  const attr = (name) => Number((m?.[0].match(new RegExp(`${name}="(\\d+)"`)) ?? [])[1] ?? 0);
  const tests = attr('tests'), errors = attr('errors'), failures = attr('failures'), skips = attr('skipped');
  passed += tests - errors - failures - skips;
  failed += errors + failures;
  skipped += skips;
} else {
  console.log('reef: pytest wrote no report');
  failed += 1;
}
const total = passed + failed;
console.log(`reef: ${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(failed > 0 || total === 0 ? 1 : 0);
