import { KINDS, type Kind } from './chaos.js';
import { runSoak, SOAK_DEFAULTS, summaryLines } from './soak.js';
import { commandLine } from '../cli-args.js';

const USAGE = `usage: npm run soak -- [--minutes 30] [--seed 1] [--sessions 4] [--streamed 0.5] [--kill-every 5-60] [--kinds gateway,judge,prm,trainer-controller,shim] [--batch-size 4] [--drain-s 600]

Runs a stack on the tiny model with the rule PRM double, tagged client sessions, and kill -9 of
random actors and the shim; then drains and checks the invariants (docs/benchmarks.md). Exits 1 on
any violation, 2 on bad flags.`;

const cli = commandLine('soak', USAGE, {
  minutes: { type: 'string' },
  seed: { type: 'string' },
  sessions: { type: 'string' },
  streamed: { type: 'string' },
  'kill-every': { type: 'string' },
  kinds: { type: 'string' },
  'batch-size': { type: 'string' },
  'drain-s': { type: 'string' },
});
const values = cli.values;
// Annotated, so that the compiler knows a call ends the program.
const fail: (message: string) => never = cli.fail;

const positive = (name: string, v: string | undefined, dflt: number, integer = false): number => {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!(n > 0) || !Number.isFinite(n) || (integer && !Number.isInteger(n))) fail(`--${name} must be a positive ${integer ? 'integer' : 'number'}, got ${JSON.stringify(v)}`);
  return n;
};
const every = values['kill-every'] ?? `${SOAK_DEFAULTS.killEveryS.min}-${SOAK_DEFAULTS.killEveryS.max}`;
const m = /^(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)$/.exec(every);
if (!m || !(Number(m[1]) > 0) || Number(m[1]) > Number(m[2])) fail(`--kill-every takes MIN-MAX seconds (0 < MIN ≤ MAX), got ${JSON.stringify(every)}`);
const streamed = values.streamed === undefined ? SOAK_DEFAULTS.streamed : Number(values.streamed);
if (!(streamed >= 0 && streamed <= 1)) fail(`--streamed is the share of requests sent streamed, from 0 to 1, got ${JSON.stringify(values.streamed)}`);
const kinds = values.kinds === undefined ? KINDS : values.kinds.split(',');
for (const k of kinds) if (!(KINDS as readonly string[]).includes(k)) fail(`--kinds: ${JSON.stringify(k)} is not one of ${KINDS.join(', ')}`);

const stamp = () => new Date().toISOString().slice(11, 19);
const result = await runSoak({
  minutes: positive('minutes', values.minutes, SOAK_DEFAULTS.minutes),
  seed: positive('seed', values.seed, SOAK_DEFAULTS.seed, true),
  sessions: positive('sessions', values.sessions, SOAK_DEFAULTS.sessions, true),
  streamed,
  killEveryS: { min: Number(m[1]), max: Number(m[2]) },
  kinds: kinds as Kind[],
  batchSize: positive('batch-size', values['batch-size'], SOAK_DEFAULTS.batchSize, true),
  drainS: positive('drain-s', values['drain-s'], SOAK_DEFAULTS.drainS),
  log: (line) => process.stdout.write(`[soak ${stamp()}] ${line}\n`),
});
for (const line of summaryLines(result)) process.stdout.write(`${line}\n`);
process.stdout.write(`files and summary.json in ${result.dir}\n`);
process.exit(result.violations.length > 0 ? 1 : 0);
