import { randomInt } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer, isIPv6 } from 'node:net';

/**
 * Where ports are picked: above Ray's worker ports (10002–19999 by default) and below the range the
 * OS hands out to `listen(0)` and outgoing connections (Linux: 32768–60999). A port the OS picked was
 * in that range, so a server of another process listening on port 0 could be given it between the
 * pick and the bind, which for an engine is seconds later: a test run saw an hf engine fail to start
 * with EADDRINUSE that way.
 */
const PICK_FROM = 20_000;
const PICK_TO = 32_767;

/** The OS's range for ephemeral ports, or null where it cannot be read (not Linux). */
export function ephemeralPorts(text?: string): [number, number] | null {
  let raw = text;
  if (raw === undefined) {
    try {
      raw = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8');
    } catch {
      return null;
    }
  }
  const m = /^\s*(\d+)\s+(\d+)\s*$/.exec(raw);
  return m ? [Number(m[1]), Number(m[2])] : null;
}

/**
 * A TCP port on 127.0.0.1 that was free a moment ago: a random one below the OS's ephemeral range
 * (see PICK_FROM), probed; where that range leaves too little room below it, one the OS picks.
 */
export async function freePort(range: [number, number] | null = ephemeralPorts()): Promise<number> {
  const top = Math.min(PICK_TO, (range?.[0] ?? PICK_TO + 1) - 1);
  if (range !== null && top - PICK_FROM >= 1000) {
    for (let i = 0; i < 32; i++) {
      const port = PICK_FROM + randomInt(top - PICK_FROM + 1);
      if ((await portTaken('127.0.0.1', port)) === null) return port;
    }
  }
  return osPickedPort();
}

function osPickedPort(): Promise<number> {
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
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', (err: NodeJS.ErrnoException) => resolve(bindProblem(host, err)));
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => resolve(null)));
  });
}

/** What a failed listen on `host` means, in words, for the three errors a port or address explains; null for any other. */
export function bindProblem(host: string, err: NodeJS.ErrnoException): string | null {
  const why: Record<string, string> = {
    EADDRINUSE: 'the port is in use by another process',
    EACCES: 'the port is one this user may not bind',
    EADDRNOTAVAIL: `${host} is not an address of this machine`,
  };
  return why[err.code ?? ''] ?? null;
}

/** The gateway's base URL for `reef.host`/`reef.port`; an IPv6 address goes in brackets (`http://::1:8600` is no URL). */
export function gatewayUrl(reef: { host: string; port: number }): string {
  return `http://${isIPv6(reef.host) ? `[${reef.host}]` : reef.host}:${reef.port}`;
}
