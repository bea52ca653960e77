import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface, type Interface } from 'node:readline';
import { Pool } from 'undici';
import { repoRoot } from '../../cluster/paths.js';
import { ACTOR_NODE_FLAGS } from '../../cluster/supervisor.js';
import { CPU_EXAMPLE, rawConfig } from '../../test/gateway/harness.js';
import { type BenchContext, type BenchRow, type BenchSuite, measureCalls, toRow } from '../lib.js';

/**
 * The gateway's event-loop delay while an engine streams pathological output (security review
 * H7): 40,000 characters of whitespace, which a degenerate model emits unaided, and 40,000
 * characters that keep matching the start of a 256-character stop string, each beside a benign
 * stream. Baseline: the benign stream alone, in the same run. The delay is Node's
 * `monitorEventLoopDelay` inside the gateway process (1 ms resolution), reset before each case.
 *
 * Three processes: the clients here, the fake engine (`test/helpers/fake-engine.ts`, choosing its
 * output by the request's `seed`) and the gateway, so that neither's work lands on the loop that
 * is measured.
 */

const WHITESPACE_SEED = 1;
const STOP_PREFIX_SEED = 2;
/** A stop string as long as the gateway allows (MAX_STOP_LENGTH); the output repeats its first 255 characters. */
const STOP = `${'x'.repeat(255)}!`;

/** The engine double's choice of output: 40,000 characters in 100-character tokens, or a short benign answer. */
const ENGINE_SCRIPT = (fakeJs: string) => `
const { startFakeEngine } = await import(${JSON.stringify(fakeJs)});
const benign = Array.from({ length: 64 }, (_, i) => ' word' + i);
const e = await startFakeEngine({
  keepRequests: 0,
  respond: ({ body }) => {
    const seed = body.sampling_params?.sampling_seed;
    if (seed === ${WHITESPACE_SEED}) return { pieces: ['Answer:', ...Array.from({ length: 400 }, () => ' '.repeat(100)), 'end'], finish: 'length' };
    if (seed === ${STOP_PREFIX_SEED}) return { pieces: ['Answer:', ...Array.from({ length: 400 }, () => 'x'.repeat(100)), 'end'], finish: 'length' };
    return { pieces: benign };
  },
});
console.log(e.url);
`;

/** The gateway with a loop-delay histogram that the bench resets and reads over stdin and stdout. */
const GATEWAY_SCRIPT = (root: string) => `
import { readFileSync } from 'node:fs';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
const { resolveConfig } = await import(${JSON.stringify(join(root, 'dist/cluster/config/index.js'))});
const { startGateway } = await import(${JSON.stringify(join(root, 'dist/actors/gateway/index.js'))});
const [configPath, baseDir, engineUrl] = process.argv.slice(1);
const config = await resolveConfig(JSON.parse(readFileSync(configPath, 'utf8')), { baseDir });
const gw = await startGateway({ config, engineUrl, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: 1 });
const h = monitorEventLoopDelay({ resolution: 1 });
h.enable();
createInterface({ input: process.stdin }).on('line', (l) => {
  if (l === 'reset') { h.reset(); console.log('{}'); }
  if (l === 'stats') console.log(JSON.stringify({ p50: h.percentile(50) / 1e3, p99: h.percentile(99) / 1e3, max: h.max / 1e3, count: h.count }));
});
process.once('SIGTERM', () => void gw.close().then(() => process.exit(0)));
console.log(gw.url);
`;

function child(args: string[]): { child: ChildProcess; lines: Interface; exited: Promise<void> } {
  const c = spawn(process.execPath, args, { cwd: repoRoot(), stdio: ['pipe', 'pipe', 'inherit'] });
  return { child: c, lines: createInterface({ input: c.stdout! }), exited: new Promise((r) => c.once('exit', () => r())) };
}

/** CPU seconds (user + system) a process has used, from /proc (Linux; null elsewhere). */
function cpuSeconds(pid: number): number | null {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '').split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return null;
  }
}

const nextLine = (lines: Interface) => new Promise<string>((resolve) => lines.once('line', resolve));

/** Reads a whole streamed completion, as a client that keeps up with it. */
async function streamChat(pool: Pool, body: Record<string, unknown>): Promise<void> {
  const res = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', stream: true, ...body }) });
  if (res.statusCode !== 200) throw new Error(`gateway answered ${res.statusCode}: ${await res.body.text()}`);
  for await (const _ of res.body);
}

