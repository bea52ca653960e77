import { randomBytes } from 'node:crypto';
import * as zmq from 'zeromq';
import type { z } from 'zod';
import { type BusKey, clientSocketOptions, processBusKey } from './bus-key.js';
import { decode, encode } from './codec.js';
import { type ErrorReply, ReefError } from './errors.js';
import { Lifecycle } from './lifecycle.js';
import { type LogFn, stderrLog } from './log.js';
import { SendQueue } from './send-queue.js';

export interface RpcClientOptions {
  /** Name in errors and logs, e.g. `judge→prm-0`. @default the endpoint */
  name?: string;
  /** @default 5000 */
  defaultTimeoutMs?: number;
  /** @default 1000 */
  sendHighWaterMark?: number;
  /** @default 1000 */
  receiveHighWaterMark?: number;
  /** ms a send may block on a full or absent peer before it fails. @default 5000 */
  sendTimeoutMs?: number;
  /** ms unsent requests are kept after close. @default 0 */
  lingerMs?: number;
  /** @default 10000 */
  maxQueued?: number;
  /**
   * The CURVE key to prove to the server (see bus-key.ts); null connects in plain.
   * @default the process's stack key (`REEF_BUS_KEY`), null outside a stack
   */
  busKey?: BusKey | null;
  log?: LogFn;
}

export interface CallOptions<T> {
  /** @default the client's defaultTimeoutMs */
  timeoutMs?: number;
  /** Validates the ok reply; a mismatch rejects with REEF_ERR_BAD_MESSAGE. */
  schema?: z.ZodType<T>;
}

/** A request as the caller writes it; the client adds `requestId`. */
export type Request = { type: string } & Record<string, unknown>;

/** An ok reply: `{type: 'ok', requestId, ...fields}`. */
export type OkReply = { type: 'ok'; requestId: string } & Record<string, unknown>;

interface Pending {
  resolve: (reply: Record<string, unknown>) => void;
  reject: (err: unknown) => void;
  timer: NodeJS.Timeout;
}

const MAX_TIMER_MS = 2 ** 31 - 1;

// Unique across processes and restarts without coordination: pid alone repeats after a restart.
const PREFIX = `${process.pid}-${randomBytes(3).toString('hex')}`;
let counter = 0;

export function nextRequestId(): string {
  counter++;
  return `${PREFIX}-${counter}`;
}

/** A DEALER that makes request/reply calls to one mailbox, with per-call timeouts. */
export class RpcClient {
  readonly name: string;
  readonly lifecycle: Lifecycle;
  /** Replies that arrived after their call timed out (or were never asked for). */
  dropped = 0;
  private readonly dealer: zmq.Dealer;
  private readonly requests: SendQueue;
  private readonly pending = new Map<string, Pending>();
  private readonly defaultTimeoutMs: number;
  private readonly sendTimeoutMs: number;
  private readonly log: LogFn;
  private readonly loop: Promise<void>;

