import type { ChildProcess } from 'node:child_process';
import { randomBytes, timingSafeEqual } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import { ReefError } from '../actors/runtime/errors.js';
import type { LifecycleState } from '../actors/runtime/lifecycle.js';
import { type LogFn, prefixed, stderrLog } from '../actors/runtime/log.js';
import { type HandlerContext, type Handlers, Mailbox, type ReplyFields } from '../actors/runtime/mailbox.js';
import type { BusKey } from '../actors/runtime/bus-key.js';
import type { ActorEnv, HeartbeatReport, RegisterRequest } from '../actors/runtime/messages.js';
import { RpcClient } from '../actors/runtime/rpc.js';
import { HANDOFF_DIR_ENV, type HeldListener } from './held-listener.js';
import { distEntry } from './paths.js';
import { ACTOR_NAME, type ActorInstanceStatus, type ControlMessage, type SupervisorMessage, supervisorMessages } from './supervisor-messages.js';
import { type BackoffOptions, ManagedProcess, type ManagedProcessOptions } from './supervisor-process.js';

export { Backoff, ManagedProcess, readyOnJsonLine } from './supervisor-process.js';
export type { BackoffOptions, ManagedProcessOptions, ProcessState, StopOptions } from './supervisor-process.js';

/** How to start one actor instance; `env` already holds `REEF_ACTOR`. */
export type ActorCommand = (name: string, id: string, env: NodeJS.ProcessEnv) => { command: string; args: string[] };

/**
 * Node flags per actor, for the gateway alone:
 * - `--initial-old-space-size=128`. The gateway moves ~250 KB of ArrayBuffers per OpenClaw-sized
 *   turn through its event loop (the body, and the prompt ids and engine body its tokenizer workers
 *   hand back); V8 counts those bytes against the old-generation limit of a heap whose live size is
 *   ~20 MB, so with the default limit it ran a full mark-compact every ~90 turns (about 1.5 ms of
 *   event-loop time per turn, plus the concurrent markers). A 128 MB starting limit cut those GCs
 *   four-fold in bench/gateway; it is a starting point V8 still adjusts, not a cap.
 * - `--interrupt-budget=4224`, a sixteenth of V8's default. V8 optimizes a function once it has
 *   run through this much bytecode; its default suits a browser's mostly-once code, while a
 *   gateway runs one short path per request. At the default, V8 was still compiling the path
 *   dozens of functions at a time 20 s into bench/gateway's OpenClaw sessions (thousands of
 *   requests: an agent's whole day). In one run against a default gateway, per 3-second window
 *   from a cold start, the added p50 was 0.1–0.7 ms lower throughout, and after 20 s of warm-up
 *   0.08–0.26 ms lower in five runs; throughput at 64 clients was unchanged within the noise, and
 *   no function was deoptimized over and over.
 */
export const ACTOR_NODE_FLAGS: Readonly<Record<string, readonly string[]>> = { gateway: ['--initial-old-space-size=128', '--interrupt-budget=4224'] };

/** The production command: `node <ACTOR_NODE_FLAGS> dist/actors/<name>/main.js`. */
export const nodeActorCommand: ActorCommand = (name) => {
  // The name becomes a path: `../../tmp/x` would run /tmp/x/main.js with every secret in the env.
  if (!ACTOR_NAME.test(name)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `actor name ${JSON.stringify(name)} is not an actor kind (${ACTOR_NAME.source})` });
  return { command: process.execPath, args: [...(ACTOR_NODE_FLAGS[name] ?? []), distEntry(`actors/${name}/main`)] };
};

/** Handlers for the CLI's control requests; each default uses the supervisor's own data. */
export type ControlHandlers = {
  [K in ControlMessage['type']]: (msg: Extract<ControlMessage, { type: K }>, ctx: HandlerContext, sup: Supervisor) => Promise<ReplyFields> | ReplyFields;
};

