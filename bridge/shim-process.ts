import { type ChildProcess, spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { ReefError } from '../actors/runtime/errors.js';
import { type LogFn, prefixed, stderrLog } from '../actors/runtime/log.js';
import { pythonBin, pythonEnv, repoRoot } from '../cluster/paths.js';

export interface SpawnShimOptions {
  /** ROUTER endpoint the shim binds; port `*` lets it pick a free one. @default 'tcp://127.0.0.1:*' */
  endpoint?: string;
  /** Extra environment for the shim (and, through Ray, its workers and engines). @default {} */
  env?: Record<string, string>;
  /** @default 'info' */
  logLevel?: 'debug' | 'info' | 'warning' | 'error';
  /** How long to wait for the ready line. @default 30000 */
  readyTimeoutMs?: number;
  /** How long `stop()` waits after SIGTERM before SIGKILL (Ray's shutdown takes seconds). @default 30000 */
  stopTimeoutMs?: number;
  /** Receives the shim's stderr, line by line. @default stderr, prefixed `shim <pid>` */
  log?: LogFn;
}

export interface ShimProcess {
  /** The endpoint the shim actually bound (from its ready line). */
  readonly endpoint: string;
  readonly pid: number;
  readonly child: ChildProcess;
  /** Resolves with the exit code (null when killed by a signal) once the process is gone. */
  readonly exited: Promise<number | null>;
  /** The last lines the shim wrote to stderr, for error messages. */
  stderrTail(): string;
  /** SIGTERM (the shim removes its groups and engines), then SIGKILL after the timeout. Idempotent. */
  stop(): Promise<void>;
}

const TAIL_LINES = 40;

/**
 * Start `python -m reef_shim.server` from the project venv and wait for its ready line.
 * The shim watches its stdin: if this process dies, the pipe closes and the shim cleans up and
 * exits, so no shim (and no Ray head) outlives its parent.
 */
export function spawnShim(opts: SpawnShimOptions = {}): Promise<ShimProcess> {
  const endpoint = opts.endpoint ?? 'tcp://127.0.0.1:*';
  const args = ['-m', 'reef_shim.server', '--endpoint', endpoint, '--log-level', opts.logLevel ?? 'info', '--watch-stdin'];
  const child = spawn(pythonBin(), args, { cwd: repoRoot(), env: pythonEnv(opts.env ?? {}), stdio: ['pipe', 'pipe', 'pipe'] });
  const tail: string[] = [];
  const log = opts.log ?? prefixed(stderrLog, `shim ${child.pid ?? '?'}`);
  createInterface({ input: child.stderr! }).on('line', (line) => {
    tail.push(line);
    if (tail.length > TAIL_LINES) tail.shift();
    log(line);
  });
  const stderrTail = (): string => tail.join('\n');
  const exited = new Promise<number | null>((resolve) => {
    child.once('exit', (code) => resolve(code));
    child.once('error', () => resolve(null)); // spawn failure (no venv): no 'exit' follows
  });
  // An EPIPE on the watched stdin just means the shim is gone; `exited` reports that.
  child.stdin!.on('error', () => {});

  let stopping: Promise<void> | null = null;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), opts.stopTimeoutMs ?? 30_000);
      await exited;
      clearTimeout(timer);
    })();
    return stopping;
  };

  return new Promise<ShimProcess>((resolve, reject) => {
    const readyTimeoutMs = opts.readyTimeoutMs ?? 30_000;
    const fail = (reason: string): void => {
      clearTimeout(timer);
      void stop();
      reject(new ReefError('REEF_ERR_SHIM', { reason: `${reason}; stderr:\n${stderrTail()}` }));
    };
    const timer = setTimeout(() => fail(`no ready line within ${readyTimeoutMs} ms`), readyTimeoutMs);
    child.once('error', (err) => fail(`cannot start ${pythonBin()}: ${err.message}`));
    void exited.then((code) => fail(`exited with code ${code} before it was ready`));
    const lines = createInterface({ input: child.stdout! });
    lines.once('line', (line) => {
      let ready: { event?: unknown; endpoint?: unknown; pid?: unknown };
      try {
        ready = JSON.parse(line) as typeof ready;
      } catch {
        fail(`expected the ready line, got ${JSON.stringify(line.slice(0, 200))}`);
        return;
      }
      if (ready.event !== 'ready' || typeof ready.endpoint !== 'string') {
        fail(`expected the ready line, got ${line.slice(0, 200)}`);
        return;
      }
      clearTimeout(timer);
      // The shim sends nothing more on stdout, but keep draining it so a stray write can never block it.
      lines.on('line', (extra) => log(extra));
      resolve({ endpoint: ready.endpoint, pid: child.pid!, child, exited, stderrTail, stop });
    });
  });
}
