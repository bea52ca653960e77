import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/wait.js';
import { CHAT, openAIError, startStack, type Stack } from './harness.js';

/** A gateway that is closing, as a client with a keep-alive connection sees it. */

describe('gateway drain', () => {
  let s: Stack;

  beforeAll(async () => {
    s = await startStack({ engine: { delayMs: () => 400 } });
  });
  afterAll(async () => {
    await s?.close();
  });

  it('a request that arrives while the gateway drains gets a 503 with the OpenAI error body and Retry-After (regression: fastify\'s own body)', async () => {
    const { hostname, port } = new URL(s.url);
    const sock = connect(Number(port), hostname);
    const received: Buffer[] = [];
    sock.on('data', (b) => received.push(b));
    const ended = new Promise<void>((resolve) => sock.on('close', () => resolve()));
    const chat = JSON.stringify(CHAT);
    // A chat in flight keeps the connection busy, so closing the server does not reap it.
    sock.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(chat)}\r\n\r\n${chat}`);
    await waitFor(() => s.engine.requests.length === 1, { what: 'the chat to reach the engine' });
    const closed = s.gw.close();
    sock.write('GET /reef/status HTTP/1.1\r\nhost: localhost\r\n\r\n');
    await ended;
    await closed;
    const text = Buffer.concat(received).toString('utf8');
    const responses = text.split(/(?=HTTP\/1\.1 )/);
    expect(responses).toHaveLength(2);
    expect(responses[0]).toMatch(/^HTTP\/1\.1 200 /);
    const [head, body] = responses[1]!.split('\r\n\r\n');
    expect(head).toMatch(/^HTTP\/1\.1 503 /);
    expect(head).toMatch(/\r\nretry-after: \d+/i);
    expect(head).toMatch(/\r\nconnection: close/i);
    const err = openAIError(JSON.parse(body!));
    expect([err.type, err.code]).toEqual(['service_unavailable', 'REEF_ERR_ACTOR_DRAINING']);
  });
});
