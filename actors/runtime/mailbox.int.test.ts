import { readdirSync } from 'node:fs';
import * as net from 'node:net';
import * as zmq from 'zeromq';
import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { waitFor } from '../../test/helpers/wait.js';
import { decode, encode } from './codec.js';
import { ReefError } from './errors.js';
import { Mailbox } from './mailbox.js';
import { RpcClient } from './rpc.js';

const messages = z.discriminatedUnion('type', [
  z.object({ type: z.literal('add'), requestId: z.string(), a: z.number(), b: z.number() }),
  z.object({ type: z.literal('fail'), requestId: z.string(), code: z.string().nullable() }),
  z.object({ type: z.literal('slow'), requestId: z.string(), ms: z.number() }),
  z.object({ type: z.literal('typed'), requestId: z.string() }),
]);

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

async function setUp(concurrency = 64) {
  let active = 0;
  let maxActive = 0;
  const mailbox = await Mailbox.open({
    name: 'test',
    schema: messages,
    concurrency,
    log: () => {},
    handlers: {
      add: (msg) => ({ sum: msg.a + msg.b }),
      fail: (msg) => {
        if (msg.code === null) throw new Error('plain failure');
        throw new ReefError('REEF_ERR_NOT_FOUND', { what: msg.code });
      },
      slow: async (msg) => {
        active++;
        maxActive = Math.max(maxActive, active);
        await new Promise((resolve) => setTimeout(resolve, msg.ms));
        active--;
        return { waited: msg.ms };
      },
      typed: () => ({ ids: new Int32Array([1, 2]) }),
    },
  });
  const rpc = new RpcClient(mailbox.endpoint, { name: 'client', log: () => {} });
  cleanups.push(() => mailbox.close(), () => rpc.close());
  return { mailbox, rpc, maxActive: () => maxActive };
}

/** A raw DEALER, to send what a well-behaved client never would. */
async function rawCall(endpoint: string, payload: Buffer): Promise<Record<string, unknown>> {
  const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 5000 });
  dealer.connect(endpoint);
  try {
    await dealer.send([payload]);
    const [reply] = await dealer.receive();
    return decode(reply!) as Record<string, unknown>;
  } finally {
    dealer.close();
  }
}

