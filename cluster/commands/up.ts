import { spawn } from 'node:child_process';
import { closeSync, fstatSync, mkdirSync, openSync, readSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { flagBool, flagString, type ParsedArgs } from '../args.js';
import type { Io } from '../cli.js';
import { loadConfig, type ReefConfig } from '../config/index.js';
import { repoRoot } from '../paths.js';
import { ReefError } from '../../actors/runtime/errors.js';
import { readRunFile } from '../run-file.js';
import { redirectOutput } from '../rotating-log.js';
import { Stack, startUpLimitMs, type StackOptions } from '../stack.js';

/** The line printed once everything is up: where to point an agent. */
function endpoints(stack: Stack): string {
  const lines = [
    'reef is up',
    `  gateway     ${stack.gateway}/v1  (OpenAI API; Reef API under /reef)`,
    ...stack.engines.map((e) => `  engine      ${e.spec.name.padEnd(10)} ${e.info?.url ?? '-'}  (${e.spec.kind}, weights ${e.info?.weightVersion ?? 'base'})`),
    `  control     ${stack.supervisor.endpoint}`,
    '  stop with Ctrl-C or `reef down`',
  ];
  return lines.join('\n');
}

/** `p` as one shell word, to be pasted. */
function shellWord(p: string): string {
  return /^[\w@%+=:,./-]+$/.test(p) ? p : `'${p.replace(/'/g, `'\\''`)}'`;
}

/** `seams`: how the shim and the actors are started, for tests (see `StackOptions`). */
export async function upCommand(args: ParsedArgs, io: Io, seams: Pick<StackOptions, 'shimCommand' | 'actorCommand'> = {}): Promise<number> {
  const configPath = flagString(args, 'config');
  if (!configPath) {
    io.stderr('usage: reef up -c FILE [--detach] [--a.b=value ...]');
    return 2;
  }
  const cfg = await loadConfig(configPath, args.overrides);
  if (flagBool(args, 'detach')) return detach(cfg, configPath, args, io);
  // The background process of `--detach`: its output goes to run/reef.log, rotated by size. Not
  // passed on, so that no child takes the file over.
  const rotated = process.env[ROTATED_LOG_ENV];
  delete process.env[ROTATED_LOG_ENV];
  if (rotated) redirectOutput(rotated);

  // Handled from the start: `reef down` signals a stack that is still starting, and dying on the
  // default action would leave the shim, Ray and the engines running.
  const stop = new AbortController();
  let signals = 0;
  const onSignal = (sig: NodeJS.Signals) => {
    signals++;
    if (signals > 1) {
      io.stderr(`[reef] ${sig} again: still draining, please wait (a third one exits at once)`);
      if (signals > 2) process.exit(130);
      return;
    }
    io.stderr(`[reef] ${sig}: draining`);
    stop.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  // SIGHUP means two things. A foreground stack gets it when its terminal hangs up: it drains, as
  // on SIGTERM (the default action killed the supervisor alone and left the actors, in process
  // groups of their own, running). The detached stack runs in a session of its own, which no
  // terminal's hang-up reaches, so a SIGHUP there was sent on purpose: the daemon convention, reload
  // (here the API keys, as `reef keys reload` does).
  let upStack: Stack | null = null;
  const onHangUp = (): void => {
    if (upStack === null) {
      io.stderr('[reef] SIGHUP: still starting; the gateway reads the API keys as they are when it starts');
      return;
    }
    upStack.supervisor.reloadKeys().then(
      (r) => io.stderr(`[reef] SIGHUP: API keys reloaded (${r.gateways.map((g) => `${g.id}: ${g.keys ?? 'not running'}`).join(', ')})`),
      (err: Error) => io.stderr(`[reef] SIGHUP: API keys not reloaded, the old ones stay in force: ${err.message}`),
    );
  };
  const hangUp = rotated ? onHangUp : onSignal;
  process.on('SIGHUP', hangUp);
  try {
    let stack: Stack;
    try {
      stack = await Stack.up({ config: cfg, configPath: resolve(configPath), overrides: args.overrides, log: (line) => io.stderr(`[reef] ${line}`), signal: stop.signal, ...seams });
    } catch (err) {
      if (!stop.signal.aborted) throw err;
      io.stderr('[reef] stopped before it was up');
      return 130;
    }
    upStack = stack;
    if (!stop.signal.aborted) io.stdout(endpoints(stack));
    await stack.stopped;
    return 0;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    process.off('SIGHUP', hangUp);
  }
}

/**
 * The lines a file gains from `offset` on, as they come: what the background `reef up` writes to
 * its log in this run (the file is appended to across runs).
 */
class LogTail {
  private partial = '';
  constructor(private readonly path: string, private offset: number) {}

  /** Complete lines written since the last call. */
  lines(): string[] {
    let fd: number;
    try {
      fd = openSync(this.path, 'r');
    } catch {
      return [];
    }
    try {
      const buf = Buffer.alloc(64 * 1024);
      for (;;) {
        const n = readSync(fd, buf, 0, buf.length, this.offset);
        if (n <= 0) break;
        this.offset += n;
        this.partial += buf.toString('utf8', 0, n);
      }
    } finally {
      closeSync(fd);
    }
    const lines = this.partial.split('\n');
    this.partial = lines.pop()!;
    return lines;
  }
}

/** Names the log file the background `reef up` writes its output to, rotated (cluster/rotating-log.ts). */
const ROTATED_LOG_ENV = 'REEF_ROTATED_LOG';

/** Starts `reef up` in the background and returns once it is up (or has failed). */
async function detach(cfg: ReefConfig, configPath: string, args: ParsedArgs, io: Io): Promise<number> {
  const runDir = join(cfg.reef.data_dir, 'run');
  // The stack's own steps are bounded; this is the backstop for one that hangs between them. It
  // reads REEF_ENGINE_START_TIMEOUT_S, which is checked now rather than in the background.
  const limitMs = startUpLimitMs(cfg) + 60_000;
  mkdirSync(runDir, { recursive: true });
  const existing = readRunFile(runDir);
  if (existing) throw new ReefError('REEF_ERR_ALREADY_RUNNING', { pid: existing.pid, endpoint: existing.control ?? 'none yet: still starting' });
  const logPath = join(runDir, 'reef.log');
  const fd = openSync(logPath, 'a');
  const log = new LogTail(logPath, fstatSync(fd).size);
  const child = spawn(process.execPath, [join(repoRoot(), 'bin', 'reef.js'), 'up', '-c', resolve(configPath), ...args.overrides], {
    detached: true,
    // The descriptors too, for what Node prints without the streams (a fatal error's report).
    stdio: ['ignore', fd, fd],
    env: { ...process.env, [ROTATED_LOG_ENV]: logPath },
  });
  closeSync(fd);
  child.unref();
  io.stdout(`reef starting in the background (pid ${child.pid}); log: ${logPath}`);
  let exited: number | null = null;
  child.on('exit', (code) => (exited = code ?? 1));
  const deadline = Date.now() + limitMs;
  // Start-up takes minutes with real engines: its steps are shown as they come, and on failure the
  // error itself, which used to be left in the log behind "see <log>".
  const errors: string[] = [];
  const follow = (): void => {
    for (const line of log.lines()) {
      if (/^\[reef\] (step \d+\/\d+:|starting engine |engine \S+ healthy )/.test(line)) io.stderr(line);
      else if (line.startsWith('reef: ')) errors.push(line);
    }
  };
  // Ctrl-C while it starts stops it, as it stops a foreground `reef up`: the background process was
  // left to come up with nobody told (a script's `trap ... down` was not set yet), holding the GPUs.
  let interrupted = 0;
  const onSignal = (sig: NodeJS.Signals): void => {
    interrupted++;
    if (interrupted > 1) {
      io.stderr(`[reef] ${sig} again: leaving the background stack (pid ${child.pid}) to stop by itself; see ${logPath}`);
      process.exit(130);
    }
    io.stderr(`[reef] ${sig}: stopping the background stack (pid ${child.pid}) after its start-up step in progress`);
    try {
      process.kill(child.pid!, 'SIGTERM');
    } catch {
      // exited just now
    }
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    while (Date.now() < deadline) {
      follow();
      const rf = readRunFile(runDir);
      if (interrupted === 0 && rf && rf.pid === child.pid && rf.state === 'running') {
        // By data dir: `-c FILE` alone missed a stack whose data dir an override moved.
        io.stdout(`reef is up: gateway ${rf.gateway}/v1, control ${rf.control}\nstop with \`reef down --data-dir ${shellWord(cfg.reef.data_dir)}\``);
        return 0;
      }
      if (exited !== null && interrupted > 0) {
        io.stderr('[reef] stopped before it was up');
        return 130;
      }
      if (exited !== null) {
        follow();
        for (const line of errors) io.stderr(line);
        io.stderr(`reef: start-up failed (exit ${exited}); see ${logPath}`);
        return 1;
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  // Left running, it could come up later with nobody told, or hold the data dir for good.
  if (exited === null && child.pid !== undefined) {
    try {
      process.kill(-child.pid, 'SIGTERM');
      io.stderr(`reef: not up after ${Math.round(limitMs / 1000)} s; stopping it (SIGTERM to process group ${child.pid}, which drains what it started); see ${logPath}`);
      return 1;
    } catch {
      // exited just now
    }
  }
  io.stderr(`reef: not up after ${Math.round(limitMs / 1000)} s; see ${logPath}`);
  return 1;
}