export interface SupervisorOptions {
  /** Instances started by `start()`, by actor name, e.g. `{gateway: 1, judge: 1, prm: 2}`. @default {} */
  actors?: Record<string, number>;
  /** @default nodeActorCommand */
  command?: ActorCommand;
  configPath?: string | null;
  overrides?: Record<string, unknown>;
  /** @default 'tcp://127.0.0.1:*' */
  endpoint?: string;
  /** @default 500 */
  heartbeatMs?: number;
  /** Missed heartbeats before an actor is killed and restarted. @default 6 */
  missedHeartbeats?: number;
  /** How long an instance may take to register. @default 20000 */
  startTimeoutMs?: number;
  /** How long a drained actor may take to exit before SIGTERM. @default 10000 */
  drainTimeoutMs?: number;
  backoff?: BackoffOptions;
  /**
   * The actor kinds a `scale` on the control socket may start or stop; any other is refused.
   * @default the kinds in `actors`
   */
  scalable?: readonly string[];
  /** Replace any of the default `status`, `scale`, `down`, `reload-keys` handlers. */
  control?: Partial<ControlHandlers>;
  /** Extra environment for every actor. */
  env?: Record<string, string>;
  /**
   * Listening sockets this process holds for an actor kind across its restarts (the gateway's
   * `reef.port`): each of its processes gets an IPC channel and `REEF_HANDOFF_DIR`, and serves the
   * connections passed on it. @default {}
   */
  listeners?: Record<string, HeldListener>;
  /**
   * The stack's CURVE key, for the control socket and the calls to the actors (see bus-key.ts).
   * @default the process's (`REEF_BUS_KEY`), null outside a stack
   */
  busKey?: BusKey | null;
  log?: LogFn;
}

interface Instance {
  id: string;
  /** What this instance's register must carry (`REEF_ACTOR.secret`). */
  secret: string;
  name: string;
  index: number;
  proc: ManagedProcess;
  mailbox: string | null;
  rpc: RpcClient | null;
  registeredPid: number | null;
  /** Wall-clock ms of the last register or heartbeat, for status. */
  lastHeartbeat: number | null;
  /** The same moment on the monotonic clock, for the watchdog; null: not watched. */
  heardAt: number | null;
  reported: LifecycleState | null;
  stats: Record<string, number>;
  onRegister: (() => void) | null;
}

/**
 * Runs the actor processes: spawns them, tracks their registration and heartbeats, restarts the
 * ones that die or hang (with backoff), scales instance counts, and drains everything on stop.
 * Events: `restart` ({id, reason, restarts, delayMs}), `down` (a `down` request was received).
 */
export class Supervisor extends EventEmitter {
  private readonly instances = new Map<string, Instance>();
  private readonly managed = new Map<string, ManagedProcess>();
  private readonly log: LogFn;
  private readonly heartbeatMs: number;
  private control: Mailbox<typeof supervisorMessages> | null = null;
  private watchdog: NodeJS.Timeout | null = null;
  private lastWatchdogTick: number | null = null;
  private scaling: Promise<unknown> = Promise.resolve();
  private stopping: Promise<void> | null = null;
  private readonly killAll = (): void => {
    for (const inst of this.instances.values()) inst.proc.killNow();
    for (const proc of this.managed.values()) proc.killNow();
  };

  constructor(private readonly options: SupervisorOptions = {}) {
    super();
    this.log = prefixed(options.log ?? stderrLog, 'supervisor');
    this.heartbeatMs = options.heartbeatMs ?? 500;
  }

  private keyOption(): { busKey?: BusKey | null } {
    return this.options.busKey === undefined ? {} : { busKey: this.options.busKey };
  }

  /** The actor kinds the control socket's `scale` accepts. */
  get scalable(): readonly string[] {
    return this.options.scalable ?? Object.keys(this.options.actors ?? {});
  }

  /** The control endpoint (bound by `start()`). */
  get endpoint(): string {
    if (this.control === null) throw new ReefError('REEF_ERR_SUPERVISOR', { reason: 'not started' });
    return this.control.endpoint;
  }

  /** Bind the control socket, start the configured actors and wait until each has registered. */
  async start(): Promise<void> {
    const own: Handlers<SupervisorMessage> = {
      register: (msg) => this.onRegister(msg),
      lookup: (msg) => ({ instances: this.status().filter((a) => a.name === msg.actor).map((a) => ({ id: a.id, mailbox: a.mailbox, state: a.state })) }),
      heartbeat: (msg) => this.onHeartbeat(msg),
      status: (msg, ctx) => (this.options.control?.status ?? defaultStatus)(msg, ctx, this),
      scale: (msg, ctx) => (this.options.control?.scale ?? defaultScale)(msg, ctx, this),
      down: (msg, ctx) => (this.options.control?.down ?? defaultDown)(msg, ctx, this),
      'reload-keys': (msg, ctx) => (this.options.control?.['reload-keys'] ?? defaultReloadKeys)(msg, ctx, this),
    };
    this.control = await Mailbox.open({ name: 'supervisor', schema: supervisorMessages, handlers: own, endpoint: this.options.endpoint, ...this.keyOption(), log: this.log });
    process.on('exit', this.killAll);
    this.watchdog = setInterval(() => this.checkHeartbeats(), this.heartbeatMs);
    this.log(`control ${this.control.endpoint}`);
    for (const [name, count] of Object.entries(this.options.actors ?? {})) await this.scale(name, count);
  }