describe('Mailbox + RpcClient over real sockets', () => {
  it('round-trips a request with an ok reply carrying the requestId', async () => {
    const { rpc, mailbox } = await setUp();
    expect(mailbox.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    const reply = await rpc.call<{ type: string; requestId: string; sum: number }>({ type: 'add', a: 2, b: 3 });
    expect(reply).toMatchObject({ type: 'ok', sum: 5 });
    expect(typeof reply.requestId).toBe('string');
    const parsed = await rpc.call({ type: 'add', a: 1, b: 1 }, { schema: z.object({ type: z.literal('ok'), sum: z.number() }) });
    expect(parsed.sum).toBe(2);
    expect(mailbox.stats.ok).toBe(2);
  });

  it('answers a schema violation with REEF_ERR_BAD_MESSAGE and keeps serving', async () => {
    const { rpc } = await setUp();
    const err = await rpc.call({ type: 'add', a: 'two', b: 3 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ReefError);
    expect((err as ReefError).code).toBe('REEF_ERR_BAD_MESSAGE');
    expect((err as ReefError).message).toContain('a:');
    await expect(rpc.call({ type: 'add', a: 1, b: 2 })).resolves.toMatchObject({ sum: 3 });
  });

  it('answers an unknown type with REEF_ERR_UNKNOWN_MESSAGE', async () => {
    const { rpc } = await setUp();
    await expect(rpc.call({ type: 'nope' })).rejects.toMatchObject({ code: 'REEF_ERR_UNKNOWN_MESSAGE' });
    await expect(rpc.call({ type: 'toString' })).rejects.toMatchObject({ code: 'REEF_ERR_UNKNOWN_MESSAGE' });
  });

  it('answers undecodable bytes and non-map messages with REEF_ERR_BAD_MESSAGE', async () => {
    const { mailbox } = await setUp();
    const garbage = await rawCall(mailbox.endpoint, Buffer.from([0xc1, 0xff, 0x00]));
    expect(garbage).toMatchObject({ type: 'error', code: 'REEF_ERR_BAD_MESSAGE', requestId: null, retryable: false });
    const list = await rawCall(mailbox.endpoint, encode([1, 2, 3]));
    expect(list).toMatchObject({ type: 'error', code: 'REEF_ERR_BAD_MESSAGE' });
    const noId = await rawCall(mailbox.endpoint, encode({ type: 'add', a: 1, b: 2 }));
    expect(noId).toMatchObject({ type: 'error', code: 'REEF_ERR_BAD_MESSAGE' });
    expect(mailbox.stats.rejected).toBe(3);
  });

  it('carries a ReefError thrown by a handler to the caller with the same code; other errors become REEF_ERR_HANDLER', async () => {
    const { rpc } = await setUp();
    await expect(rpc.call({ type: 'fail', code: 'widget' })).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND', message: 'widget not found' });
    await expect(rpc.call({ type: 'fail', code: null })).rejects.toMatchObject({ code: 'REEF_ERR_HANDLER' });
  });

  // The codec refuses typed arrays that are not bytes (they used to go out truncated): a reply
  // holding one must reach the caller as an error, not leave it waiting for its timeout.
  it('answers a handler whose reply holds an Int32Array with REEF_ERR_HANDLER, and refuses to send one', async () => {
    const { rpc, mailbox } = await setUp();
    await expect(rpc.call({ type: 'typed' }, { timeoutMs: 60_000 })).rejects.toMatchObject({ code: 'REEF_ERR_HANDLER', message: expect.stringContaining('Int32Array') });
    await expect(rpc.call({ type: 'add', a: new Float32Array([1]), b: 2 })).rejects.toMatchObject({ code: 'REEF_ERR_BAD_MESSAGE', message: expect.stringContaining('Float32Array') });
    expect(rpc.inFlight).toBe(0);
    await expect(rpc.call({ type: 'add', a: 1, b: 2 })).resolves.toMatchObject({ sum: 3 });
    expect(mailbox.stats).toMatchObject({ ok: 1, errors: 1 });
  });

  it('times out a slow call with REEF_ERR_TIMEOUT and drops the late reply', async () => {
    const { rpc } = await setUp();
    await expect(rpc.call({ type: 'slow', ms: 300 }, { timeoutMs: 50 })).rejects.toMatchObject({ code: 'REEF_ERR_TIMEOUT' });
    expect(rpc.inFlight).toBe(0);
    // The late reply arrives and is counted as dropped; the client stays usable.
    await waitFor(() => rpc.dropped === 1, { what: 'the late reply to be dropped', timeoutMs: 5000 });
    await expect(rpc.call({ type: 'add', a: 1, b: 1 })).resolves.toMatchObject({ sum: 2 });
  });

  it('waits for the reply when the timeout is longer than a timer can hold (2^31 - 1 ms)', async () => {
    const { rpc } = await setUp();
    await expect(rpc.call({ type: 'slow', ms: 50 }, { timeoutMs: 2 ** 31 })).resolves.toMatchObject({ waited: 50 });
    await expect(rpc.call({ type: 'slow', ms: 50 }, { timeoutMs: Number.POSITIVE_INFINITY })).resolves.toMatchObject({ waited: 50 });
    expect(rpc.inFlight).toBe(0);
  });

  it('rejects a request zeromq cannot hand to an absent peer with a retryable REEF_ERR_TIMEOUT, not a bare EAGAIN', async () => {
    // Nothing listens here; with a high-water mark of 1 the second request waits for room and fails.
    const port = await new Promise<number>((resolve) => {
      const srv = net.createServer().listen(0, '127.0.0.1', () => {
        const { port: p } = srv.address() as net.AddressInfo;
        srv.close(() => resolve(p));
      });
    });
    const rpc = new RpcClient(`tcp://127.0.0.1:${port}`, { name: 'nobody', sendHighWaterMark: 1, sendTimeoutMs: 100, log: () => {} });
    cleanups.push(() => rpc.close());
    const first = rpc.call({ type: 'add', a: 1, b: 1 }, { timeoutMs: 60_000 }).catch((e: unknown) => e);
    const err = await rpc.call({ type: 'add', a: 2, b: 2 }, { timeoutMs: 60_000 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ReefError);
    expect(err).toMatchObject({ code: 'REEF_ERR_TIMEOUT', retryable: true, message: 'nobody add (sending the request) timed out after 100 ms' });
    expect(rpc.inFlight).toBe(1);
    await rpc.close();
    await expect(first).resolves.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED' });
  });

  it('refuses an endpoint zeromq cannot connect to with REEF_ERR_INVALID_ARGUMENT and leaves no socket open', async () => {
    const fds = () => readdirSync('/proc/self/fd').length;
    const before = fds();
    for (let i = 0; i < 20; i++) {
      let err: unknown = null;
      try {
        new RpcClient('localhost:5555', { name: 'misconfigured' });
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ReefError);
      expect(err).toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('misconfigured: cannot connect to "localhost:5555"') });
    }
    // zeromq's reaper thread releases a closed socket's descriptors a moment later.
    await waitFor(() => fds() <= before + 2, { what: `the 20 refused clients' descriptors to be released (${before} before)`, timeoutMs: 5000 });
  });

  it('close() rejects pending calls with REEF_ERR_ACTOR_CLOSED and refuses new ones', async () => {
    const { rpc } = await setUp();
    const pending = rpc.call({ type: 'slow', ms: 2000 }, { timeoutMs: 10_000 });
    await rpc.close();
    await expect(pending).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED' });
    await expect(rpc.call({ type: 'add', a: 1, b: 1 })).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED' });
    await rpc.close();
  });

  it('runs handlers concurrently up to its limit', async () => {
    const { rpc, maxActive } = await setUp(3);
    const replies = await Promise.all(Array.from({ length: 8 }, () => rpc.call({ type: 'slow', ms: 40 })));
    expect(replies).toHaveLength(8);
    expect(maxActive()).toBe(3);
  });

  it('close() lets a running handler finish and send its reply', async () => {
    const { rpc, mailbox } = await setUp();
    const pending = rpc.call({ type: 'slow', ms: 100 });
    await waitFor(() => mailbox.stats.inFlight === 1, { what: 'the slow handler to start' });
    await mailbox.close();
    await expect(pending).resolves.toMatchObject({ waited: 100 });
    expect(mailbox.lifecycle.state).toBe('stopped');
  });

  // The receive loop was already waiting when close() began, so a request that came in while a
  // slow handler drained was run, on a mailbox its owner had closed (e.g. a `scale` reaching the
  // supervisor after `down`).
  it('close() refuses a request that arrives while handlers drain, without running its handler', async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const ran: string[] = [];
    const mailbox = await Mailbox.open({
      name: 'closing',
      schema: messages,
      log: () => {},
      handlers: {
        add: (msg) => {
          ran.push('add');
          return { sum: msg.a + msg.b };
        },
        fail: () => ({}),
        slow: async () => {
          await gate;
          return { waited: 0 };
        },
        typed: () => ({}),
      },
    });
    const rpc = new RpcClient(mailbox.endpoint, { name: 'client', log: () => {} });
    // Popped first: a failed assertion must not leave close() waiting on the gate.
    cleanups.push(() => rpc.close(), () => mailbox.close(), async () => release());
    const slow = rpc.call({ type: 'slow', ms: 0 });
    await waitFor(() => mailbox.stats.inFlight === 1, { what: 'the slow handler to start' });
    const closed = mailbox.close();
    await expect(rpc.call({ type: 'add', a: 1, b: 2 })).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED', retryable: true });
    // Only the receive already waiting was answered; later requests sat unread until the caller's
    // timeout ran out (a minute for the trainer-controller pausing a restarting gateway).
    const later = await Promise.all([1, 2, 3].map((a) => rpc.call({ type: 'add', a, b: 2 }, { timeoutMs: 3000 }).catch((e: unknown) => e)));
    expect(later).toEqual([1, 2, 3].map(() => expect.objectContaining({ code: 'REEF_ERR_ACTOR_CLOSED', retryable: true })));
    expect(ran).toEqual([]);
    release();
    await expect(slow).resolves.toMatchObject({ waited: 0 });
    await closed;
    expect(mailbox.lifecycle.state).toBe('stopped');
  });
});