export const suite: BenchSuite = {
  name: 'eventloop',
  description: "gateway event-loop delay (monitorEventLoopDelay, µs) while the engine streams 40k whitespace or stop-string prefixes, beside a benign stream",
  async run(ctx: BenchContext): Promise<BenchRow[]> {
    const root = repoRoot();
    const dir = mkdtempSync(join(tmpdir(), 'reef-bench-loop-'));
    const configPath = join(dir, 'config.json');
    writeFileSync(configPath, JSON.stringify(rawConfig(join(dir, 'data'))));
    const engine = child(['--input-type=module', '-e', ENGINE_SCRIPT(join(root, 'dist/test/helpers/fake-engine.js'))]);
    const engineUrl = await nextLine(engine.lines);
    const gw = child([...ACTOR_NODE_FLAGS['gateway']!, '--input-type=module', '-e', GATEWAY_SCRIPT(root), configPath, dirname(CPU_EXAMPLE), engineUrl]);
    const gatewayUrl = await nextLine(gw.lines);
    ctx.log(`gateway pid ${gw.child.pid} at ${gatewayUrl}, fake engine pid ${engine.child.pid} at ${engineUrl}`);
    const ask = async (cmd: 'reset' | 'stats') => {
      const line = nextLine(gw.lines);
      gw.child.stdin!.write(`${cmd}\n`);
      return JSON.parse(await line) as { p50: number; p99: number; max: number; count: number };
    };
    const pool = new Pool(gatewayUrl, { connections: 8 });
    const benign = () => streamChat(pool, { messages: [{ role: 'user', content: 'Say something short.' }] });
    const patho = (seed: number) => () => streamChat(pool, { messages: [{ role: 'user', content: 'Go on.' }], seed, max_tokens: 1000, ...(seed === STOP_PREFIX_SEED ? { stop: [STOP] } : {}) });
    const rows: BenchRow[] = [];
    try {
      // Warm: parser, tokenizer and both paths optimized before anything is measured.
      await measureCalls(benign, { seconds: 2, warmupS: 0 });
      await measureCalls(patho(WHITESPACE_SEED), { seconds: 1, warmupS: 0 });
      await measureCalls(patho(STOP_PREFIX_SEED), { seconds: 1, warmupS: 0 });
      const cases: Array<[string, (() => Promise<void>) | null]> = [
        ['benign stream alone (baseline)', null],
        ['benign + 40k whitespace stream', patho(WHITESPACE_SEED)],
        ['benign + 40k stop-prefix stream', patho(STOP_PREFIX_SEED)],
      ];
      for (const [name, background] of cases) {
        await ask('reset');
        const cpu0 = [cpuSeconds(gw.child.pid!), cpuSeconds(engine.child.pid!)];
        let stop = false;
        let pathological = 0;
        const loop = background
          ? (async () => {
              while (!stop) {
                await background();
                pathological++;
              }
            })()
          : Promise.resolve();
        const m = await measureCalls(benign, { seconds: ctx.seconds, warmupS: 0.2 });
        stop = true;
        await loop;
        const lag = await ask('stats');
        const cpu1 = [cpuSeconds(gw.child.pid!), cpuSeconds(engine.child.pid!)];
        // Where the CPU went: the gateway's loop and workers, or the engine double serialising events.
        const share = (i: number) => (cpu0[i] === null || cpu1[i] === null ? '?' : ((cpu1[i]! - cpu0[i]!) / m.seconds).toFixed(2));
        rows.push({ case: name, impl: 'gateway loop delay', ops: lag.count, seconds: m.seconds, opsPerSec: 0, p50Us: Math.round(lag.p50), p99Us: Math.round(lag.p99), mbPerSec: null, maxUs: Math.round(lag.max) });
        rows.push({ ...toRow(name, 'benign request', m), maxUs: Math.round(Math.max(...m.latenciesUs)) });
        ctx.log(`${name}: loop delay p50 ${Math.round(lag.p50)} µs, p99 ${Math.round(lag.p99)} µs, max ${Math.round(lag.max)} µs; ${m.ops} benign requests, ${pathological} pathological streams; CPU per second: gateway ${share(0)}, engine double ${share(1)}`);
      }
    } finally {
      await pool.close();
      gw.child.kill('SIGTERM');
      engine.child.kill('SIGKILL');
      await Promise.all([gw.exited, engine.exited]);
      rmSync(dir, { recursive: true, force: true });
    }
    return rows;
  },
};
