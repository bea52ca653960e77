import { readRunFile } from '../../cluster/run-file.js';
import { descendants, runReef } from '../../test/helpers/stack.js';
import { type Rand } from '../../test/helpers/seeded.js';

/**
 * SIGKILL of the stack's own processes at seeded random intervals. A pid is killed only when the
 * stack's supervisor names it in its status and it is below that supervisor's process: never a
 * process found by name, which could be anyone's on a shared machine.
 */

export const KINDS = ['gateway', 'judge', 'prm', 'trainer-controller', 'shim'] as const;
export type Kind = (typeof KINDS)[number];

interface StackStatus {
  actors: Array<{ id: string; name: string; pid: number | null; state: string }>;
  shim: { pid: number | null; state: string };
}

export interface ChaosOptions {
  configPath: string;
  runDir: string;
  rand: Rand;
  /** Seconds between kills: uniform in [min, max]. */
  intervalS: { min: number; max: number };
  kinds: readonly Kind[];
  log: (line: string) => void;
}

export interface ChaosCounts {
  kills: Record<string, number>;
  /** Turns that found nothing of the chosen kind running (still restarting): nothing killed. */
  skipped: number;
}

async function stackStatus(configPath: string): Promise<StackStatus | null> {
  const r = await runReef(['status', '--json', '-c', configPath], { timeoutMs: 60_000 });
  if (r.code !== 0) return null;
  try {
    return JSON.parse(r.stdout) as StackStatus;
  } catch {
    return null;
  }
}

/** The pid and name of one running process of `kind`, or null while none runs. */
function target(st: StackStatus, kind: Kind, rand: Rand): { pid: number; name: string } | null {
  if (kind === 'shim') return st.shim.state === 'running' && st.shim.pid !== null ? { pid: st.shim.pid, name: 'shim' } : null;
  const live = st.actors.filter((a) => a.name === kind && a.state === 'running' && a.pid !== null);
  const a = live[Math.floor(rand() * live.length)];
  return a ? { pid: a.pid!, name: a.id } : null;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    // Removed again when the time is up: one listener left per kill added up over a long soak.
    const onAbort = () => (clearTimeout(t), resolve());
    const t = setTimeout(() => (signal.removeEventListener('abort', onAbort), resolve()), ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * Kills until `signal` aborts. Kinds come in seeded shuffled rounds, so a short run still hits
 * each kind once before any twice.
 */
export async function runChaos(o: ChaosOptions, signal: AbortSignal, counts: ChaosCounts): Promise<void> {
  let round: Kind[] = [];
  const t0 = Date.now();
  while (!signal.aborted) {
    await sleep((o.intervalS.min + o.rand() * (o.intervalS.max - o.intervalS.min)) * 1000, signal);
    if (signal.aborted) return;
    if (round.length === 0) round = shuffle([...o.kinds], o.rand);
    const kind = round.shift()!;
    const st = await stackStatus(o.configPath);
    const supervisor = readRunFile(o.runDir)?.pid ?? null;
    const t = st && target(st, kind, o.rand);
    const at = `${Math.floor((Date.now() - t0) / 60_000)}:${String(Math.floor(((Date.now() - t0) / 1000) % 60)).padStart(2, '0')}`;
    if (!t || supervisor === null || !descendants(supervisor).includes(t.pid)) {
      counts.skipped++;
      o.log(`${at} no ${kind} running to kill (restarting); skipped`);
      continue;
    }
    try {
      process.kill(t.pid, 'SIGKILL');
      counts.kills[kind] = (counts.kills[kind] ?? 0) + 1;
      o.log(`${at} kill -9 ${t.name} (pid ${t.pid})`);
    } catch (err) {
      counts.skipped++;
      o.log(`${at} ${t.name} (pid ${t.pid}) was gone before the kill: ${(err as Error).message}`);
    }
  }
}

function shuffle<T>(xs: T[], rand: Rand): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}
