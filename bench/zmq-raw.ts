import * as zmq from 'zeromq';

/**
 * Plain ZeroMQ DEALER/ROUTER with no codec, validation or correlation: the floor the Reef runtime
 * (and the bridge) is measured against. Every request's first 4 bytes carry its sequence number,
 * which the server echoes back in a 4-byte reply.
 */
export interface RawPair {
  endpoint: string;
  dealer: zmq.Dealer;
  /** Send request `seq` with `payloadBytes` bytes (≥ 4). */
  send(seq: number): Promise<void>;
  /** Receive one reply, returning its seq. */
  receive(): Promise<number>;
  close(): Promise<void>;
}

/** A raw ROUTER that answers each request with its 4-byte sequence number. */
export async function rawEchoServer(): Promise<{ endpoint: string; close(): Promise<void> }> {
  const router = new zmq.Router({ sendHighWaterMark: 10_000, receiveHighWaterMark: 10_000, linger: 0 });
  await router.bind('tcp://127.0.0.1:*');
  const loop = (async () => {
    try {
      for await (const [identity, payload] of router) await router.send([identity!, payload!.subarray(0, 4)]);
    } catch {
      // closed
    }
  })();
  return {
    endpoint: router.lastEndpoint!,
    close: async () => {
      router.close();
      await loop;
    },
  };
}

export function rawClient(endpoint: string, payloadBytes: number): RawPair {
  const dealer = new zmq.Dealer({ sendHighWaterMark: 10_000, receiveHighWaterMark: 10_000, linger: 0 });
  dealer.connect(endpoint);
  const size = Math.max(4, payloadBytes);
  return {
    endpoint,
    dealer,
    send: async (seq) => {
      // A fresh buffer per request: zeromq may send large buffers without copying, after `send`
      // resolves, so a reused buffer could be rewritten under it.
      const payload = Buffer.allocUnsafe(size);
      payload.writeUInt32LE(seq >>> 0, 0);
      await dealer.send(payload);
    },
    receive: async () => {
      const [reply] = await dealer.receive();
      return reply!.readUInt32LE(0);
    },
    close: async () => {
      dealer.close();
    },
  };
}
