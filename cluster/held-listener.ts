import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ReefError } from '../actors/runtime/errors.js';
import type { LogFn } from '../actors/runtime/log.js';
import { errorBody } from '../actors/gateway/http-errors.js';
import { bindProblem } from './net.js';

/**
 * The gateway's listening socket, bound once by the supervisor and kept for the life of the stack,
 * as systemd's socket activation keeps one across a service's restarts. A gateway that was killed
 * used to free `reef.port` until its successor bound it again (the restart backoff, 0.5–10 s), and
 * any local user could take the port then and receive agents' Authorization headers and
 * transcripts (security review M6). Now the port is never free while the stack runs.
 *
 * This process accepts (`pauseOnConnect`: it never reads a byte) and passes each connection's
 * descriptor to the gateway incarnation that serves, over its IPC channel (`subprocess.send(msg,
 * socket)`); the gateway injects it into its HTTP server (actors/gateway/handoff.ts). While none
 * serves, connections wait here, at most `maxQueued` of them (the gateway's own connection cap)
 * and for at most `queueTimeoutMs` (its headers timeout, which would have cut them as well); one
 * past either is answered 503 and closed, never left to hang.
 *
 * A handed socket could as well have been a handed listener (`subprocess.send('server', server)`),
 * but then this process accepts alongside the child with no documented way to stop it, and the
 * descriptor passed in `stdio` must be a stream, which a listener is not.
 */

/** What a gateway process says on its IPC channel. */
export const HANDOFF_SERVING = 'reef-handoff-serving';
export const HANDOFF_DRAINING = 'reef-handoff-draining';
/** What this side sends with each socket. */
export const HANDOFF_CONNECTION = 'reef-handoff-connection';
/** Set for a process that takes its connections from the channel: a private directory for its HTTP server's own socket. */
export const HANDOFF_DIR_ENV = 'REEF_HANDOFF_DIR';

export interface HeldListenerOptions {
  host: string;
  /** 0: one the OS picks. */
  port: number;
  /** Connections held while no gateway serves; one more is refused. @default 1024 */
  maxQueued?: number;
  /** How long a held connection waits for a gateway before it is refused. @default 30000 */
  queueTimeoutMs?: number;
  /** The setting named when binding fails. @default 'reef.port' */
  setting?: string;
  log: LogFn;
}

interface Held {
  socket: Socket;
  timer: NodeJS.Timeout | null;
}

export class HeldListener {
  private target: ChildProcess | null = null;
  private readonly queue = new Set<Held>();
  private closing: Promise<void> | null = null;
  /** Connections handed over and refused, for logs and tests. */
  readonly counts = { handed: 0, queued: 0, refused: 0 };

  private constructor(
    private readonly server: Server,
    readonly port: number,
    /** Where each gateway process puts its HTTP server's own Unix socket (0700, this user's alone). */
    readonly socketDir: string,
    private readonly options: HeldListenerOptions,
  ) {
    server.on('connection', (socket) => this.onConnection(socket));
  }

  static bind(options: HeldListenerOptions): Promise<HeldListener> {
    // noDelay here, at accept: the option stays on the descriptor the gateway gets.
    const server = createServer({ pauseOnConnect: true, noDelay: true });
    return new Promise((resolve, reject) => {
      server.once('error', (err: NodeJS.ErrnoException) => {
        const why = bindProblem(options.host, err) ?? err.message;
        reject(new ReefError('REEF_ERR_SUPERVISOR', { reason: `cannot start: ${options.setting ?? 'reef.port'} ${options.port} on ${options.host}: ${why}` }, { cause: err }));
      });
      server.listen({ host: options.host, port: options.port }, () => {
        const addr = server.address();
        const port = typeof addr === 'object' && addr !== null ? addr.port : options.port;
        resolve(new HeldListener(server, port, mkdtempSync(join(tmpdir(), 'reef-handoff-')), options));
      });
    });
  }

  /** Follow a newly spawned process: it serves from its `serving` message until it drains or exits. */
  attach(child: ChildProcess): void {
    const onMessage = (msg: unknown): void => {
      const type = (msg as { type?: unknown } | null)?.type;
      if (type === HANDOFF_SERVING && this.closing === null) {
        this.target = child;
        this.options.log(`handing gateway connections to pid ${child.pid} (${this.queue.size} held)`);
        for (const held of [...this.queue]) this.hand(held.socket, held);
      } else if (type === HANDOFF_DRAINING && this.target === child) {
        this.target = null;
      }
    };
    const onGone = (): void => {
      child.off('message', onMessage);
      if (this.target === child) this.target = null;
      // Left behind by a process that was killed; the next one binds a fresh one.
      rmSync(join(this.socketDir, handoffSocketName(child.pid ?? 0)), { force: true });
    };
    child.on('message', onMessage);
    child.once('exit', onGone);
    child.once('disconnect', () => {
      if (this.target === child) this.target = null;
    });
  }

  /** Stop accepting and refuse what is held; what was handed over stays the gateway's to finish. Idempotent. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      this.target = null;
      for (const held of [...this.queue]) this.refuse(held, 'stopping');
      // Not the close callback: it waits for every socket a gateway still serves to close.
      await new Promise<void>((resolve) => {
        this.server.close(() => resolve());
        setImmediate(resolve);
      });
      rmSync(this.socketDir, { recursive: true, force: true });
    })();
    return this.closing;
  }

  private onConnection(socket: Socket): void {
    socket.on('error', () => {});
    if (this.closing !== null) return this.refuse({ socket, timer: null }, 'stopping');
    if (this.target !== null && this.target.connected) return this.hand(socket, null);
    const maxQueued = this.options.maxQueued ?? 1024;
    if (this.queue.size >= maxQueued) return this.refuse({ socket, timer: null }, `restarting (${maxQueued} connections already wait for it, reef.limits.max_connections)`);
    const timeoutMs = this.options.queueTimeoutMs ?? 30_000;
    const held: Held = { socket, timer: null };
    held.timer = setTimeout(() => this.refuse(held, `restarting (not back within ${timeoutMs / 1000} s, reef.limits.headers_timeout_s)`), timeoutMs).unref();
    this.queue.add(held);
    this.counts.queued++;
  }

  private hand(socket: Socket, held: Held | null): void {
    const target = this.target;
    if (target === null || !target.connected) return;
    if (held !== null) {
      if (held.timer !== null) clearTimeout(held.timer);
      this.queue.delete(held);
    }
    this.counts.handed++;
    // A send that fails closes the descriptor here: the client sees its connection end, as it
    // would have with a gateway that died holding it.
    target.send({ type: HANDOFF_CONNECTION }, socket, (err) => {
      if (err) this.options.log(`handing a connection to pid ${target.pid} failed: ${err.message}`);
    });
  }

  /** A 503 the client can read and retry on, then the end of the connection. */
  private refuse(held: Held, state: string): void {
    if (held.timer !== null) clearTimeout(held.timer);
    this.queue.delete(held);
    this.counts.refused++;
    const { socket } = held;
    const body = JSON.stringify(errorBody('REEF_ERR_ACTOR_CLOSED', new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: 'gateway', state }).message));
    // Read and drop the request: closing with its bytes unread would send a reset, which can
    // discard the answer before the client reads it.
    socket.on('data', () => {});
    socket.resume();
    socket.end(`HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n${body}`);
    setTimeout(() => socket.destroy(), 2000).unref();
  }
}

/** The Unix socket a gateway process's HTTP server listens on inside `HANDOFF_DIR_ENV`. */
export function handoffSocketName(pid: number): string {
  return `gateway-${pid}.sock`;
}
