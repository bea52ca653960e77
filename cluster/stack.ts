import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { BridgeClient, defaultTimeoutMs, engineStartTimeoutS } from '../bridge/client.js';
import type { EngineInfo, EngineSpec, GroupStatus, RayStatus } from '../bridge/messages.js';
import { BUS_KEY_ENV, type BusKey, makeBusKeyFile, readBusKeyFile, writePrivateFile } from '../actors/runtime/bus-key.js';
import { ReefError } from '../actors/runtime/errors.js';
import { type LogFn, prefixed, stderrLog } from '../actors/runtime/log.js';
import { layoutFromConfig } from './config/index.js';
import { engineArgs } from './config/engine-args.js';
import { ENGINE_ADMIN_KEY_ENV, ENGINE_ADMIN_KEY_FILE } from './engine-client.js';
import { ownDataDir } from './data-dir.js';
import type { ReefConfig } from './config/index.js';
import { freePort, gatewayUrl, portTaken } from './net.js';
import { HeldListener } from './held-listener.js';
import type { StackEngines } from './stack-env.js';
import { pythonBin, pythonEnv } from './paths.js';
import { claimRunFile, clearRunFile, writeRunFile, type RunFile } from './run-file.js';
import { type ActorCommand, ManagedProcess, readyOnJsonLine, Supervisor } from './supervisor.js';

/**
 * One running Reef stack, as `reef up` composes it: the supervisor (control socket and actor
 * processes), the Python shim (Ray driver) under the same restart policy, the placement groups, the
 * engines in their bundles, and the actors. A restarted shim gets the whole GPU layout replayed;
 * engines keep the ports chosen here, so the actors' engine URLs stay valid.
 */

export interface StackOptions {
  config: ReefConfig;
  configPath: string;
  /** The `--a.b=c` overrides given on the command line, passed on to every actor. */
  overrides: readonly string[];
  log?: LogFn;
  /** How to start the shim, given the endpoint it must bind. @default `python -m reef_shim.server` */
  shimCommand?: (endpoint: string) => { command: string; args: string[]; env: NodeJS.ProcessEnv };
  /** How to start an actor. @default nodeActorCommand */
  actorCommand?: ActorCommand;
  /**
   * Aborting stops the stack (`down()`). During start-up the step in progress finishes first (a
   * shim killed in the middle of one would orphan what it started), then `up` rejects.
   */
  signal?: AbortSignal;
}

export interface EngineSlot {
  spec: EngineSpec;
  info: EngineInfo | null;
}

export const ACTORS = ['gateway', 'judge', 'trainer-controller'] as const;

/** How long the shim has to print its ready line. */
const SHIM_READY_MS = 60_000;
/** How long `BridgeClient.connect` waits for the shim's first answer. */
const BRIDGE_CONNECT_MS = 10_000;
/** How long an actor has to register (the supervisor's default). */
const ACTOR_START_MS = 20_000;

/**
 * The longest a start-up can take with each step running to its own limit: the shim, Ray, the
 * placement groups (`cluster.placement_timeout_s`), each engine (its kind's start budget, or
 * REEF_ENGINE_START_TIMEOUT_S), each actor kind. `up --detach` waits that long: a fixed 600 s
 * stopped a stack that a foreground `reef up` would have brought up (three engines, a 32B one
 * among them, took longer).
 */
export function startUpLimitMs(cfg: ReefConfig): number {
  const c = cfg.cluster;
  const kinds = [c.rollout.engine, ...Array<EngineSpec['kind']>(c.prm.replicas).fill(c.prm.engine), ...(c.student ? [c.student.engine] : [])];
  return (
    SHIM_READY_MS +
    BRIDGE_CONNECT_MS +
    defaultTimeoutMs('init-ray', {} as never) +
    defaultTimeoutMs('create-placement', { timeoutS: cfg.cluster.placement_timeout_s } as never) +
    kinds.reduce((sum, kind) => sum + defaultTimeoutMs('start-engine', { spec: { kind } } as never), 0) +
    (ACTORS.length + 1) * ACTOR_START_MS
  );
}

