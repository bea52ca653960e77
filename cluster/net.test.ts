import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { ephemeralPorts, freePort } from './net.js';

describe('freePort', () => {
  it('reads the OS range of ephemeral ports', () => {
    expect(ephemeralPorts('32768\t60999\n')).toEqual([32768, 60999]);
    expect(ephemeralPorts('garbage')).toBeNull();
  });

  it('picks below the ephemeral range, where no listen(0) of another process is given the port before it is bound', async () => {
    const ports = await Promise.all(Array.from({ length: 20 }, () => freePort([32768, 60999])));
    for (const p of ports) expect(p >= 20_000 && p < 32768, `port ${p}`).toBe(true);
    // And it is free: a server can listen on it.
    const srv = createServer();
    await new Promise<void>((resolve, reject) => {
      srv.once('error', reject);
      srv.listen(ports[0], '127.0.0.1', () => resolve());
    });
    await new Promise((resolve) => srv.close(resolve));
  });

  it('lets the OS pick where the ephemeral range leaves too little room below it, or cannot be read', async () => {
    for (const range of [[1024, 65535], null] as const) {
      const p = await freePort(range as [number, number] | null);
      expect(p).toBeGreaterThan(0);
    }
  });
});
