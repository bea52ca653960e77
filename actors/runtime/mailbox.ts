import * as zmq from 'zeromq';
import type { z } from 'zod';
import { type BusKey, acquireZap, processBusKey, releaseZap, serverSocketOptions } from './bus-key.js';
import { decode, encode } from './codec.js';
import { ReefError } from './errors.js';
import { Lifecycle } from './lifecycle.js';
import { type LogFn, stderrLog } from './log.js';
import { SendQueue } from './send-queue.js';

/** What a handler learns about the request besides the message itself. */
export interface HandlerContext {
  requestId: string;
  type: string;
  /** The mailbox's name (usually the actor id). */
  mailbox: string;
  /** ms epoch when the request was received. */
  receivedAt: number;
}

/** Reply fields; the mailbox adds `type: 'ok'` and `requestId`. */
export type ReplyFields = Record<string, unknown>;

export type Handler<M> = (msg: M, ctx: HandlerContext) => Promise<ReplyFields> | ReplyFields;

/** One handler per message `type` of the union `U`, each receiving its own narrowed message. */
export type Handlers<U extends { type: string }> = { [K in U['type']]: Handler<Extract<U, { type: K }>> };

export interface MailboxStats {
  received: number;
  ok: number;
  errors: number;
  rejected: number;
  inFlight: number;
}

export interface MailboxOptions<S extends z.ZodType<{ type: string }>> {
  /** Name in logs and errors, usually the actor id. */
  name: string;
  /** The zod schema of every request this mailbox accepts (a discriminated union on `type`). */
  schema: S;
  handlers: Handlers<z.output<S>>;
  /** @default 'tcp://127.0.0.1:*' */
  endpoint?: string;
  /**
   * The CURVE key clients must hold (see bus-key.ts); null serves a plain socket.
   * @default the process's stack key (`REEF_BUS_KEY`), null outside a stack
   */
  busKey?: BusKey | null;
  /** Handlers running at once; past it the mailbox stops reading and zeromq queues. @default 64 */
  concurrency?: number;
  /** @default 1000 */
  sendHighWaterMark?: number;
  /** @default 1000 */
  receiveHighWaterMark?: number;
  /**
   * The ROUTER's send timeout. Without ROUTER_MANDATORY (not set: one slow caller would stall the
   * replies to all others behind it) zeromq never blocks a reply: one to a caller that is gone, or
   * whose queue is full, is dropped, and that caller hears its own timeout. @default 5000
   */
  sendTimeoutMs?: number;
  /** ms unsent replies are kept after close. @default 500 */
  lingerMs?: number;
  /** @default 10000 */
  maxQueuedReplies?: number;
  log?: LogFn;
}

interface RawRequest {
  type: string;
  requestId: string | null;
}

function peek(value: unknown): RawRequest {
  const obj = typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
  return {
    type: typeof obj.type === 'string' ? obj.type : '',
    requestId: typeof obj.requestId === 'string' ? obj.requestId : null,
  };
}

