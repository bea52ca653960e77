import { rmSync } from 'node:fs';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { HANDOFF_CONNECTION, HANDOFF_DRAINING, HANDOFF_SERVING, handoffSocketName } from '../../cluster/held-listener.js';

/**
 * The gateway's side of the supervisor's held listener (cluster/held-listener.ts): it serves the
 * TCP connections the supervisor accepted on `reef.port` and passes over the IPC channel, and binds
 * no TCP port of its own, so a gateway that dies frees nothing another user could bind.
 *
 * The HTTP server still listens, on a Unix socket in the supervisor's private directory (0700):
 * Node starts its connection tracking (the headers and request timeouts that defeat a slowloris,
 * the closing of idle keep-alive connections on close) only for a server that is listening, and an
 * injected connection (`server.emit('connection', socket)`, which Node documents) is tracked like
 * an accepted one from then on. Nothing else reaches that socket.
 */

export interface HandedConnections {
  /** Open handed connections. */
  readonly open: number;
  /** Tell the supervisor to hand no more (a drain starts); idempotent. */
  stop(): void;
  /** Resolves once every handed connection has closed. */
  drained(): Promise<void>;
}

export async function serveHandedConnections(app: FastifyInstance, opts: { socketDir: string; maxConnections: number; log?: (line: string) => void }): Promise<HandedConnections> {
  if (typeof process.send !== 'function') throw new Error(`the gateway was started with a handoff directory but without an IPC channel`);
  const path = join(opts.socketDir, handoffSocketName(process.pid));
  rmSync(path, { force: true });
  await app.listen({ path });
  const open = new Set<Socket>();
  let stopped = false;
  let onEmpty: (() => void) | null = null;
  const onMessage = (msg: unknown, socket: unknown): void => {
    if ((msg as { type?: unknown } | null)?.type !== HANDOFF_CONNECTION) return;
    // Node's documentation: the connection may have closed while it was being sent.
    if (!socket) return;
    const s = socket as Socket;
    // As Node does for a listener past `maxConnections`: closed as it arrives, so descriptors stay
    // bounded. Handed connections are not the listener's, so its own cap never counts them.
    if (stopped || open.size >= opts.maxConnections) {
      s.destroy();
      return;
    }
    open.add(s);
    s.once('close', () => {
      open.delete(s);
      if (open.size === 0) onEmpty?.();
    });
    app.server.emit('connection', s);
  };
  process.on('message', onMessage);
  process.send({ type: HANDOFF_SERVING });
  opts.log?.(`gateway serving the supervisor's connections (HTTP server on ${path})`);
  return {
    get open() {
      return open.size;
    },
    stop() {
      if (stopped) return;
      stopped = true;
      process.off('message', onMessage);
      if (process.connected) process.send?.({ type: HANDOFF_DRAINING });
    },
    drained: () => (open.size === 0 ? Promise.resolve() : new Promise<void>((resolve) => (onEmpty = resolve))),
  };
}
