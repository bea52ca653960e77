import type { z } from 'zod';
import type { BusKey } from '../actors/runtime/bus-key.js';
import { decimalNumber } from '../actors/runtime/decimal.js';
import { ReefError } from '../actors/runtime/errors.js';
import type { LogFn } from '../actors/runtime/log.js';
import { RpcClient } from '../actors/runtime/rpc.js';
import {
  BridgeRequest,
  type BridgeRequestType,
  type EngineInfo,
  type EngineSpec,
  type GroupStatus,
  type InitRayReply,
  type Layout,
  type PingReply,
  type Plan,
  REPLY_SCHEMAS,
  type ReplyOf,
  type RequestFields,
  type StatusReply,
  type TrainerSpec,
  type TrainerStartReply,
  type TrainerPushWeightsReply,
  type TrainerStepReply,
  type TrainTask,
} from './messages.js';

export interface BridgeClientOptions {
  /** Timeout of the ping `connect` sends to prove the shim is there. @default 5000 */
  timeoutMs?: number;
  /** Where the client reports dropped replies and socket trouble. @default stderr */
  log?: LogFn;
  /**
   * While a call other than `ping` is pending, ping the shim this often (each ping may take twice
   * as long). Two unanswered pings in a row, or an answer from another shim process, reject every
   * pending call with REEF_ERR_BRIDGE_DOWN: a request the dead shim held will never be answered,
   * and ZeroMQ silently reconnects to a shim restarted at the same endpoint. 0 turns this off.
   * @default 5000
   */
  heartbeatMs?: number;
  /**
   * The CURVE key the shim was started with (its `REEF_BUS_KEY`); null connects in plain.
   * @default the process's (`REEF_BUS_KEY`), null outside a stack
   */
  busKey?: BusKey | null;
}

export interface CallOptions {
  /** Per-call timeout; see `defaultTimeoutMs` for each request's default. */
  timeoutMs?: number;
}

/** What the client needs to know of the shim's process to notice its death (see `spawnShim`). */
export interface ShimProcessHandle {
  readonly pid: number;
  readonly exited: Promise<number | null>;
  readonly child?: { readonly signalCode: NodeJS.Signals | null };
}

/**
 * The shim's default budget for starting one engine of each kind (engine_process.py
 * DEFAULT_ENGINE_START_TIMEOUT_S, SGLANG_ENGINE_START_TIMEOUT_S): a first SGLang start loads the
 * weights, captures CUDA graphs and JIT-compiles kernels.
 */
export const DEFAULT_ENGINE_START_TIMEOUT_S: Readonly<Record<EngineSpec['kind'], number>> = { hf: 290, sglang: 900 };

/** The shim's budget for starting one engine: REEF_ENGINE_START_TIMEOUT_S, which it reads too, for every kind. */
export function engineStartTimeoutS(env: NodeJS.ProcessEnv = process.env, kind: EngineSpec['kind'] = 'hf'): number {
  const raw = env.REEF_ENGINE_START_TIMEOUT_S;
  // Decimal text only, as the shim reads it (Python's float): Number() would also take 0x10 as 16.
  const s = raw === undefined || raw.trim() === '' ? DEFAULT_ENGINE_START_TIMEOUT_S[kind] : decimalNumber(raw);
  if (!Number.isFinite(s) || s <= 0) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `REEF_ENGINE_START_TIMEOUT_S must be a positive number of seconds, got ${JSON.stringify(raw)}` });
  return s;
}

/**
 * Default per-call timeouts. Long calls run one at a time on the shim's worker thread, so a call
 * queued behind a slow one waits for it; `ping` and `status` are answered alongside.
 */