export class Stack {
  readonly supervisor: Supervisor;
  readonly shim: ManagedProcess;
  private bridge: BridgeClient | null = null;
  private groups: GroupStatus[] = [];
  private ray: RayStatus | null = null;
  readonly engines: EngineSlot[];
  private readonly log: LogFn;
  private replaying: Promise<void> | null = null;
  /** Bumped on each shim restart: a replay started for an older shim runs again. */
  private shimGeneration = 0;
  /** Set once start-up's own replay is done; before that, a failed replay fails `up`. */
  private started = false;
  private closed: Promise<void> | null = null;
  private resolveStopped!: () => void;
  /** Resolves once `down()` has finished, whoever asked for it. */
  readonly stopped: Promise<void> = new Promise((resolve) => (this.resolveStopped = resolve));

  /** The stack's CURVE key (`<run dir>/bus.key`): every bus socket of the stack needs it. */
  readonly busKey: BusKey;

  private constructor(private readonly opts: StackOptions, readonly runDir: string, private readonly runFile: RunFile, readonly shimEndpoint: string, engines: EngineSlot[], actorOverrides: Record<string, unknown>, readonly busKeyPath: string, readonly gatewayListener: HeldListener) {
    this.log = opts.log ?? stderrLog;
    this.busKey = readBusKeyFile(busKeyPath);
    // Children find the keys by their paths; no secret is on a command line.
    const keyEnv = { [BUS_KEY_ENV]: busKeyPath, [ENGINE_ADMIN_KEY_ENV]: join(runDir, ENGINE_ADMIN_KEY_FILE) };
    this.engines = engines;
    const urls: StackEngines = {
      rollout: engineUrl(engines.find((e) => e.spec.role === 'rollout')!.spec),
      prm: engines.filter((e) => e.spec.role === 'prm').map((e) => engineUrl(e.spec)),
      student: ((s) => (s ? engineUrl(s.spec) : null))(engines.find((e) => e.spec.role === 'student')),
      shim: shimEndpoint,
    };
    this.supervisor = new Supervisor({
      configPath: opts.configPath,
      startTimeoutMs: ACTOR_START_MS,
      overrides: actorOverrides,
      ...(opts.actorCommand === undefined ? {} : { command: opts.actorCommand }),
      env: { REEF_ENGINES: JSON.stringify(urls), ...keyEnv },
      busKey: this.busKey,
      listeners: { gateway: gatewayListener },
      // `reef scale` changes the PRM actors; the gateway, judge and controller run one each.
      scalable: ['prm'],
      log: this.log,
      control: {
        status: async () => ({ ...(await this.status()) }),
        down: () => {
          // Reply first: the stop closes the control socket this reply goes out on.
          setImmediate(() => void this.down());
          return {};
        },
      },
    });
    // Engine output (which may log requests) goes under the data dir, the owner's alone, not a
    // predictable /tmp path another user could create first or fill with symlinks.
    const engineLogs = { REEF_ENGINE_LOG_DIR: process.env.REEF_ENGINE_LOG_DIR ?? join(opts.config.reef.data_dir, 'logs') };
    const shim = opts.shimCommand?.(shimEndpoint) ?? { command: pythonBin(), args: ['-m', 'reef_shim.server', '--endpoint', shimEndpoint, '--log-level', 'info'], env: pythonEnv(engineLogs) };
    this.shim = this.supervisor.manage({
      id: 'shim',
      ...shim,
      env: { ...shim.env, ...keyEnv, REEF_SHIM_POLICY: writeShimPolicy(runDir, opts.config, engines) },
      ready: readyOnJsonLine('ready'),
      readyTimeoutMs: SHIM_READY_MS,
    });
  }

  /** The gateway's base URL, on the port it listens on. */
  get gateway(): string {
    return this.runFile.gateway;
  }

