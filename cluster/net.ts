import { createServer, isIPv6 } from 'node:net';

/** A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Why nothing can listen on `host:port` now (in use, a privileged port, not this machine's
 * address), or null: it was free a moment ago, or the address gives another error, which the
 * process that binds it reports itself.
 */
export function portTaken(host: string, port: number): Promise<string | null> {
  const why: Record<string, string> = {
    EADDRINUSE: 'the port is in use by another process',
    EACCES: 'the port is one this user may not bind',
    EADDRNOTAVAIL: `${host} is not an address of this machine`,
  };
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', (err: NodeJS.ErrnoException) => resolve(why[err.code ?? ''] ?? null));
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => resolve(null)));
  });
}

/** The gateway's base URL for `reef.host`/`reef.port`; an IPv6 address goes in brackets (`http://::1:8600` is no URL). */
export function gatewayUrl(reef: { host: string; port: number }): string {
  return `http://${isIPv6(reef.host) ? `[${reef.host}]` : reef.host}:${reef.port}`;
}
