import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { type BenchSuite, printTable, writeResult } from './lib.js';

/**
 * `npm run bench [suite...]`: runs every suite in `bench/suites/` (each module exports `suite`),
 * prints one table per suite and writes `bench/out/<suite>.json`. `REEF_BENCH_SECONDS` sets the
 * seconds per case (default 2). A suite that throws is reported and the others still run.
 */
async function loadSuites(): Promise<BenchSuite[]> {
  const dir = join(dirname(fileURLToPath(import.meta.url)), 'suites');
  const files = readdirSync(dir).filter((f) => f.endsWith('.js')).sort();
  const suites: BenchSuite[] = [];
  for (const file of files) {
    const mod = (await import(pathToFileURL(join(dir, file)).href)) as { suite?: BenchSuite };
    if (mod.suite === undefined) throw new Error(`bench/suites/${file} exports no \`suite\``);
    suites.push(mod.suite);
  }
  return suites;
}

async function main(): Promise<number> {
  const wanted = process.argv.slice(2);
  const seconds = Number(process.env.REEF_BENCH_SECONDS ?? 2);
  if (!(seconds > 0)) throw new Error(`REEF_BENCH_SECONDS must be a positive number, got ${process.env.REEF_BENCH_SECONDS}`);
  const all = await loadSuites();
  const unknown = wanted.filter((w) => !all.some((s) => s.name === w));
  if (unknown.length > 0) throw new Error(`unknown suite(s) ${unknown.join(', ')}; have ${all.map((s) => s.name).join(', ')}`);
  const chosen = wanted.length > 0 ? all.filter((s) => wanted.includes(s.name)) : all;
  let failed = 0;
  for (const suite of chosen) {
    const log = (line: string): void => console.error(`bench ${suite.name}: ${line}`);
    log(`${suite.description} (${seconds} s per case)`);
    try {
      const rows = await suite.run({ seconds, log });
      printTable(`${suite.name}: ${suite.description}`, rows);
      log(`wrote ${writeResult(suite.name, rows)}`);
    } catch (err) {
      failed++;
      log(`failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    }
  }
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exit(1);
  },
);