  /** Brings the whole stack up, logging each step; on failure tears down what it started. */
  static async up(opts: StackOptions): Promise<Stack> {
    const cfg = opts.config;
    ownDataDir(cfg.reef.data_dir, opts.log ?? stderrLog);
    const runDir = join(cfg.reef.data_dir, 'run');
    mkdirSync(runDir, { recursive: true, mode: 0o700 });
    // Claimed before anything starts, so that a second `reef up` on this data dir fails now rather
    // than after minutes of bring-up, and `reef down` can stop a stack that is still starting.
    const runFile: RunFile = { pid: process.pid, state: 'starting', control: null, startedAt: Date.now(), configPath: opts.configPath, gateway: gatewayUrl({ host: cfg.reef.host, port: cfg.reef.port }) };
    claimRunFile(runDir, runFile);
    let stack: Stack;
    let listener: HeldListener | null = null;
    try {
      // Made once this stack owns the run dir: a second `reef up` must not replace a running one's key.
      const busKeyPath = makeBusKeyFile(runDir);
      writePrivateFile(join(runDir, ENGINE_ADMIN_KEY_FILE), `${randomBytes(32).toString('base64url')}\n`, 'the engine admin key');
      // The gateway's port is bound here, before anything starts, and held until the stack is down:
      // a gateway that restarts never frees it for another user to take (held-listener.ts). So a
      // port in use fails now, not after minutes of engine start-up, and `reef.port: 0` is the
      // OS's pick, which the endpoints printed, the run file and every gateway process then share.
      listener = await HeldListener.bind({
        host: cfg.reef.host,
        port: cfg.reef.port,
        maxQueued: cfg.reef.limits.max_connections,
        queueTimeoutMs: cfg.reef.limits.headers_timeout_s * 1000,
        log: prefixed(opts.log ?? stderrLog, 'gateway socket'),
      });
      runFile.gateway = gatewayUrl({ host: cfg.reef.host, port: listener.port });
      writeRunFile(runDir, runFile);
      stack = await Stack.create(opts, runDir, runFile, listener, busKeyPath);
    } catch (err) {
      await listener?.close();
      clearRunFile(runDir);
      throw err;
    }
    if (opts.signal?.aborted) void stack.down();
    opts.signal?.addEventListener('abort', () => void stack.down(), { once: true });
    try {
      await stack.start();
      return stack;
    } catch (err) {
      await stack.down().catch(() => {});
      throw err;
    }
  }

