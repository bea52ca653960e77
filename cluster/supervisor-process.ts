import { type ChildProcess, spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { createInterface } from 'node:readline';
import { ReefError } from '../actors/runtime/errors.js';
import { type LogFn, stderrLog } from '../actors/runtime/log.js';

export interface BackoffOptions {
  /** @default 500 */
  initialMs?: number;
  /** @default 10000 */
  maxMs?: number;
  /** A child healthy this long starts again from `initialMs`. @default 30000 */
  resetAfterMs?: number;
}

/** Restart delays: initialMs, doubling to maxMs; back to initialMs after a long healthy run. */
export class Backoff {
  private nextMs: number;
  constructor(private readonly options: Required<BackoffOptions>) {
    this.nextMs = options.initialMs;
  }

  static from(options: BackoffOptions = {}): Backoff {
    return new Backoff({ initialMs: options.initialMs ?? 500, maxMs: options.maxMs ?? 10_000, resetAfterMs: options.resetAfterMs ?? 30_000 });
  }

  /** The delay before the next restart, given how long the child was healthy (0 if never). */
  next(healthyForMs: number): number {
    if (healthyForMs >= this.options.resetAfterMs) this.nextMs = this.options.initialMs;
    const delay = this.nextMs;
    this.nextMs = Math.min(this.nextMs * 2, this.options.maxMs);
    return delay;
  }
}

export type ProcessState = 'idle' | 'starting' | 'running' | 'backoff' | 'stopping' | 'stopped';

export interface ManagedProcessOptions {
  /** Name in logs, e.g. `prm-1` or `shim`. */
  id: string;
  command: string;
  args: string[];
  /** @default process.env */
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /**
   * Resolves (with anything worth keeping, e.g. the endpoint from a ready line) once the child is
   * ready; rejecting or not resolving in `readyTimeoutMs` gets the child killed and restarted.
   * @default ready as soon as spawned
   */
  ready?: (proc: ManagedProcess, child: ChildProcess) => Promise<unknown>;
  /** @default 30000 */
  readyTimeoutMs?: number;
  backoff?: BackoffOptions;
  /** ms between "still waiting" log lines. @default 5000 */
  progressMs?: number;
  /** Give the child a Node IPC channel (its fd 3), e.g. to pass it sockets. @default false */
  ipc?: boolean;
  log?: LogFn;
}

export interface StopOptions {
  /** Ask the child to finish its work (e.g. send `drain`); its exit is then awaited. */
  drain?: () => Promise<unknown>;
  /** @default 10000 */
  drainTimeoutMs?: number;
  /** How long after SIGTERM before SIGKILL. @default 5000 */
  termTimeoutMs?: number;
}

/**
 * One child process kept alive: spawned in its own process group, its output forwarded line by
 * line, restarted with backoff whenever it exits without being asked to, or fails to get ready.
 * Events: `spawn` (pid, child), `ready` (pid, info), `exit` ({pid, code, signal, expected}),
 * `restart` ({reason, restarts, delayMs}), `line` ({stream, line}), `failed` (reason: its command
 * could not be spawned before it was ever ready, and is not retried).
 */
export class ManagedProcess extends EventEmitter {
  readonly id: string;
  state: ProcessState = 'idle';
  restarts = 0;
  /** What `ready` resolved with for the current child. */
  readyInfo: unknown = null;
  private child: ChildProcess | null = null;
  private exited: Promise<void> = Promise.resolve();
  private readySince: number | null = null;
  private killReason: string | null = null;
  /** Why the last child died unasked (`exit code 1`, `missed 6 heartbeats`), or null: `restarts` alone said how often, not why. */
  lastExit: string | null = null;
  private everReady = false;
  /** Set when the command cannot be started at all (see `onSpawnError`); nothing is retried then. */
  private failed: string | null = null;
  private restartTimer: NodeJS.Timeout | null = null;
  private stopping: Promise<void> | null = null;
  private readonly backoff: Backoff;
  private readonly log: LogFn;

  constructor(private readonly options: ManagedProcessOptions) {
    super();
    this.id = options.id;
    this.backoff = Backoff.from(options.backoff);
    this.log = options.log ?? stderrLog;
  }

  get pid(): number | null {
    return this.alive ? (this.child?.pid ?? null) : null;
  }

  get alive(): boolean {
    return this.child !== null && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Spawn the child; resolves when it is ready for the first time (restarts included). */
  start(): Promise<void> {
    if (this.state === 'idle') this.spawnChild();
    return this.waitReady(this.options.readyTimeoutMs ?? 30_000);
  }

  /** Resolves at the next `ready` (now, if running); rejects after `timeoutMs` or on stop. */
  waitReady(timeoutMs: number): Promise<void> {
    if (this.state === 'running') return Promise.resolve();
    const cannotStart = (): ReefError => new ReefError('REEF_ERR_SUPERVISOR', { reason: `${this.id} cannot be started: ${this.failed}` });
    if (this.failed !== null) return Promise.reject(cannotStart());
    return new Promise((resolve, reject) => {
      const done = (err: Error | null): void => {
        clearTimeout(timer);
        this.off('ready', onReady);
        this.off('stopped', onStopped);
        this.off('failed', onFailed);
        if (err === null) resolve();
        else reject(err);
      };
      const onReady = (): void => done(null);
      const onStopped = (): void => done(new ReefError('REEF_ERR_SUPERVISOR', { reason: `${this.id} was stopped before it was ready` }));
      const onFailed = (): void => done(cannotStart());
      const timer = setTimeout(
        () => done(new ReefError('REEF_ERR_SUPERVISOR', { reason: `${this.id} not ready within ${timeoutMs} ms (${this.restarts} restarts${this.lastExit === null ? '' : `; the last died of ${this.lastExit}`})` })),
        timeoutMs,
      );
      this.on('ready', onReady);
      this.on('stopped', onStopped);
      this.on('failed', onFailed);
    });
  }

  /** Kill the child with SIGKILL now; it is restarted (with backoff) and `reason` is logged. */
  forceRestart(reason: string): void {
    if (!this.alive || this.stopping !== null) return;
    this.killReason = reason;
    this.signal('SIGKILL');
  }

  /** Stop for good: drain, then SIGTERM, then SIGKILL, each bounded. Idempotent. */
  stop(options: StopOptions = {}): Promise<void> {
    this.stopping ??= this.stopChild(options);
    return this.stopping;
  }

  /** Last resort on supervisor exit: SIGKILL without waiting (synchronous). */
  killNow(): void {
    if (this.alive) this.signal('SIGKILL');
  }

  private spawnChild(): void {
    const child = spawn(this.options.command, this.options.args, {
      env: this.options.env ?? process.env,
      cwd: this.options.cwd,
      stdio: this.options.ipc ? ['ignore', 'pipe', 'pipe', 'ipc'] : ['ignore', 'pipe', 'pipe'],
      // Own process group: a terminal's Ctrl-C reaches the supervisor only, which then drains the
      // children in order; and a kill of the group takes the child's own children with it.
      detached: true,
    });
    this.child = child;
    this.state = 'starting';
    this.readySince = null;
    this.readyInfo = null;
    this.exited = new Promise((resolve) => {
      child.once('exit', (code, signal) => {
        this.onExit(child, code, signal);
        resolve();
      });
      child.once('error', (err) => {
        // A spawn failure (ENOENT, EACCES) emits 'error' without 'exit'.
        if (child.pid === undefined) {
          this.killReason = `spawn failed: ${err.message}`;
          // A command that never started once (a missing venv, a wrong REEF_PYTHON) will not start
          // on a retry either: restarting it until the ready timeout only hid why.
          if (!this.everReady && this.stopping === null) this.failed = this.killReason;
          this.onExit(child, null, null);
          resolve();
        }
      });
    });
    for (const [stream, readable] of [['stdout', child.stdout], ['stderr', child.stderr]] as const) {
      if (readable === null) continue;
      createInterface({ input: readable }).on('line', (line) => {
        this.emit('line', { stream, line });
        this.log(`[${this.id}] ${line}`);
      });
    }
    if (child.pid !== undefined) this.emit('spawn', child.pid, child);
    void this.awaitReady(child);
  }

  private async awaitReady(child: ChildProcess): Promise<void> {
    const timeoutMs = this.options.readyTimeoutMs ?? 30_000;
    const started = Date.now();
    const progress = setInterval(() => {
      this.log(`waiting for ${this.id} (pid ${child.pid}) to be ready, ${Math.round((Date.now() - started) / 1000)} s`);
    }, this.options.progressMs ?? 5000);
    let timer: NodeJS.Timeout | undefined;
    try {
      const info = await Promise.race([
        this.options.ready ? this.options.ready(this, child) : Promise.resolve(null),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`not ready within ${timeoutMs} ms`)), timeoutMs);
        }),
        this.exited.then(() => {
          throw new Error('exited before it was ready');
        }),
      ]);
      if (this.child !== child || !this.alive || this.state !== 'starting') return;
      this.readyInfo = info;
      this.readySince = Date.now();
      this.everReady = true;
      this.state = 'running';
      this.emit('ready', child.pid, info);
    } catch (err) {
      if (this.child === child && this.alive && this.stopping === null) {
        this.log(`${this.id} (pid ${child.pid}) ${(err as Error).message}; killing it`);
        this.forceRestart((err as Error).message);
      }
    } finally {
      clearInterval(progress);
      clearTimeout(timer);
    }
  }

  private onExit(child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (child !== this.child) return;
    const expected = this.stopping !== null;
    const reason = this.killReason ?? (signal !== null ? `exit signal ${signal}` : `exit code ${code}`);
    this.killReason = null;
    // The leader's death does not end its process group: grandchildren (Ray's agents, engine
    // servers) would be orphaned and keep their ports. End what is left of the group.
    if (child.pid !== undefined) killGroup(child.pid);
    this.emit('exit', { pid: child.pid ?? null, code, signal, expected });
    if (expected) return;
    this.lastExit = reason;
    if (this.failed !== null) {
      this.log(`${this.id} cannot be started (${reason}); not retrying`);
      this.state = 'stopped';
      this.emit('failed', reason);
      return;
    }
    const healthyFor = this.readySince === null ? 0 : Date.now() - this.readySince;
    const delayMs = this.backoff.next(healthyFor);
    this.restarts++;
    this.state = 'backoff';
    const restarts = this.restarts;
    this.log(`${this.id} (pid ${child.pid}) died (${reason}); restarting in ${delayMs} ms`);
    this.restartTimer = setTimeout(() => {
      this.restartTimer = null;
      if (this.stopping !== null) return;
      this.spawnChild();
      this.log(`restarted ${this.id} (${reason}), restart #${restarts} after ${delayMs} ms`);
      this.emit('restart', { reason, restarts, delayMs });
    }, delayMs);
  }

  private signal(sig: NodeJS.Signals): void {
    const pid = this.child?.pid;
    if (pid === undefined) return;
    try {
      process.kill(-pid, sig);
    } catch {
      this.child?.kill(sig);
    }
  }

  private async waitExit(ms: number, what: string): Promise<boolean> {
    const started = Date.now();
    while (this.alive && Date.now() - started < ms) {
      const left = ms - (Date.now() - started);
      let timer: NodeJS.Timeout | undefined;
      // Cleared when the exit wins: a pending timer kept a stopped `reef up` alive for up to 5 s.
      await Promise.race([this.exited, new Promise((resolve) => (timer = setTimeout(resolve, Math.min(left, this.options.progressMs ?? 5000))))]);
      clearTimeout(timer);
      if (this.alive && Date.now() - started < ms) this.log(`waiting for ${this.id} (pid ${this.child?.pid}) to exit after ${what}, ${Math.round((Date.now() - started) / 1000)} s`);
    }
    return !this.alive;
  }

  private async stopChild(options: StopOptions): Promise<void> {
    this.state = 'stopping';
    if (this.restartTimer !== null) clearTimeout(this.restartTimer);
    if (this.alive && options.drain !== undefined) {
      const drainMs = options.drainTimeoutMs ?? 10_000;
      try {
        await options.drain();
        await this.waitExit(drainMs, 'drain');
      } catch (err) {
        this.log(`${this.id}: drain failed (${err instanceof Error ? err.message : String(err)}); sending SIGTERM`);
      }
    }
    if (this.alive) {
      this.signal('SIGTERM');
      if (!(await this.waitExit(options.termTimeoutMs ?? 5000, 'SIGTERM'))) {
        this.log(`${this.id} (pid ${this.child?.pid}) ignored SIGTERM; sending SIGKILL`);
        this.signal('SIGKILL');
        await this.waitExit(10_000, 'SIGKILL');
      }
    }
    this.state = 'stopped';
    this.emit('stopped');
  }
}

function killGroup(pgid: number): void {
  try {
    process.kill(-pgid, 'SIGKILL');
  } catch {
    // ESRCH: nothing left in the group.
  }
}

/** A `ready` check for children that print one JSON line `{"event":"ready",...}` on stdout (the shim). */
export function readyOnJsonLine(event = 'ready'): (proc: ManagedProcess) => Promise<Record<string, unknown>> {
  return (proc) =>
    new Promise((resolve) => {
      const onLine = ({ stream, line }: { stream: string; line: string }): void => {
        if (stream !== 'stdout' || !line.startsWith('{')) return;
        try {
          const obj = JSON.parse(line) as Record<string, unknown>;
          if (obj.event !== event) return;
          proc.off('line', onLine);
          proc.off('exit', onExit);
          resolve(obj);
        } catch {
          // Not JSON: an ordinary log line.
        }
      };
      // A child that dies first is restarted and gets a fresh check; drop this one's listener.
      const onExit = (): void => {
        proc.off('line', onLine);
      };
      proc.on('line', onLine);
      proc.once('exit', onExit);
    });
}
