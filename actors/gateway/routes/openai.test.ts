import { createServer, request, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import type { FastifyRequest } from 'fastify';
import { describe, expect, it } from 'vitest';
import { FIRST_BODY_BUFFER, readSharedBody, watchClient } from './openai.js';

describe('readSharedBody', () => {
  const requestOf = (headers: Record<string, string>, bodyLimit = 64 * 1024 * 1024) => ({ headers, routeOptions: { bodyLimit } }) as unknown as FastifyRequest;
  const read = (headers: Record<string, string>, feed: (p: PassThrough) => void, bodyLimit?: number) =>
    new Promise<{ err: Error | null; body?: Buffer }>((resolve) => {
      const payload = new PassThrough();
      readSharedBody(requestOf(headers, bodyLimit), payload, (err, body) => resolve({ err, body: body as Buffer }));
      feed(payload);
    });

  it('does not allocate the declared length up front (regression: 64 MiB per connection that declared it and sent nothing)', async () => {
    const payload = new PassThrough();
    const before = process.memoryUsage().arrayBuffers;
    let finished = false;
    readSharedBody(requestOf({ 'content-length': String(64 * 1024 * 1024) }), payload, () => (finished = true));
    payload.write(Buffer.from('{"model":'));
    await new Promise((r) => setImmediate(r));
    expect(finished).toBe(false);
    expect(process.memoryUsage().arrayBuffers - before).toBeLessThanOrEqual(FIRST_BODY_BUFFER + 4096);
    payload.destroy();
  });

  it('grows to the bytes received, in shared memory, for declared and chunked bodies alike', async () => {
    const text = 'x'.repeat(300_000);
    for (const headers of [{ 'content-length': String(text.length) }, {}]) {
      const { err, body } = await read(headers, (p) => {
        for (let i = 0; i < text.length; i += 7000) p.write(text.slice(i, i + 7000));
        p.end();
      });
      expect(err).toBeNull();
      expect(body!.buffer).toBeInstanceOf(SharedArrayBuffer);
      expect(body!.length).toBe(text.length);
      expect(body!.toString()).toBe(text);
    }
  });

  it('refuses a body longer or shorter than declared, and one past the limit', async () => {
    expect((await read({ 'content-length': '5' }, (p) => p.end('123456'))).err).toBeInstanceOf(Error);
    expect((await read({ 'content-length': '5' }, (p) => p.end('1234'))).err).toBeInstanceOf(Error);
    expect(((await read({}, (p) => p.end('x'.repeat(2000)), 1000)).err as { statusCode?: number }).statusCode).toBe(413);
    expect(((await read({ 'content-length': '2000' }, () => {}, 1000)).err as { statusCode?: number }).statusCode).toBe(413);
  });
});

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
