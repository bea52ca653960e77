import { demoOptions, describeSummary, runDemo } from './cpu-demo.js';

/** `node dist/recipes/openclawrl/demo/main.js [--w-rl 1] [--w-opd 1] [--sessions 60] ...` */
const log = (line: string) => process.stdout.write(`${line}\n`);
try {
  const summary = await runDemo(demoOptions(process.argv.slice(2), log));
  log(describeSummary(summary));
} catch (err) {
  process.stderr.write(`demo failed: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
}
