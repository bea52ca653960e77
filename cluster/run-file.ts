import { existsSync, linkSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ReefError } from '../actors/runtime/errors.js';

/**
 * `<data_dir>/run/supervisor.json`: how `reef status|scale|down` find a stack, and what keeps two
 * `reef up` from running on one data dir. `reef up` creates it exclusively before anything else
 * (`state: 'starting'`, no control endpoint yet), rewrites it once everything is up
 * (`state: 'running'`), and removes it when done, only if it is still its own. A file whose pid is
 * gone, or now another process's, is stale (the stack was killed) and is treated as absent.
 */
export interface RunFile {
  pid: number;
  state: 'starting' | 'running';
  /** The supervisor's control endpoint; null while starting. */
  control: string | null;
  startedAt: number;
  configPath: string;
  gateway: string;
}

export function runFilePath(runDir: string): string {
  return join(runDir, 'supervisor.json');
}

export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** `/proc` start times count whole clock ticks from a boot time given in whole seconds. */
const PID_REUSE_SLACK_MS = 5000;

/** When `pid` started (ms epoch), from /proc; null where that cannot be read (not Linux, gone). */
export function processStartMs(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name, which may itself hold spaces and parentheses.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[19]);
    const btime = Number(/^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))?.[1]);
    if (!Number.isFinite(ticks) || !Number.isFinite(btime)) return null;
    // USER_HZ, which the kernel fixes at 100 for every user-space interface.
    return btime * 1000 + ticks * 10;
  } catch {
    return null;
  }
}

/**
 * When the process now holding `rf.pid` started, if it started after the stack wrote `startedAt`:
 * the stack died without removing its file and its pid went to another process. Null otherwise,
 * and where /proc cannot tell (the pid is then trusted).
 */
export function reusedSince(rf: RunFile): number | null {
  const started = processStartMs(rf.pid);
  return started !== null && started > rf.startedAt + PID_REUSE_SLACK_MS ? started : null;
}

/** Whether the stack of `rf` is still there: its pid alive and not another process's. */
function holds(rf: RunFile): boolean {
  return pidAlive(rf.pid) && reusedSince(rf) === null;
}

function parse(path: string): RunFile | null {
  try {
    const rf = JSON.parse(readFileSync(path, 'utf8')) as RunFile;
    // kill(0) and kill(-1) reach this process group and every process of the user: a file whose pid
    // is not one process (edited by hand, damaged) named a stack that `down` would "stop" that way.
    if (!Number.isSafeInteger(rf.pid) || rf.pid <= 0) return null;
    // A file written before `state` existed belongs to a stack that was up.
    return { ...rf, state: rf.state === 'starting' ? 'starting' : 'running', control: rf.control ?? null };
  } catch {
    return null;
  }
}

export function readRunFile(runDir: string): RunFile | null {
  const path = runFilePath(runDir);
  if (!existsSync(path)) return null;
  const rf = parse(path);
  return rf !== null && holds(rf) ? rf : null;
}

/** A run file left by a stack whose pid another process has since taken (see `reusedSince`), or null. */
export function reusedRunFile(runDir: string): { rf: RunFile; startedMs: number } | null {
  const path = runFilePath(runDir);
  const rf = existsSync(path) ? parse(path) : null;
  const startedMs = rf !== null && pidAlive(rf.pid) ? reusedSince(rf) : null;
  return rf !== null && startedMs !== null ? { rf, startedMs } : null;
}

/** A run file left by a stack whose process is gone (it was killed, so it could not remove it), or null. */
export function deadRunFile(runDir: string): RunFile | null {
  const path = runFilePath(runDir);
  const rf = existsSync(path) ? parse(path) : null;
  return rf !== null && !pidAlive(rf.pid) ? rf : null;
}

/**
 * Create the run file of a starting stack, or fail with REEF_ERR_ALREADY_RUNNING when a live stack
 * holds it. The file is written aside and hard-linked into place, which fails if the name exists:
 * of two `reef up` only one gets past this point, and no reader sees half a file.
 */
export function claimRunFile(runDir: string, rf: RunFile): void {
  const path = runFilePath(runDir);
  const mine = `${path}.new-${process.pid}`;
  writeFileSync(mine, JSON.stringify(rf, null, 2));
  try {
    for (let attempt = 0; ; attempt++) {
      try {
        linkSync(mine, path);
        return;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
        const holder = parse(path);
        if (attempt > 0 || (holder !== null && holds(holder))) {
          throw new ReefError('REEF_ERR_ALREADY_RUNNING', { pid: holder?.pid ?? '?', endpoint: holder?.control ?? 'none yet: still starting' });
        }
        removeStale(path);
      }
    }
  } finally {
    rmSync(mine, { force: true });
  }
}

/** Move a stale file aside first: if another `reef up` replaced it meanwhile, put that one back. */
function removeStale(path: string): void {
  const aside = `${path}.stale-${process.pid}`;
  try {
    renameSync(path, aside);
  } catch {
    return; // someone else removed it
  }
  const moved = parse(aside);
  if (moved !== null && holds(moved)) {
    try {
      linkSync(aside, path);
    } catch {
      // a third one already claimed the name
    }
  }
  rmSync(aside, { force: true });
}

/** Replace this process's run file (write then rename, so a reader never sees half a file). */
export function writeRunFile(runDir: string, rf: RunFile): void {
  const path = runFilePath(runDir);
  writeFileSync(`${path}.tmp-${process.pid}`, JSON.stringify(rf, null, 2));
  renameSync(`${path}.tmp-${process.pid}`, path);
}

/** Remove the run file if it is this process's (`pid`); another stack's file is left alone. */
export function clearRunFile(runDir: string, pid: number = process.pid): void {
  const path = runFilePath(runDir);
  if (parse(path)?.pid === pid) rmSync(path, { force: true });
}
