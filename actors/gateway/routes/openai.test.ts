import { createServer, request, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { watchClient } from './openai.js';

describe('watchClient', () => {
  /** A real response whose client sent its body and then went away; `res` once its 'close' has fired. */
  async function responseOfClientGone(): Promise<{ res: ServerResponse; close: () => void }> {
    let resolve!: (res: ServerResponse) => void;
    const closed = new Promise<ServerResponse>((r) => (resolve = r));
    const server = createServer((req, res) => {
      req.resume();
      res.once('close', () => resolve(res));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = request({ port: (server.address() as AddressInfo).port, host: '127.0.0.1', method: 'POST' });
    client.on('error', () => {});
    client.end('{}', () => client.destroy());
    const res = await closed;
    return { res, close: () => server.close() };
  }

  it('aborts at once for a client that left before the watch began (regression: the generation ran on, holding the key\'s slot)', async () => {
    const { res, close } = await responseOfClientGone();
    try {
      const gone = watchClient(res);
      expect(gone.signal.aborted).toBe(true);
      gone.stop();
    } finally {
      close();
    }
  });
});
