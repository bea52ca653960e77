import { ablationOptions, runAblation, type AblationOptions } from './ablation.js';

/** `node dist/recipes/openclawrl/demo/ablation-main.js [--seeds 1,2,3] [--arms control,rl,opd,both] [--out DIR] [arm flags...]` */
const log = (line: string) => process.stdout.write(`${line}\n`);
let options: AblationOptions | null = null;
try {
  options = ablationOptions(process.argv.slice(2), log);
} catch (err) {
  process.stderr.write(`demo:ablation: ${(err as Error).message}\n`);
  process.exitCode = 2;
}
if (options !== null) {
  // As in main.ts: the stack's processes are in groups of their own, so a signal must go through clean-up.
  const stop = new AbortController();
  let signals = 0;
  const onSignal = (sig: NodeJS.Signals) => {
    signals++;
    if (signals === 1) {
      process.stderr.write(`demo:ablation: ${sig}: stopping the arm in progress (finished arms are kept; run again to go on)\n`);
      stop.abort(new Error(`interrupted by ${sig}`));
    } else if (signals >= 3) process.exit(130);
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    await runAblation({ ...options, signal: stop.signal });
  } catch (err) {
    process.stderr.write(stop.signal.aborted ? 'demo:ablation: stopped\n' : `demo:ablation failed: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = stop.signal.aborted ? 130 : 1;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}
