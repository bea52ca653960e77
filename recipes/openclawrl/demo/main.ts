import { armOptions, modelDirProblem, runArm, type ArmOptions } from './experiment.js';

/**
 * `node dist/recipes/openclawrl/demo/main.js [--full] [--seed 1] [--w-rl 1] [--w-opd 1] [--control] ...`:
 * one arm, the quick one (`--quick`, README's main command) unless `--full` asks for the
 * experiment's own.
 */
const log = (line: string) => process.stdout.write(`${line}\n`);
let options: ArmOptions | null = null;
try {
  const argv = process.argv.slice(2);
  const full = argv.includes('--full');
  options = armOptions(full ? argv.filter((a) => a !== '--full') : ['--quick', ...argv], log);
  if (!full) log(`the quick arm: ${options.sessions} sessions, held-out replies sampled only (no greedy pass, so no exact-match figure); \`npm run demo -- --full\` runs the experiment's arm (72 sessions, both passes), as in docs/experiment.md`);
  const problem = modelDirProblem(options.modelDir);
  if (problem !== null) throw new Error(problem);
} catch (err) {
  options = null;
  process.stderr.write(`demo: ${(err as Error).message}\n`);
  process.exitCode = 2;
}
if (options !== null) {
  // Dying on the default action would skip runArm's clean-up: the actors, the shim, Ray and the
  // engines run in process groups of their own, so Ctrl-C in the terminal does not reach them.
  const stop = new AbortController();
  let signals = 0;
  const onSignal = (sig: NodeJS.Signals) => {
    signals++;
    if (signals === 1) {
      process.stderr.write(`demo: ${sig}: stopping the stack (Ctrl-C twice more quits at once and may leave processes behind)\n`);
      stop.abort(new Error(`interrupted by ${sig}`));
    } else if (signals === 2) process.stderr.write('demo: still stopping, please wait\n');
    else process.exit(130);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    await runArm({ ...options, signal: stop.signal });
  } catch (err) {
    if (stop.signal.aborted) {
      process.stderr.write('demo: stopped\n');
      process.exitCode = 130;
    } else {
      process.stderr.write(`demo failed: ${(err as Error).stack ?? String(err)}\n`);
      process.exitCode = 1;
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}