export function defaultTimeoutMs<T extends BridgeRequestType>(type: T, fields: RequestFields<T>): number {
  switch (type) {
    case 'ping':
      return 5_000;
    case 'init-ray':
      return 120_000; // a local head takes 10-20 s on a small machine; a remote one may be slower
    case 'create-placement':
      return (fields as unknown as RequestFields<'create-placement'>).timeoutS * 1000 + 10_000;
    case 'start-engine':
      // The shim gives an engine engine_start_timeout_s() (engine_process.py) for launch and health
      // together, then up to 30 s to read its weight version, and stops a failed one.
      return (engineStartTimeoutS(process.env, (fields as unknown as RequestFields<'start-engine'>).spec?.kind ?? 'hf') + 60) * 1000;
    case 'plan-placement':
      return 10_000;
    case 'trainer-start':
      // N rank processes import torch and load two models each; the shim gives the whole start
      // 600 s (group.py SETUP_TIMEOUT_S), after stopping a group it replaces (up to 15 s).
      return 660_000;
    case 'trainer-step':
      // a batch of 16 long turns on a real model takes minutes. group.py STEP_TIMEOUT_S (540 s) is
      // kept under this, so that the shim gives up on a hung rank and answers before the client does.
      return 600_000;
    case 'trainer-load':
      // The shim waits up to 600 s for the ranks to load (group.py SETUP_TIMEOUT_S). A client that
      // gave up first would send its retry behind a load still running on the shim's worker.
      return 660_000;
    case 'trainer-push-weights':
      return 420_000; // the shim's own limit is 300 s for the engine plus 60 s for the ranks
    default:
      return 60_000;
  }
}

/**
 * The TypeScript end of the bridge: a DEALER to the shim's ROUTER. Replies are validated with the
 * schemas of `messages.ts`; an error reply rejects with `ReefError.fromReply`. Once the shim is
 * known to be gone (its attached process exited, the heartbeat went unanswered, or another shim
 * process answers at the endpoint) every pending and later call rejects with REEF_ERR_BRIDGE_DOWN.
 * A single caller's ping that times out rejects with REEF_ERR_BRIDGE_DOWN but leaves the client up.
 */
export class BridgeClient {
  private readonly rpc: RpcClient;
  private readonly waiters = new Set<(err: ReefError) => void>();
  private downError: ReefError | null = null;
  /** The shim process this client talks to: the pid of the first ping answered. */
  private shimPid: number | null = null;
  private readonly heartbeatMs: number;
  private heartbeat: NodeJS.Timeout | null = null;
  private heartbeatInFlight = false;
  private missedPings = 0;
  /** Pending calls other than ping: the heartbeat runs while there is one. */
  private slowCalls = 0;

  private constructor(readonly endpoint: string, options: BridgeClientOptions) {
    this.heartbeatMs = options.heartbeatMs ?? 5_000;
    this.rpc = new RpcClient(endpoint, {
      name: `bridge ${endpoint}`,
      defaultTimeoutMs: 60_000,
      ...(options.log === undefined ? {} : { log: options.log }),
      ...(options.busKey === undefined ? {} : { busKey: options.busKey }),
    });
  }

  /** Connect and ping; a shim that does not answer rejects with REEF_ERR_BRIDGE_DOWN. */
  static async connect(endpoint: string, opts: BridgeClientOptions = {}): Promise<BridgeClient> {
    const client = new BridgeClient(endpoint, opts);
    try {
      await client.ping({ timeoutMs: opts.timeoutMs ?? 5_000 });
    } catch (err) {
      await client.close();
      throw err;
    }
    return client;
  }

  /** Connect to a shim started with `spawnShim` and follow its process. */
  static async forProcess(proc: ShimProcessHandle & { endpoint: string }, opts: BridgeClientOptions = {}): Promise<BridgeClient> {
    const client = await BridgeClient.connect(proc.endpoint, opts);
    client.attachProcess(proc);
    return client;
  }

  /** True once the shim is known to be gone (or the client closed). */
  get isDown(): boolean {
    return this.downError !== null;
  }

  /** When the shim's process exits, reject every pending call with REEF_ERR_BRIDGE_DOWN. */
  attachProcess(proc: ShimProcessHandle): void {
    void proc.exited.then((code) => {
      const how = proc.child?.signalCode ? `was killed by ${proc.child.signalCode}` : `exited with code ${code}`;
      this.markDown(`shim process ${proc.pid} ${how}`);
    });
  }

  async ping(opts: CallOptions = {}): Promise<PingReply> {
    const reply = await this.call('ping', {}, opts);
    this.checkPid(reply.pid);
    if (this.downError !== null) throw this.downError;
    return reply;
  }

