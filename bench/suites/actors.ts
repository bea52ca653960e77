import { z } from 'zod';
import { Mailbox } from '../../actors/runtime/mailbox.js';
import { RpcClient } from '../../actors/runtime/rpc.js';
import { type BenchContext, type BenchRow, type BenchSuite, measureCalls, measureWindow, toRow } from '../lib.js';
import { rawClient, rawEchoServer } from '../zmq-raw.js';

/**
 * The actor runtime (Mailbox + RpcClient: msgpack, zod validation, correlation, timeouts, send
 * queues) beside raw ZeroMQ DEALER/ROUTER in the same process and run. Client and server share one
 * event loop in both, so the gap is the runtime's own cost.
 */
const messages = z.discriminatedUnion('type', [
  z.object({ type: z.literal('echo'), requestId: z.string(), n: z.number() }),
  z.object({ type: z.literal('blob'), requestId: z.string(), data: z.instanceof(Uint8Array) }),
]);

const BIG = 64 * 1024;

async function runtimeCases(ctx: BenchContext): Promise<BenchRow[]> {
  const mailbox = await Mailbox.open({
    name: 'bench',
    schema: messages,
    concurrency: 256,
    sendHighWaterMark: 10_000,
    receiveHighWaterMark: 10_000,
    handlers: { echo: (msg) => ({ n: msg.n }), blob: (msg) => ({ bytes: msg.data.length }) },
  });
  const rpc = new RpcClient(mailbox.endpoint, { name: 'bench', sendHighWaterMark: 10_000, receiveHighWaterMark: 10_000 });
  const blob = Buffer.alloc(BIG, 7);
  const impl = 'mailbox+rpc';
  const rows: BenchRow[] = [];
  try {
    const echo = () => rpc.call({ type: 'echo', n: 1 });
    rows.push(toRow('round trip, sequential', impl, await measureCalls(echo, { seconds: ctx.seconds })));
    rows.push(toRow('round trip, 16 in flight', impl, await measureCalls(echo, { seconds: ctx.seconds, concurrency: 16 })));
    rows.push(toRow('throughput, small, 64 in flight', impl, await measureCalls(echo, { seconds: ctx.seconds, concurrency: 64 })));
    const big = () => rpc.call({ type: 'blob', data: blob });
    rows.push(toRow('throughput, 64 KiB, 16 in flight', impl, await measureCalls(big, { seconds: ctx.seconds, concurrency: 16 }), BIG));
  } finally {
    await rpc.close();
    await mailbox.close();
  }
  return rows;
}

async function rawCases(ctx: BenchContext): Promise<BenchRow[]> {
  const server = await rawEchoServer();
  const impl = 'raw zeromq';
  const rows: BenchRow[] = [];
  const cases: [string, number, number, boolean][] = [
    ['round trip, sequential', 16, 1, false],
    ['round trip, 16 in flight', 16, 16, false],
    ['throughput, small, 64 in flight', 16, 64, false],
    ['throughput, 64 KiB, 16 in flight', BIG, 16, true],
  ];
  try {
    for (const [name, bytes, window, big] of cases) {
      const client = rawClient(server.endpoint, bytes);
      try {
        const m = await measureWindow(client.send, client.receive, { seconds: ctx.seconds, window });
        rows.push(toRow(name, impl, m, big ? BIG : null));
      } finally {
        await client.close();
      }
    }
  } finally {
    await server.close();
  }
  return rows;
}

export const suite: BenchSuite = {
  name: 'actors',
  description: 'actor RPC (Mailbox + RpcClient) beside raw ZeroMQ DEALER/ROUTER, one process, loopback TCP',
  run: async (ctx) => {
    const runtime = await runtimeCases(ctx);
    const raw = await rawCases(ctx);
    // Interleave so each case's two implementations sit next to each other in the table.
    return runtime.flatMap((row) => [row, ...raw.filter((r) => r.case === row.case)]);
  },
};