  private static async create(opts: StackOptions, runDir: string, runFile: RunFile, listener: HeldListener, busKeyPath: string): Promise<Stack> {
    const cfg = opts.config;
    // Read by the bridge client at the first engine start, after Ray and the placement groups.
    engineStartTimeoutS();
    // An engine binds its port after minutes of start-up: look now, before anything starts.
    for (const [key, host, port] of enginePortsOf(cfg)) {
      const why = port > 0 ? await portTaken(host, port) : null;
      if (why !== null) throw new ReefError('REEF_ERR_SUPERVISOR', { reason: `cannot start: ${key} ${port} on ${host}: ${why}` });
    }
    // Engines get their ports now so that actor configs and a replayed layout agree on URLs.
    const engines: EngineSlot[] = [];
    const overrides: Record<string, unknown> = {};
    const addEngine = async (role: EngineSpec['role'], name: string, group: string, e: { engine: 'hf' | 'sglang'; gpus: number; model_path: string | null; port: number; extra_args: readonly string[] }) => {
      if (!e.model_path) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `cluster.${role}.model_path: required to start the ${role} engine` });
      const port = e.port > 0 ? e.port : await freePort();
      engines.push({ spec: { name, role, kind: e.engine, modelPath: e.model_path, group, bundleIndex: 0, host: '127.0.0.1', port, extraArgs: engineArgs(e) }, info: null });
    };
    // Colocated, the rollout engine shares the trainer group's one bundle (and its GPU).
    await addEngine('rollout', 'rollout', cfg.cluster.colocate ? 'reef-trainer' : 'reef-rollout', cfg.cluster.rollout);
    for (let i = 0; i < cfg.cluster.prm.replicas; i++) {
      // A configured port is replica 0's; the others listen on the ports that follow it.
      const port = cfg.cluster.prm.port > 0 ? cfg.cluster.prm.port + i : 0;
      await addEngine('prm', `prm-${i}`, `reef-prm-${i}`, { ...cfg.cluster.prm, port });
    }
    if (cfg.cluster.student) await addEngine('student', 'student', 'reef-student', cfg.cluster.student);
    for (const o of opts.overrides) {
      const [k, ...v] = o.replace(/^--/, '').split('=');
      overrides[k!] = v.join('=');
    }
    if (cfg.reef.port === 0) overrides['reef.port'] = String(listener.port);

    return new Stack(opts, runDir, runFile, `tcp://127.0.0.1:${await freePort()}`, engines, overrides, busKeyPath, listener);
  }

  /** Start-up stops between steps once `down()` began. */
  private checkNotStopping(): void {
    if (this.closed !== null) throw new ReefError('REEF_ERR_SUPERVISOR', { reason: 'the stack is stopping' });
  }

  private async start(): Promise<void> {
    const cfg = this.opts.config;
    this.checkNotStopping();
    this.log('step 1/4: supervisor');
    await this.supervisor.start();
    this.checkNotStopping();
    this.log('step 2/4: python shim');
    this.shim.on('restart', () => this.onShimRestart());
    await this.shim.start();
    this.checkNotStopping();
    this.log('step 3/4: Ray, placement groups, engines');
    await this.replay();
    this.started = true;
    this.log('step 4/4: actors');
    const counts: Array<[string, number]> = [...ACTORS.map((name): [string, number] => [name, 1]), ['prm', cfg.cluster.prm_actors]];
    for (const [name, count] of counts) {
      this.checkNotStopping();
      await this.supervisor.scale(name, count);
    }
    this.checkNotStopping();
    writeRunFile(this.runDir, { ...this.runFile, state: 'running', control: this.supervisor.endpoint });
  }

  private onShimRestart(): void {
    // down() is stopping the shim: a child that restarted meanwhile gets no layout (and no bridge
    // that down() would not know to close).
    if (this.closed !== null) return;
    this.shimGeneration++;
    // The bridge's shim is gone: fail its pending calls now rather than at their timeouts (300 s
    // for start-engine), so that a replay in flight moves on to the new shim.
    void this.bridge?.close();
    // Before start-up's replay, and during any replay, that replay serves the new shim.
    if (!this.started || this.replaying !== null) return;
    this.log('shim restarted: replaying Ray, placement and engines');
    this.replay().catch((err: Error) => {
      if (this.closed !== null) return;
      // A shim that shows running without its layout would stay that way: restart it, so that the
      // shim's backoff paces the next attempts.
      this.log(`replay after shim restart failed: ${err.message}; restarting the shim`);
      this.shim.forceRestart(`replay failed: ${err.message}`);
    });
  }

  /** One replay at a time: a shim restart during one makes it run again for the new shim. */
  private replay(): Promise<void> {
    this.replaying ??= (async () => {
      for (;;) {
        const generation = this.shimGeneration;
        try {
          await this.bringUp(generation);
        } catch (err) {
          if (generation === this.shimGeneration) throw err;
        }
        if (generation === this.shimGeneration) return;
        this.log('the shim restarted during the replay: replaying again');
      }
    })().finally(() => (this.replaying = null));
    return this.replaying;
  }

  /** Ray → placement → engines, through a new bridge, on the shim of `generation`. */
  private async bringUp(generation: number): Promise<void> {
    const cfg = this.opts.config;
    await this.shim.waitReady(120_000);
    if (generation !== this.shimGeneration) return;
    await this.bridge?.close();
    const bridge = await BridgeClient.connect(this.shimEndpoint, { timeoutMs: BRIDGE_CONNECT_MS, log: this.log, busKey: this.busKey });
    if (generation !== this.shimGeneration) {
      await bridge.close();
      return;
    }
    this.bridge = bridge;
    const layout = layoutFromConfig(cfg);
    const ray = await bridge.initRay({ address: cfg.cluster.ray_address, numCpus: cfg.cluster.num_cpus, numGpus: cfg.cluster.num_gpus, objectStoreBytes: null });
    this.log(`ray ${ray.startedHead ? 'head started' : 'connected'} at ${ray.address} (${JSON.stringify(ray.resources)})`);
    this.checkNotStopping();
    this.groups = await bridge.createPlacement(layout, cfg.cluster.placement_timeout_s);
    this.log(`placement groups: ${this.groups.map((g) => `${g.name}[${g.bundles.length}] ${g.state}`).join(', ')}`);
    for (const slot of this.engines) {
      this.checkNotStopping();
      this.log(`starting engine ${slot.spec.name} (${slot.spec.kind}, ${slot.spec.modelPath}) on port ${slot.spec.port}`);
      slot.info = await bridge.startEngine(slot.spec);
      this.log(`engine ${slot.spec.name} healthy at ${slot.info.url} (weights ${slot.info.weightVersion ?? 'base'})`);
    }
  }

  async status(): Promise<{ actors: ReturnType<Supervisor['status']>; groups: GroupStatus[]; engines: Array<EngineInfo | EngineSpec>; ray: RayStatus | null; shim: { pid: number | null; state: string; restarts: number; lastExit: string | null } }> {
    let groups = this.groups;
    let engines: Array<EngineInfo | EngineSpec> = this.engines.map((s) => s.info ?? s.spec);
    let ray = this.ray;
    if (this.bridge && !this.bridge.isDown && this.shim.state === 'running') {
      try {
        const st = await this.bridge.status({ timeoutMs: 5_000 });
        groups = st.groups;
        engines = st.engines;
        ray = st.ray;
        this.ray = ray;
      } catch (err) {
        this.log(`status: shim did not answer (${(err as Error).message}); showing the last known layout`);
      }
    }
    return { actors: this.supervisor.status(), groups, engines, ray, shim: { pid: this.shim.pid, state: this.shim.state, restarts: this.shim.restarts, lastExit: this.shim.lastExit } };
  }

  /** Drains the actors, stops engines and placement through the shim, stops the shim. Idempotent. */
  down(): Promise<void> {
    this.closed ??= (async () => {
      this.log('stopping: draining actors');
      // New connections are refused from now on, as a draining gateway refused them when it
      // listened itself; the ones it was handed finish.
      await this.gatewayListener.close();
      await this.replaying?.catch(() => {});
      const bridge = this.bridge;
      // Actors first, so nothing calls an engine that is going away.
      const stopSupervisor = async () => {
        if (bridge && !bridge.isDown && this.shim.state === 'running') {
          // The shim removes its groups, engines and trainer and stops Ray before it exits: give it
          // time to do that instead of signalling it in the middle.
          await this.shim.stop({ drain: () => bridge.shutdown({ timeoutMs: 60_000 }), drainTimeoutMs: 60_000 }).catch((err: Error) => this.log(`shim shutdown: ${err.message}`));
        }
        await bridge?.close();
        await this.supervisor.stop();
      };
      for (const name of ['prm', ...ACTORS]) await this.supervisor.scale(name, 0).catch(() => {});
      await stopSupervisor();
      // An open bridge keeps this process alive after the stack is down.
      await this.bridge?.close();
      clearRunFile(this.runDir);
      rmSync(this.busKeyPath, { force: true });
      rmSync(join(this.runDir, ENGINE_ADMIN_KEY_FILE), { force: true });
      this.log('stopped');
      this.resolveStopped();
    })();
    return this.closed;
  }
}

