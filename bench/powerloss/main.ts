import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFakeEngine } from '../../test/helpers/fake-engine.js';
import { seeded } from '../../test/helpers/seeded.js';
import { powerRound, type Durability, type RoundResult } from './round.js';
import { commandLine } from '../cli-args.js';

const USAGE = `usage: npm run powerloss -- [--rounds 100] [--modes power,process] [--seed 1] [--clients 4] [--cut-ms 50-1500] [--keep]

Repeats the power-loss emulation (docs/benchmarks.md "The power-loss emulation"; at fsync
granularity, not a real power cut) against the real gateway: per round a fresh data dir, clients
logging each receipt to an fsynced log, a cut at a random moment after the first receipt, then a
check of the restored store. Prints each round and the counts per mode. Exits 1 when a 'power'
round lost a logged receipt, any restored store is unsound (integrity_check, offsets), or the
'process' control never lost one (the harness then showed nothing); 2 on bad flags. --keep keeps
the rounds' directories.`;

const cli = commandLine('powerloss', USAGE, {
  rounds: { type: 'string' },
  modes: { type: 'string' },
  seed: { type: 'string' },
  clients: { type: 'string' },
  'cut-ms': { type: 'string' },
  keep: { type: 'boolean' },
});
const values = cli.values;
// Annotated, so that the compiler knows a call ends the program.
const fail: (message: string) => never = cli.fail;

const int = (name: string, v: string | undefined, dflt: number): number => {
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) fail(`--${name} must be a positive integer, got ${JSON.stringify(v)}`);
  return n;
};
const rounds = int('rounds', values.rounds, 100);
const seed = int('seed', values.seed, 1);
const clients = int('clients', values.clients, 4);
const modes = (values.modes ?? 'power,process').split(',') as Durability[];
for (const m of modes) if (m !== 'power' && m !== 'process') fail(`--modes: ${JSON.stringify(m)} is not power or process`);
const range = /^(\d+)-(\d+)$/.exec(values['cut-ms'] ?? '50-1500');
if (!range || Number(range[1]) > Number(range[2])) fail(`--cut-ms takes MIN-MAX milliseconds (MIN ≤ MAX), got ${JSON.stringify(values['cut-ms'])}`);
const [cutMin, cutMax] = [Number(range[1]), Number(range[2])];

const rand = seeded(seed);
const engine = await startFakeEngine({ keepRequests: 16 });
const work = mkdtempSync(join(tmpdir(), 'reef-powerloss-'));
const results: RoundResult[] = [];
const stamp = () => new Date().toISOString().slice(11, 19);
let bad = 0;
try {
  // Modes interleaved, so both meet the same load on a shared machine.
  for (let r = 0; r < rounds; r++) {
    for (const durability of modes) {
      const cutAfterMs = Math.round(cutMin + rand() * (cutMax - cutMin));
      const dir = join(work, `${durability}-${r}`);
      const res = await powerRound({ durability, engineUrl: engine.url, dir, clients, cutAfterMs });
      results.push(res);
      const unsound = res.integrity !== 'ok' || !res.contiguous || res.unreadable.length > 0;
      const wrong = unsound || (durability === 'power' && res.lost.length > 0);
      if (wrong) bad++;
      process.stdout.write(
        `[powerloss ${stamp()}] ${durability.padEnd(7)} round ${r + 1}/${rounds}: cut at ${cutAfterMs} ms, ${res.logged} logged, ${res.lost.length} lost, ` +
          `${res.stored} stored, integrity ${res.integrity}, offsets ${res.contiguous ? 'contiguous' : 'NOT contiguous'}` +
          `${res.unreadable.length ? `, ${res.unreadable.length} unreadable` : ''}${wrong ? `  <-- VIOLATION (kept at ${dir})` : ''}\n`,
      );
      if (!wrong && !values.keep) rmSync(dir, { recursive: true, force: true });
    }
  }
} finally {
  await engine.close();
}

process.stdout.write('\nmode     rounds  logged  lost  rounds-with-loss  max-lost  unsound\n');
let controlFailed = false;
for (const durability of modes) {
  const rs = results.filter((r) => r.durability === durability);
  const lost = rs.reduce((n, r) => n + r.lost.length, 0);
  const withLoss = rs.filter((r) => r.lost.length > 0).length;
  const unsound = rs.filter((r) => r.integrity !== 'ok' || !r.contiguous || r.unreadable.length > 0).length;
  process.stdout.write(
    `${durability.padEnd(8)} ${String(rs.length).padStart(6)} ${String(rs.reduce((n, r) => n + r.logged, 0)).padStart(7)} ${String(lost).padStart(5)} ` +
      `${String(withLoss).padStart(17)} ${String(Math.max(0, ...rs.map((r) => r.lost.length))).padStart(9)} ${String(unsound).padStart(8)}\n`,
  );
  if (durability === 'process' && withLoss === 0) controlFailed = true;
}
if (controlFailed) process.stdout.write("\nthe 'process' control lost nothing: this run showed the harness can detect nothing\n");
if (bad === 0 && !values.keep) rmSync(work, { recursive: true, force: true });
else process.stdout.write(`\nrounds' directories: ${work}\n`);
process.exit(bad > 0 || controlFailed ? 1 : 0);