function issues(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`).join('; ');
}

/**
 * An actor's inbox: a ROUTER that decodes, validates and dispatches each request to its handler
 * and sends back one reply per request. Bad input is answered with an error reply, never thrown.
 */
export class Mailbox<S extends z.ZodType<{ type: string }>> {
  readonly name: string;
  readonly lifecycle: Lifecycle;
  private readonly router: zmq.Router;
  private readonly replies: SendQueue;
  private readonly concurrency: number;
  private readonly log: LogFn;
  private readonly counters = { received: 0, ok: 0, errors: 0, rejected: 0 };
  private readonly running = new Set<Promise<void>>();
  private slotFreed: (() => void) | null = null;
  private loop: Promise<void> | null = null;
  private boundEndpoint: string | null = null;
  private readonly busKey: BusKey | null;

  private constructor(private readonly options: MailboxOptions<S>) {
    this.busKey = options.busKey === undefined ? processBusKey() : options.busKey;
    this.name = options.name;
    this.lifecycle = new Lifecycle(`mailbox ${options.name}`);
    this.concurrency = options.concurrency ?? 64;
    this.log = options.log ?? stderrLog;
    this.router = new zmq.Router({
      sendHighWaterMark: options.sendHighWaterMark ?? 1000,
      receiveHighWaterMark: options.receiveHighWaterMark ?? 1000,
      sendTimeout: options.sendTimeoutMs ?? 5000,
      linger: options.lingerMs ?? 500,
      ...serverSocketOptions(this.busKey),
    });
    this.replies = new SendQueue(this.router, { name: `mailbox ${options.name}`, maxQueued: options.maxQueuedReplies ?? 10_000 });
  }

  /** Bind the ROUTER and start serving. */
  static async open<S extends z.ZodType<{ type: string }>>(options: MailboxOptions<S>): Promise<Mailbox<S>> {
    const mailbox = new Mailbox(options);
    const key = mailbox.busKey;
    try {
      // The handler is there before the first client can connect: without it, no client gets in.
      if (key !== null) await acquireZap(key);
      await mailbox.router.bind(options.endpoint ?? 'tcp://127.0.0.1:*');
    } catch (err) {
      mailbox.router.close();
      if (key !== null) releaseZap(key);
      throw err;
    }
    mailbox.boundEndpoint = mailbox.router.lastEndpoint;
    mailbox.lifecycle.transition('running');
    mailbox.loop = mailbox.receiveLoop();
    return mailbox;
  }

  /** The bound endpoint with the real port, e.g. `tcp://127.0.0.1:41234`. */
  get endpoint(): string {
    if (this.boundEndpoint === null) throw new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: this.name, state: 'unbound' });
    return this.boundEndpoint;
  }

  get stats(): MailboxStats {
    return { ...this.counters, inFlight: this.running.size };
  }

  /** Resolves when no handler is running (the ones that start meanwhile included). */
  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.allSettled([...this.running]);
  }

  /** Stop reading, let running handlers finish and their replies go out, then close the socket. */
  close(): Promise<void> {
    return this.lifecycle.close({
      drain: async () => {
        await this.idle();
        this.replies.close();
        await this.replies.flush();
      },
      destroy: async () => {
        this.router.close();
        if (this.busKey !== null) releaseZap(this.busKey);
        this.slotFreed?.();
        await this.loop?.catch(() => {});
      },
    });
  }

  private async receiveLoop(): Promise<void> {
    // Reading goes on while the handlers drain, so that every request arriving meanwhile is refused
    // at once (retryable); one left unread went unanswered until its caller's timeout ran out.
    while (this.lifecycle.is('running', 'draining')) {
      if (this.lifecycle.is('running') && this.running.size >= this.concurrency) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        continue;
      }
      let frames: Buffer[];
      try {
        frames = await this.router.receive();
      } catch (err) {
        // Closing the socket ends a pending receive; anything else is logged and ends the loop.
        if (!this.router.closed) this.log(`mailbox ${this.name}: receive failed: ${String(err)}`);
        return;
      }
      const [identity, payload] = frames;
      if (identity === undefined || payload === undefined) continue;
      this.counters.received++;
      if (!this.lifecycle.is('running')) {
        // A refusal runs no handler: the drain does not wait for it, nor may it hold a slot.
        void this.serve(identity, payload);
        continue;
      }
      const task = this.serve(identity, payload).finally(() => {
        this.running.delete(task);
        const wake = this.slotFreed;
        this.slotFreed = null;
        wake?.();
      });
      this.running.add(task);
    }
  }

  private async serve(identity: Buffer, payload: Buffer): Promise<void> {
    const receivedAt = Date.now();
    let raw: RawRequest = { type: '', requestId: null };
    let reply: Record<string, unknown>;
    try {
      let value: unknown;
      try {
        value = decode(payload);
      } catch (err) {
        throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: `cannot decode msgpack (${String(err)})` });
      }
      raw = peek(value);
      // close() cannot stop a receive already waiting, so a request can still arrive while the
      // running handlers drain: it is refused (retryable) rather than started on a closing actor.
      if (!this.lifecycle.is('running')) throw new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: this.name, state: this.lifecycle.state });
      if (raw.type === '') throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: 'no string `type`' });
      const handler = (this.options.handlers as Record<string, Handler<unknown> | undefined>)[raw.type];
      if (handler === undefined || !Object.hasOwn(this.options.handlers, raw.type)) {
        throw new ReefError('REEF_ERR_UNKNOWN_MESSAGE', { messageType: raw.type });
      }
      if (raw.requestId === null) throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: `${raw.type}: no string \`requestId\`` });
      const parsed = this.options.schema.safeParse(value);
      if (!parsed.success) throw new ReefError('REEF_ERR_BAD_MESSAGE', { details: `${raw.type}: ${issues(parsed.error)}` });
      const ctx: HandlerContext = { requestId: raw.requestId, type: raw.type, mailbox: this.name, receivedAt };
      const fields = await handler(parsed.data, ctx);
      reply = { ...fields, type: 'ok', requestId: raw.requestId };
      this.counters.ok++;
    } catch (err) {
      const error =
        err instanceof ReefError
          ? err
          : new ReefError('REEF_ERR_HANDLER', { messageType: raw.type, reason: err instanceof Error ? err.message : String(err) }, { cause: err });
      if (error.code === 'REEF_ERR_BAD_MESSAGE' || error.code === 'REEF_ERR_UNKNOWN_MESSAGE') this.counters.rejected++;
      else this.counters.errors++;
      if (error.code === 'REEF_ERR_HANDLER') this.log(`mailbox ${this.name}: ${error.message}`);
      reply = { ...error.toReply(raw.requestId) };
    }
    let bytes: Buffer;
    try {
      bytes = encode(reply);
    } catch (err) {
      // A reply the codec refuses (a typed array that is not bytes) is the handler's bug; the caller
      // hears it now rather than at its timeout.
      if (reply.type === 'ok') this.counters.ok--;
      this.counters.errors++;
      const error = new ReefError('REEF_ERR_HANDLER', { messageType: raw.type, reason: `reply cannot be encoded: ${err instanceof Error ? err.message : String(err)}` });
      this.log(`mailbox ${this.name}: ${error.message}`);
      bytes = encode(error.toReply(raw.requestId));
    }
    try {
      await this.replies.send([identity, bytes]);
    } catch (err) {
      // The caller has its own timeout; a reply we cannot send is only worth a log line.
      this.log(`mailbox ${this.name}: reply to ${raw.type || '?'} ${raw.requestId ?? ''} not sent: ${String(err)}`);
    }
  }
}