  /** A snapshot of every actor instance, ordered by id. */
  status(): ActorInstanceStatus[] {
    return [...this.instances.values()]
      .sort((a, b) => a.name.localeCompare(b.name) || a.index - b.index)
      .map((inst) => ({
        id: inst.id,
        name: inst.name,
        pid: inst.proc.pid,
        state: stateOf(inst),
        restarts: inst.proc.restarts,
        lastExit: inst.proc.lastExit,
        lastHeartbeat: inst.lastHeartbeat,
        mailbox: inst.mailbox,
        stats: inst.stats,
      }));
  }

  /** Start instances `<name>-<n>` or drain the highest ids until `count` run; waits for new ones to register. */
  scale(name: string, count: number): Promise<{ before: number; after: number }> {
    if (!Number.isInteger(count) || count < 0) {
      return Promise.reject(new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `scale ${name}: count must be an integer ≥ 0, got ${count}` }));
    }
    // One scale at a time, so two overlapping requests cannot pick the same ids.
    const run = this.scaling.then(async () => {
      if (this.stopping !== null) throw new ReefError('REEF_ERR_SUPERVISOR', { reason: 'stopping' });
      const current = [...this.instances.values()].filter((i) => i.name === name).sort((a, b) => a.index - b.index);
      const before = current.length;
      if (count > before) {
        const used = new Set(current.map((i) => i.index));
        const added: Instance[] = [];
        for (let index = 0; added.length < count - before; index++) if (!used.has(index)) added.push(this.spawnInstance(name, index));
        await Promise.all(added.map((inst) => inst.proc.start()));
      } else if (count < before) {
        await Promise.all(current.slice(count).map((inst) => this.retire(inst)));
      }
      if (count !== before) this.log(`scaled ${name} ${before} → ${count}`);
      return { before, after: count };
    });
    this.scaling = run.catch(() => {});
    return run;
  }

  /**
   * Asks every registered gateway to re-read its API keys, one after the other, and stops at the
   * first refusal with that gateway's error (which names the key path): the others keep their keys
   * too, as they would have refused the same config. A gateway not registered now (restarting)
   * loads the keys as they are when it starts.
   */
  async reloadKeys(): Promise<{ gateways: Array<{ id: string; keys: number | null; state: string }> }> {
    const gateways = [...this.instances.values()].filter((i) => i.name === 'gateway').sort((a, b) => a.index - b.index);
    if (gateways.length === 0) throw new ReefError('REEF_ERR_SUPERVISOR', { reason: 'reload-keys: no gateway runs in this stack' });
    const out: Array<{ id: string; keys: number | null; state: string }> = [];
    for (const inst of gateways) {
      if (inst.rpc === null) {
        out.push({ id: inst.id, keys: null, state: stateOf(inst) });
        continue;
      }
      const reply = (await inst.rpc.call({ type: 'reload-keys' }, { timeoutMs: 15_000 })) as { keys: number };
      out.push({ id: inst.id, keys: reply.keys, state: stateOf(inst) });
    }
    this.log(`reload-keys: ${out.map((g) => `${g.id} ${g.keys ?? `not registered (${g.state})`}`).join(', ')}`);
    return { gateways: out };
  }

  /** Run a non-actor child (the Python shim) under the same restart policy; stopped by `stop()`. */
  manage(options: Omit<ManagedProcessOptions, 'log'>): ManagedProcess {
    if (this.managed.has(options.id) || this.instances.has(options.id)) {
      throw new ReefError('REEF_ERR_SUPERVISOR', { reason: `a child named ${options.id} already exists` });
    }
    const proc = new ManagedProcess({ ...options, backoff: options.backoff ?? this.options.backoff, log: this.log });
    proc.on('restart', (info: object) => this.emit('restart', { id: options.id, ...info }));
    this.managed.set(options.id, proc);
    return proc;
  }

  /** Drain every actor (then every managed child), escalating to SIGTERM/SIGKILL; resolves when none is left. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.log('stopping');
      await this.scaling;
      if (this.watchdog !== null) clearInterval(this.watchdog);
      await Promise.all([...this.instances.values()].map((inst) => this.retire(inst)));
      await Promise.all([...this.managed.values()].map((proc) => proc.stop()));
      this.managed.clear();
      await this.control?.close();
      process.off('exit', this.killAll);
      this.log('stopped');
    })();
    return this.stopping;
  }

  private spawnInstance(name: string, index: number): Instance {
    const id = `${name}-${index}`;
    const secret = randomBytes(32).toString('base64url');
    const actorEnv: ActorEnv = {
      secret,
      name,
      id,
      supervisor: this.endpoint,
      configPath: this.options.configPath ?? null,
      overrides: this.options.overrides ?? {},
      heartbeatMs: this.heartbeatMs,
    };
    const listener = this.options.listeners?.[name] ?? null;
    // Only a process that has the channel may think it takes connections from one.
    const { [HANDOFF_DIR_ENV]: _inherited, ...inherited } = process.env;
    const env = { ...inherited, ...this.options.env, REEF_ACTOR: JSON.stringify(actorEnv), ...(listener === null ? {} : { [HANDOFF_DIR_ENV]: listener.socketDir }) };
    const { command, args } = (this.options.command ?? nodeActorCommand)(name, id, env);
    const inst: Instance = { id, secret, name, index, mailbox: null, rpc: null, registeredPid: null, lastHeartbeat: null, heardAt: null, reported: null, stats: {}, onRegister: null } as Instance;
    inst.proc = new ManagedProcess({
      id,
      command,
      args,
      env,
      readyTimeoutMs: this.options.startTimeoutMs ?? 20_000,
      backoff: this.options.backoff,
      log: this.log,
      ipc: listener !== null,
      ready: (_proc, child) =>
        new Promise<void>((resolve) => {
          inst.onRegister = () => {
            if (inst.registeredPid !== child.pid) return;
            inst.onRegister = null;
            resolve();
          };
        }),
    });
    inst.proc.on('spawn', (_pid: number, child: ChildProcess) => {
      listener?.attach(child);
      inst.registeredPid = null;
      inst.lastHeartbeat = null;
      inst.heardAt = null;
      inst.reported = null;
      // The old process's mailbox died with it: `lookup` must not hand it out, and retiring the
      // instance before it registers again must not wait drainTimeoutMs for a drain it never gets.
      const rpc = inst.rpc;
      inst.rpc = null;
      inst.mailbox = null;
      void rpc?.close();
    });
    inst.proc.on('restart', (info: object) => this.emit('restart', { id, ...info }));
    this.instances.set(id, inst);
    return inst;
  }

  private async retire(inst: Instance): Promise<void> {
    const rpc = inst.rpc;
    const drainTimeoutMs = this.options.drainTimeoutMs ?? 10_000;
    await inst.proc.stop({
      // The drain's acknowledgement gets the whole drain budget: a fixed 2 s ran out on a loaded
      // machine (CI) and turned a clean drain into a SIGTERM.
      drain: rpc === null ? undefined : () => rpc.call({ type: 'drain' }, { timeoutMs: drainTimeoutMs }),
      drainTimeoutMs,
    });
    await inst.rpc?.close();
    this.instances.delete(inst.id);
  }

  private async onRegister(msg: RegisterRequest): Promise<ReplyFields> {
    const inst = this.instances.get(msg.id);
    // A stale process (already replaced, or from an earlier run) must not take over the slot.
    // `lookup` hands this endpoint to every caller of the actor: only one on this machine's loopback.
    if (!LOOPBACK_TCP.test(msg.mailbox) || Number(LOOPBACK_TCP.exec(msg.mailbox)![1]) > 65535) {
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `register ${msg.id}: mailbox ${JSON.stringify(msg.mailbox)} is not tcp://127.0.0.1:<port>` });
    }
    if (inst === undefined || inst.proc.pid !== msg.pid || inst.name !== msg.name || !sameSecret(inst.secret, msg.secret)) {
      throw new ReefError('REEF_ERR_NOT_FOUND', { what: `actor ${msg.id} with pid ${msg.pid} and its secret` });
    }
    if (inst.mailbox !== msg.mailbox) {
      await inst.rpc?.close();
      inst.rpc = new RpcClient(msg.mailbox, { name: `supervisor→${msg.id}`, ...this.keyOption(), log: this.log });
      inst.mailbox = msg.mailbox;
    }
    inst.registeredPid = msg.pid;
    inst.lastHeartbeat = Date.now();
    inst.heardAt = performance.now();
    this.log(`registered ${msg.id} (pid ${msg.pid}, mailbox ${msg.mailbox})`);
    inst.onRegister?.();
    return { heartbeatMs: this.heartbeatMs };
  }

  private onHeartbeat(msg: HeartbeatReport): ReplyFields {
    const inst = this.instances.get(msg.id);
    if (inst === undefined || inst.registeredPid === null) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `actor ${msg.id}` });
    inst.lastHeartbeat = Date.now();
    inst.heardAt = performance.now();
    inst.reported = msg.state;
    inst.stats = msg.stats;
    return {};
  }

  /** Silence is measured on the monotonic clock: a wall-clock step must not look like a hang. */
  private checkHeartbeats(): void {
    const limit = (this.options.missedHeartbeats ?? 6) * this.heartbeatMs;
    const now = performance.now();
    const lateMs = this.lastWatchdogTick === null ? 0 : now - this.lastWatchdogTick - this.heartbeatMs;
    this.lastWatchdogTick = now;
    if (lateMs > limit) {
      // This process did not run for a while (Ctrl-Z then fg, a suspended VM, a starved machine).
      // The actors' heartbeats of that time sit unread in the socket, and an expired timer runs
      // before pending socket reads, so every actor would look silent and be killed at once. Skip
      // this round and count silence from now.
      this.log(`watchdog ran ${Math.round(lateMs)} ms late; not judging heartbeats missed meanwhile`);
      for (const inst of this.instances.values()) if (inst.heardAt !== null) inst.heardAt = now;
      return;
    }
    for (const inst of this.instances.values()) {
      if (inst.proc.state !== 'running' || inst.heardAt === null) continue;
      const silentMs = Math.round(now - inst.heardAt);
      if (silentMs <= limit) continue;
      this.log(`${inst.id} (pid ${inst.proc.pid}) sent no heartbeat for ${silentMs} ms; killing it`);
      inst.heardAt = null;
      inst.lastHeartbeat = null;
      inst.proc.forceRestart(`missed ${this.options.missedHeartbeats ?? 6} heartbeats`);
    }
  }
}