  constructor(
    readonly endpoint: string,
    options: RpcClientOptions = {},
  ) {
    this.name = options.name ?? endpoint;
    this.lifecycle = new Lifecycle(`rpc ${this.name}`);
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? 5000;
    this.log = options.log ?? stderrLog;
    this.sendTimeoutMs = options.sendTimeoutMs ?? 5000;
    this.dealer = new zmq.Dealer({
      sendHighWaterMark: options.sendHighWaterMark ?? 1000,
      receiveHighWaterMark: options.receiveHighWaterMark ?? 1000,
      sendTimeout: this.sendTimeoutMs,
      linger: options.lingerMs ?? 0,
      ...clientSocketOptions(options.busKey === undefined ? processBusKey() : options.busKey),
    });
    try {
      this.dealer.connect(endpoint);
    } catch (err) {
      // The socket is already open: left behind, each failed construction (a caller retrying a
      // misconfigured endpoint every few seconds) kept its file descriptors until the process ran out.
      this.dealer.close();
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${this.name}: cannot connect to ${JSON.stringify(endpoint)} (${err instanceof Error ? err.message : String(err)}); a zeromq endpoint looks like tcp://127.0.0.1:5555` }, { cause: err });
    }
    this.requests = new SendQueue(this.dealer, { name: `rpc ${this.name}`, maxQueued: options.maxQueued ?? 10_000 });
    this.lifecycle.transition('running');
    this.loop = this.receiveLoop();
  }

  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Send `msg` with a fresh `requestId` and resolve with the ok reply; an error reply rejects with
   * `ReefError.fromReply`, no reply within the timeout (or a request zeromq could not hand over
   * within `sendTimeoutMs`) rejects with REEF_ERR_TIMEOUT.
   */
  call<T = OkReply>(msg: Request, options: CallOptions<T> = {}): Promise<T> {
    if (!this.lifecycle.is('running')) {
      return Promise.reject(new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: this.name, state: this.lifecycle.state }));
    }
    const requestId = nextRequestId();
    let payload: Buffer;
    try {
      payload = encode({ ...msg, requestId });
    } catch (err) {
      return Promise.reject(err);
    }
    const timeoutMs = options.timeoutMs ?? this.defaultTimeoutMs;
    const reply = new Promise<Record<string, unknown>>((resolve, reject) => {
      // setTimeout runs a delay past 2^31 - 1 ms after 1 ms: a long timeout would fail at once.
      const timer = setTimeout(() => {
        this.pending.delete(requestId);
        reject(new ReefError('REEF_ERR_TIMEOUT', { what: `${this.name} ${msg.type}`, ms: timeoutMs }));
      }, Math.min(timeoutMs, MAX_TIMER_MS));
      this.pending.set(requestId, { resolve, reject, timer });
    });
    this.requests.send([payload]).catch((err: unknown) => this.settle(requestId, null, this.sendError(err, msg.type)));
    return reply.then((value) => {
      if (options.schema === undefined) return value as T;
      const parsed = options.schema.safeParse(value);
      if (parsed.success) return parsed.data;
      throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: `reply to ${msg.type}: ${parsed.error.message}` });
    });
  }

  /** Reject pending calls with REEF_ERR_ACTOR_CLOSED and close the socket. Idempotent. */
  close(): Promise<void> {
    return this.lifecycle.close({
      drain: async () => {
        this.requests.close();
        for (const id of [...this.pending.keys()]) {
          this.settle(id, null, new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: this.name, state: 'closed' }));
        }
      },
      destroy: async () => {
        this.dealer.close();
        await this.loop;
      },
    });
  }

  /**
   * zeromq fails a send that waited `sendTimeoutMs` for room (a peer that is gone or reads nothing)
   * with a bare EAGAIN Error; callers match on ReefError codes, and this one is a retryable timeout.
   */
  private sendError(err: unknown, type: string): unknown {
    if (err instanceof ReefError || (err as { code?: unknown } | null)?.code !== 'EAGAIN') return err;
    return new ReefError('REEF_ERR_TIMEOUT', { what: `${this.name} ${type} (sending the request)`, ms: this.sendTimeoutMs }, { cause: err });
  }

  private settle(requestId: string, reply: Record<string, unknown> | null, err?: unknown): void {
    const entry = this.pending.get(requestId);
    if (entry === undefined) {
      if (reply !== null) this.dropped++;
      return;
    }
    this.pending.delete(requestId);
    clearTimeout(entry.timer);
    if (reply === null) entry.reject(err);
    else if (reply.type === 'ok') entry.resolve(reply);
    else if (reply.type === 'error') entry.reject(ReefError.fromReply(reply as unknown as ErrorReply));
    else entry.reject(new ReefError('REEF_ERR_BAD_MESSAGE', { details: `reply type ${String(reply.type)}` }));
  }

  private async receiveLoop(): Promise<void> {
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await this.dealer.receive();
      } catch (err) {
        if (!this.dealer.closed) this.log(`rpc ${this.name}: receive failed: ${String(err)}`);
        return;
      }
      const payload = frames[frames.length - 1];
      if (payload === undefined) continue;
      let reply: unknown;
      try {
        reply = decode(payload);
      } catch (err) {
        this.log(`rpc ${this.name}: undecodable reply dropped: ${String(err)}`);
        continue;
      }
      const obj = typeof reply === 'object' && reply !== null ? (reply as Record<string, unknown>) : {};
      if (typeof obj.requestId !== 'string') {
        this.dropped++;
        continue;
      }
      this.settle(obj.requestId, obj);
    }
  }
}
