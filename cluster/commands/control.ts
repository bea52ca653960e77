import { resolve } from 'node:path';
import { RpcClient } from '../../actors/runtime/rpc.js';
import { ReefError } from '../../actors/runtime/errors.js';
import { flagBool, type ParsedArgs } from '../args.js';
import type { Io } from '../cli.js';
import { pidAlive, readRunFile, type RunFile } from '../run-file.js';
import { renderStatus } from './render-status.js';
import { dataDirOf } from './export.js';

/** The run directory of the stack a command talks to: `--data-dir`, the config's, or `.reef`. */
export async function runDirOf(args: ParsedArgs): Promise<string> {
  return resolve(await dataDirOf(args), 'run');
}

async function connect(args: ParsedArgs): Promise<{ rf: RunFile; rpc: RpcClient }> {
  const runDir = await runDirOf(args);
  const rf = readRunFile(runDir);
  if (!rf) throw new ReefError('REEF_ERR_NOT_RUNNING', { path: runDir });
  return { rf, rpc: new RpcClient(rf.control, { name: 'reef-cli', defaultTimeoutMs: 30_000 }) };
}

export async function statusCommand(args: ParsedArgs, io: Io): Promise<number> {
  const { rf, rpc } = await connect(args);
  try {
    const reply = (await rpc.call({ type: 'status' }, { timeoutMs: 15_000 })) as Record<string, unknown>;
    const { type: _t, requestId: _r, ...status } = reply;
    if (flagBool(args, 'json')) io.stdout(JSON.stringify({ supervisor: rf, ...status }, null, 2));
    else io.stdout(renderStatus(rf, status));
    return 0;
  } finally {
    await rpc.close();
  }
}

export async function scaleCommand(args: ParsedArgs, rest: string[], io: Io): Promise<number> {
  const [actor, countText] = rest;
  const count = Number(countText);
  if (actor !== 'prm' || !Number.isInteger(count) || count < 0) {
    io.stderr('usage: reef scale prm N   (N: an integer ≥ 0)');
    return 2;
  }
  const { rpc } = await connect(args);
  try {
    // Starting actors waits for them to register, which can take a while on a busy machine.
    const reply = (await rpc.call({ type: 'scale', actor, count }, { timeoutMs: 120_000 })) as { before: number; after: number };
    io.stdout(`scaled ${actor}: ${reply.before} → ${reply.after}`);
    return 0;
  } finally {
    await rpc.close();
  }
}

export async function downCommand(args: ParsedArgs, io: Io): Promise<number> {
  const { rf, rpc } = await connect(args);
  try {
    await rpc.call({ type: 'down' }, { timeoutMs: 15_000 });
  } finally {
    await rpc.close();
  }
  io.stdout(`stopping reef (pid ${rf.pid}) …`);
  const deadline = Date.now() + 180_000;
  let lastNote = Date.now();
  while (pidAlive(rf.pid)) {
    if (Date.now() > deadline) {
      io.stderr(`reef: the stack (pid ${rf.pid}) is still stopping after 180 s; see its log`);
      return 1;
    }
    if (Date.now() - lastNote > 10_000) {
      io.stdout('  still draining …');
      lastNote = Date.now();
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  io.stdout('stopped');
  return 0;
}
