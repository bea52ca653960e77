import { execFileSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { cpSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../../cluster/paths.js';
import { waitFor } from './wait.js';

/**
 * The power-loss EMULATION at fsync granularity (test/helpers/powercut/powercut.c; what it models
 * and what it does not: docs/benchmarks.md "The power-loss emulation"). A writer runs with
 * `powercutEnv(dir, shadow)`; `cutPower` SIGKILLs it and puts the durable image in place of `dir`.
 * It is not a power cut: the kernel's page cache, the disk and its cache are never touched.
 */

const SOURCE = join(repoRoot(), 'test/helpers/powercut/powercut.c');

function compiler(): { cc: string; version: string } {
  const tried: string[] = [];
  for (const cc of [process.env.CC, 'cc', 'gcc', 'clang'].filter((c): c is string => !!c)) {
    tried.push(cc);
    try {
      return { cc, version: execFileSync(cc, ['--version'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }) };
    } catch {
      // the next one
    }
  }
  throw new Error(
    `the power-loss emulation builds an LD_PRELOAD library from ${SOURCE}, and no C compiler was found (tried ${tried.join(', ')}): ` +
      'install gcc (Debian/Ubuntu: apt-get install gcc) or set CC to one',
  );
}

let built: string | null = null;

/**
 * The library, built once per source and compiler into `${XDG_CACHE_HOME:-~/.cache}/reef/powercut/`
 * (where scripts/setup.sh keeps the venv and the models), keyed by their hash.
 */
export function powercutLibrary(): string {
  if (built) return built;
  const { cc, version } = compiler();
  const source = readFileSync(SOURCE);
  const key = createHash('sha256').update(source).update(version).digest('hex').slice(0, 16);
  const dir = join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'reef', 'powercut', key);
  const lib = join(dir, 'libpowercut.so');
  if (!existsSync(lib)) {
    mkdirSync(dir, { recursive: true });
    // Built beside and renamed in: two test files building at once never load a half-written one.
    const tmp = `${lib}.${process.pid}.tmp`;
    try {
      execFileSync(cc, ['-O2', '-Wall', '-shared', '-fPIC', '-o', tmp, SOURCE, '-ldl'], { stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (err) {
      const out = err as { stderr?: Buffer };
      throw new Error(`building ${SOURCE} with ${cc} failed:\n${out.stderr?.toString() ?? String(err)}`);
    }
    renameSync(tmp, lib);
  }
  built = lib;
  return lib;
}

/** Environment for a writer whose files under `dir` are imaged into `shadow` (outside `dir`). */
export function powercutEnv(dir: string, shadow: string): Record<string, string> {
  mkdirSync(shadow, { recursive: true });
  const prior = process.env.LD_PRELOAD;
  return {
    LD_PRELOAD: prior ? `${powercutLibrary()}:${prior}` : powercutLibrary(),
    REEF_POWERCUT_DIR: dir,
    REEF_POWERCUT_SHADOW: shadow,
  };
}

/** Pids that loaded the library, so a caller can check its writer is watched at all. */
export function watchedPids(shadow: string): number[] {
  const file = join(shadow, 'loaded');
  return existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter(Boolean).map(Number) : [];
}

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export interface CutResult {
  /** Paths (relative to the watched directory) restored from their durable image. */
  kept: string[];
  /** Paths there at the cut that a power cut would not have left (never durable, or `-shm`). */
  dropped: string[];
}

/**
 * The "power cut": SIGKILL to each writer's process group (spawn them `detached`), wait until every
 * process in it is gone, then replace `dir`'s contents with the durable image. `-shm` files are
 * left out: SQLite rebuilds its WAL index from the WAL after a crash.
 */
export async function cutPower(writers: ChildProcess[], dir: string, shadow: string): Promise<CutResult> {
  for (const w of writers) {
    if (w.pid === undefined) continue;
    try {
      process.kill(-w.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const w of writers) {
    if (w.pid === undefined) continue;
    await waitFor(() => (w.exitCode !== null || w.signalCode !== null) && !groupAlive(w.pid!), { what: `process group ${w.pid} to be gone after SIGKILL`, timeoutMs: 10_000, intervalMs: 5 });
  }
  return restoreDurable(dir, shadow);
}

function walk(dir: string, prefix = ''): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const rel = prefix ? `${prefix}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...walk(join(dir, e.name), rel));
    else out.push(rel);
  }
  return out;
}

/** Replaces `dir`'s contents with `shadow`'s durable image (the writers must be gone). */
export function restoreDurable(dir: string, shadow: string): CutResult {
  const tree = join(shadow, 'tree');
  const before = walk(dir);
  const kept = walk(tree).filter((p) => !p.endsWith('-shm'));
  for (const e of readdirSync(dir)) rmSync(join(dir, e), { recursive: true, force: true });
  if (existsSync(tree)) {
    // A copy, not the image itself: the restored files are written again by whoever opens them.
    cpSync(tree, dir, { recursive: true, filter: (src) => !src.endsWith('-shm') });
  }
  const keptSet = new Set(kept);
  return { kept, dropped: before.filter((p) => !keptSet.has(p)) };
}