  initRay(
    args: { address?: string | null; numCpus?: number | null; numGpus?: number | null; objectStoreBytes?: number | null } = {},
    opts: CallOptions = {},
  ): Promise<InitRayReply> {
    const fields = {
      address: args.address ?? null,
      numCpus: args.numCpus ?? null,
      numGpus: args.numGpus ?? null,
      objectStoreBytes: args.objectStoreBytes ?? null,
    };
    return this.call('init-ray', fields, opts);
  }

  async planPlacement(layout: Layout, opts: CallOptions = {}): Promise<Plan> {
    return (await this.call('plan-placement', { layout }, opts)).plan;
  }

  /** Create the layout's placement groups; fails naming the bundle that cannot be placed. */
  async createPlacement(layout: Layout, timeoutS: number, opts: CallOptions = {}): Promise<GroupStatus[]> {
    return (await this.call('create-placement', { layout, timeoutS }, opts)).groups;
  }

  /** Remove groups by name (`null`: all of this shim's), stopping their engines first. */
  async removePlacement(names: string[] | null, opts: CallOptions = {}): Promise<string[]> {
    return (await this.call('remove-placement', { names }, opts)).removed;
  }

  async startEngine(spec: EngineSpec, opts: CallOptions = {}): Promise<EngineInfo> {
    return (await this.call('start-engine', { spec }, opts)).engine;
  }

  async stopEngine(name: string, opts: CallOptions = {}): Promise<boolean> {
    return (await this.call('stop-engine', { name }, opts)).stopped;
  }

  status(opts: CallOptions = {}): Promise<StatusReply> {
    return this.call('status', {}, opts);
  }

  /** Start the trainer group's rank actors in `spec.group` (an existing group replaces the old one). */
  trainerStart(spec: TrainerSpec, opts: CallOptions = {}): Promise<TrainerStartReply> {
    return this.call('trainer-start', { spec }, opts);
  }

  /**
   * Train one batch and save a checkpoint `v<n>`. Idempotent by `batchId`. A rank that dies fails
   * the call with a retryable REEF_ERR_TRAINER_RANK: `trainerStart` + `trainerLoad` and retry.
   */
  trainerStep(batchId: string, tasks: TrainTask[], opts: CallOptions = {}): Promise<TrainerStepReply> {
    return this.call('trainer-step', { batchId, tasks }, opts);
  }

  /** Load policy weights from a checkpoint directory (the optimizer starts afresh); its weight version. */
  async trainerLoad(checkpointPath: string, opts: CallOptions = {}): Promise<string> {
    return (await this.call('trainer-load', { checkpointPath }, opts)).weightVersion;
  }

  /**
   * Push the trainer's weights into a running engine (SGLang's `update_weights_from_distributed`).
   * A refused or broken push is REEF_ERR_WEIGHT_SYNC (retryable) and leaves the trainer running;
   * the engine keeps serving its previous weights unless a multi-bucket push broke part-way.
   */
  trainerPushWeights(engineUrl: string, weightVersion: string, opts: CallOptions = {}): Promise<TrainerPushWeightsReply> {
    return this.call('trainer-push-weights', { engineUrl, weightVersion }, opts);
  }

  /** Stop the rank actors; a no-op when none run. */
  async trainerStop(opts: CallOptions = {}): Promise<void> {
    await this.call('trainer-stop', {}, opts);
  }

  /** Ask the shim to remove its groups and engines and exit; it replies before it cleans up. */
  async shutdown(opts: CallOptions = {}): Promise<void> {
    await this.call('shutdown', {}, opts);
  }