/** Where a mailbox may be: Reef's mailboxes bind 127.0.0.1, never ipc or another host. */
const LOOPBACK_TCP = /^tcp:\/\/127\.0\.0\.1:([1-9]\d{0,4})$/;

function sameSecret(expected: string, given: string): boolean {
  const a = Buffer.from(expected);
  const b = Buffer.from(given);
  return a.length === b.length && timingSafeEqual(a, b);
}

function stateOf(inst: Instance): LifecycleState {
  switch (inst.proc.state) {
    case 'running':
      return inst.reported ?? 'running';
    case 'stopping':
      return 'draining';
    case 'stopped':
      return 'stopped';
    case 'backoff':
      return 'failed';
    default:
      return 'starting';
  }
}

const defaultStatus: ControlHandlers['status'] = (_msg, _ctx, sup) => ({ actors: sup.status(), groups: [], engines: [], ray: null });

const defaultScale: ControlHandlers['scale'] = (msg, _ctx, sup) => {
  // Whoever reaches the control socket names the actor: only the kinds this stack runs are spawned.
  if (!sup.scalable.includes(msg.actor)) {
    return Promise.reject(new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `scale: ${JSON.stringify(msg.actor)} is not an actor this stack scales (it scales ${sup.scalable.join(', ') || 'none'})` }));
  }
  return sup.scale(msg.actor, msg.count);
};

const defaultReloadKeys: ControlHandlers['reload-keys'] = (_msg, _ctx, sup) => sup.reloadKeys();

const defaultDown: ControlHandlers['down'] = (_msg, _ctx, sup) => {
  // Reply first: the drain closes the control socket this reply goes out on.
  setImmediate(() => {
    sup.emit('down');
    void sup.stop();
  });
  return {};
};
