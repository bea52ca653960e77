import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { BridgeClient } from '../../bridge/client.js';
import { spawnShim } from '../../bridge/shim-process.js';
import { pythonBin, pythonEnv, repoRoot } from '../../cluster/paths.js';
import { type BenchContext, type BenchRow, type BenchSuite, measureCalls, measureWindow, toRow } from '../lib.js';
import { rawClient, rawEchoServer } from '../zmq-raw.js';

/**
 * The bridge (BridgeClient → the real Python shim's `ping`: zod check, msgpack, RPC correlation
 * on our side; msgpack, dispatch and reply on the shim's socket thread) beside raw ZeroMQ in the
 * same run: a Node ROUTER echo (the transport floor in one process) and a pyzmq ROUTER echo in a
 * Python process (the floor across the language boundary, what the shim could at best do).
 */

const CASES: [string, number][] = [
  ['round trip, sequential', 1],
  ['round trip, 16 in flight', 16],
];

/** A pyzmq ROUTER that echoes each request's first 4 bytes (the sequence number). */
const PY_ECHO = `
import sys, zmq
ctx = zmq.Context()
s = ctx.socket(zmq.ROUTER)
s.setsockopt(zmq.LINGER, 0)
s.setsockopt(zmq.SNDHWM, 10000)
s.setsockopt(zmq.RCVHWM, 10000)
port = s.bind_to_random_port("tcp://127.0.0.1")
print(f"tcp://127.0.0.1:{port}", flush=True)
while True:
    ident, payload = s.recv_multipart(copy=False)
    s.send_multipart([ident, payload.bytes[:4]])
`;

async function bridgeRows(ctx: BenchContext): Promise<BenchRow[]> {
  const shim = await spawnShim({ logLevel: 'warning', log: () => {} });
  const client = await BridgeClient.forProcess(shim);
  try {
    const rows: BenchRow[] = [];
    for (const [name, concurrency] of CASES) {
      rows.push(toRow(name, 'BridgeClient → shim ping', await measureCalls(() => client.ping(), { seconds: ctx.seconds, concurrency })));
    }
    return rows;
  } finally {
    await client.close();
    await shim.stop();
  }
}

async function rawRows(endpoint: string, impl: string, ctx: BenchContext): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  for (const [name, window] of CASES) {
    const c = rawClient(endpoint, 16);
    try {
      rows.push(toRow(name, impl, await measureWindow(c.send, c.receive, { seconds: ctx.seconds, window })));
    } finally {
      await c.close();
    }
  }
  return rows;
}

async function pyzmqRows(ctx: BenchContext): Promise<BenchRow[]> {
  const child = spawn(pythonBin(), ['-c', PY_ECHO], { cwd: repoRoot(), env: pythonEnv({}), stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  try {
    const endpoint = await new Promise<string>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (code) => reject(new Error(`pyzmq echo exited with code ${code} before it bound`)));
      createInterface({ input: child.stdout! }).once('line', resolve);
    });
    return await rawRows(endpoint, 'raw zeromq, pyzmq echo', ctx);
  } finally {
    child.kill('SIGKILL');
    await exited;
  }
}

export const suite: BenchSuite = {
  name: 'bridge',
  description: 'bridge RPC (BridgeClient → Python shim ping) beside raw ZeroMQ echo servers in Node and pyzmq, loopback TCP',
  run: async (ctx) => {
    const bridge = await bridgeRows(ctx);
    const node = await rawEchoServer();
    let raw: BenchRow[];
    try {
      raw = await rawRows(node.endpoint, 'raw zeromq, node echo', ctx);
    } finally {
      await node.close();
    }
    const py = await pyzmqRows(ctx);
    return bridge.flatMap((row) => [row, ...py.filter((r) => r.case === row.case), ...raw.filter((r) => r.case === row.case)]);
  },
};