  /** One typed request; the request is checked before it leaves, the reply when it comes back. */
  call<T extends BridgeRequestType>(type: T, fields: RequestFields<T>, opts: CallOptions = {}): Promise<ReplyOf<T>> {
    const checked = BridgeRequest.safeParse({ type, requestId: '-', ...fields });
    if (!checked.success) {
      return Promise.reject(new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `bridge ${type}: ${checked.error.message}` }));
    }
    const timeoutMs = opts.timeoutMs ?? defaultTimeoutMs(type, fields);
    const schema = REPLY_SCHEMAS[type] as unknown as z.ZodType<ReplyOf<T>>;
    return this.guard(type, timeoutMs, () => this.rpc.call<ReplyOf<T>>({ type, ...fields }, { timeoutMs, schema }));
  }

  /**
   * Send any map as a request, unchecked, and resolve with the raw ok reply. For diagnostics and
   * for tests that must send what `call` would refuse.
   */
  callUnchecked(msg: { type: string } & Record<string, unknown>, opts: CallOptions = {}): Promise<Record<string, unknown>> {
    const timeoutMs = opts.timeoutMs ?? 60_000;
    return this.guard(msg.type, timeoutMs, () => this.rpc.call(msg, { timeoutMs }));
  }

  /** Close the socket; pending calls reject with REEF_ERR_BRIDGE_DOWN. Idempotent. */
  async close(): Promise<void> {
    this.markDown('bridge client closed');
    await this.rpc.close();
  }

  private guard<R>(type: string, timeoutMs: number, start: () => Promise<R>): Promise<R> {
    if (this.downError !== null) return Promise.reject(this.downError);
    const watched = type !== 'ping';
    if (watched) this.callStarted();
    return new Promise<R>((resolve, reject) => {
      const onDown = (err: ReefError): void => reject(err);
      this.waiters.add(onDown);
      start()
        .then(resolve, (err: unknown) => reject(this.translate(err, type, timeoutMs)))
        .finally(() => {
          this.waiters.delete(onDown);
          if (watched) this.callEnded();
        });
    });
  }

  private callStarted(): void {
    this.slowCalls++;
    if (this.heartbeat !== null || this.heartbeatMs <= 0) return;
    this.missedPings = 0;
    this.heartbeat = setInterval(() => this.beat(), this.heartbeatMs);
    this.heartbeat.unref();
  }

  private callEnded(): void {
    this.slowCalls--;
    if (this.slowCalls > 0 || this.heartbeat === null) return;
    clearInterval(this.heartbeat);
    this.heartbeat = null;
  }

  /** One heartbeat ping, straight on the socket: its failure must not look like a caller's ping failing. */
  private beat(): void {
    if (this.heartbeatInFlight || this.downError !== null) return;
    this.heartbeatInFlight = true;
    this.rpc
      .call<PingReply>({ type: 'ping' }, { timeoutMs: 2 * this.heartbeatMs, schema: REPLY_SCHEMAS.ping })
      .then(
        (reply) => {
          this.missedPings = 0;
          this.checkPid(reply.pid);
        },
        (err: unknown) => {
          if (this.downError !== null) return;
          this.missedPings++;
          if (this.missedPings >= 2) {
            const who = this.shimPid === null ? 'the shim' : `shim pid ${this.shimPid}`;
            this.markDown(`${who} at ${this.endpoint} answered none of ${this.missedPings} pings in a row (last: ${(err as Error).message})`);
          }
        },
      )
      .finally(() => (this.heartbeatInFlight = false));
  }

  private checkPid(pid: number): void {
    if (this.shimPid === null) {
      this.shimPid = pid;
    } else if (pid !== this.shimPid) {
      this.markDown(`shim pid ${this.shimPid} at ${this.endpoint} was replaced by pid ${pid}; requests sent to pid ${this.shimPid} will never be answered`);
    }
  }

  private translate(err: unknown, type: string, timeoutMs: number): unknown {
    if (this.downError !== null) return this.downError;
    if (err instanceof ReefError && err.code === 'REEF_ERR_TIMEOUT' && type === 'ping') {
      // The shim answers ping on its socket thread whatever else it is doing: silence is death.
      return new ReefError('REEF_ERR_BRIDGE_DOWN', { reason: `no reply to ping within ${timeoutMs} ms from ${this.endpoint}` }, { cause: err });
    }
    if (err instanceof ReefError && err.code === 'REEF_ERR_ACTOR_CLOSED') {
      return new ReefError('REEF_ERR_BRIDGE_DOWN', { reason: 'bridge client closed' }, { cause: err });
    }
    return err;
  }

  private markDown(reason: string): void {
    if (this.downError !== null) return;
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
    this.heartbeat = null;
    this.downError = new ReefError('REEF_ERR_BRIDGE_DOWN', { reason });
    for (const reject of [...this.waiters]) reject(this.downError);
    this.waiters.clear();
    void this.rpc.close();
  }
}