export type { RunFile };

/** The configured engine ports (`0`: chosen at start-up, left out), on the engines' 127.0.0.1. */
function enginePortsOf(cfg: ReefConfig): Array<[string, string, number]> {
  const c = cfg.cluster;
  const out: Array<[string, string, number]> = [['cluster.rollout.port', '127.0.0.1', c.rollout.port]];
  for (let i = 0; i < c.prm.replicas; i++) out.push([i === 0 ? 'cluster.prm.port' : `cluster.prm.port + ${i}`, '127.0.0.1', c.prm.port > 0 ? c.prm.port + i : 0]);
  if (c.student) out.push(['cluster.student.port', '127.0.0.1', c.student.port]);
  return out;
}

/**
 * What the shim may start (python_shim/reef_shim/policy.py): these engine specs exactly, Ray at the
 * configured address, a trainer of the rollout model writing under the data dir. Whatever reaches
 * the bridge cannot then choose an engine's arguments, host or model, or where the trainer writes.
 */
function writeShimPolicy(runDir: string, cfg: ReefConfig, engines: readonly EngineSlot[]): string {
  const path = join(runDir, 'shim-policy.json');
  const policy = { engines: engines.map((e) => e.spec), rayAddress: cfg.cluster.ray_address, dataDir: resolve(cfg.reef.data_dir), trainerModelPath: cfg.cluster.rollout.model_path };
  writePrivateFile(path, `${JSON.stringify(policy)}\n`, 'the shim policy');
  return path;
}

function engineUrl(spec: EngineSpec): string {
  return `http://${spec.host}:${spec.port}`;
}
