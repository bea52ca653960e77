import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { readPipelineCounters } from '../../actors/gateway/pipeline-status.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { BUS_KEY_FILE, readBusKeyFile } from '../../actors/runtime/bus-key.js';
import { RpcClient } from '../../actors/runtime/rpc.js';
import { ReefError } from '../../actors/runtime/errors.js';
import { flagBool, type ParsedArgs } from '../args.js';
import type { Io } from '../cli.js';
import { deadRunFile, pidAlive, readRunFile, reusedRunFile, type RunFile } from '../run-file.js';
import { renderStatus, type PipelineSummary } from './render-status.js';
import { MAX_SCALE, type ReloadKeysReply } from '../supervisor-messages.js';
import { dataDirOf } from './export.js';

/** The run directory of the stack a command talks to: `--data-dir`, the config's, or `.reef`. */
export async function runDirOf(args: ParsedArgs): Promise<string> {
  return resolve(await dataDirOf(args), 'run');
}

async function findStack(args: ParsedArgs): Promise<RunFile> {
  const runDir = await runDirOf(args);
  const rf = readRunFile(runDir);
  if (rf) return rf;
  // The stack's process wrote `startedAt` after it started; one that started later got the pid of
  // a stack that died without removing its file. `down` used to send that process SIGTERM.
  const reused = reusedRunFile(runDir);
  if (reused) {
    throw new ReefError('REEF_ERR_NOT_RUNNING', { path: runDir }, {
      message: `no running reef stack found at ${runDir}: its run file names pid ${reused.rf.pid}, which is now another process (started ${new Date(reused.startedMs).toISOString()}, after the stack's ${new Date(reused.rf.startedAt).toISOString()})`,
    });
  }
  // Said only "no running reef stack": the user could not tell a killed stack from a wrong path.
  const dead = deadRunFile(runDir);
  if (dead) {
    throw new ReefError('REEF_ERR_NOT_RUNNING', { path: runDir }, {
      message: `no running reef stack found at ${runDir}: the stack of pid ${dead.pid} (started ${new Date(dead.startedAt).toISOString()}) exited without removing its run file, as a killed one does; the next reef up takes the file over`,
    });
  }
  throw new ReefError('REEF_ERR_NOT_RUNNING', { path: runDir });
}

/** The control socket takes only a client holding the stack's key, which `reef up` left in the run dir. */
async function connect(args: ParsedArgs, rf: RunFile): Promise<RpcClient> {
  const busKey = readBusKeyFile(join(await runDirOf(args), BUS_KEY_FILE));
  return new RpcClient(rf.control!, { name: 'reef-cli', defaultTimeoutMs: 30_000, busKey });
}

/** A stack still starting has no control socket in its run file yet. */
function starting(rf: RunFile): string {
  return `reef is starting (pid ${rf.pid}, for ${Math.round((Date.now() - rf.startedAt) / 1000)} s, config ${rf.configPath})`;
}

export async function statusCommand(args: ParsedArgs, io: Io): Promise<number> {
  const rf = await findStack(args);
  if (rf.state === 'starting') {
    io.stdout(flagBool(args, 'json') ? JSON.stringify({ supervisor: rf }, null, 2) : `${starting(rf)}; status shows more once it is up`);
    return 0;
  }
  const rpc = await connect(args, rf);
  try {
    const reply = (await rpc.call({ type: 'status' }, { timeoutMs: 15_000 })) as Record<string, unknown>;
    const { type: _t, requestId: _r, ...status } = reply;
    const pipeline = await pipelineOf(await dataDirOf(args));
    if (flagBool(args, 'json')) io.stdout(JSON.stringify({ supervisor: rf, ...status, pipeline }, null, 2));
    else io.stdout(renderStatus(rf, status, pipeline));
    return 0;
  } finally {
    await rpc.close();
  }
}

/**
 * What the stack has recorded, judged and trained, as its actors persisted it: read from the
 * record store (read-only) rather than asked of the gateway, which may want an API key; `{error}`,
 * with the reason, when the store cannot be read.
 */
export async function pipelineOf(dataDir: string): Promise<PipelineSummary | { error: string }> {
  const path = join(dataDir, 'records.sqlite');
  if (!existsSync(path)) return { error: `no record store at ${path}` };
  let store: SqliteStore | null = null;
  try {
    store = SqliteStore.open(path, { readonly: true });
    return { records: await store.headOffset(), ...(await readPipelineCounters(store)) };
  } catch (err) {
    return { error: (err as Error).message };
  } finally {
    await store?.close();
  }
}

export async function scaleCommand(args: ParsedArgs, rest: string[], io: Io): Promise<number> {
  const [actor, countText, ...extra] = rest;
  // Number('') and Number(' ') are 0: `reef scale prm "$N"` with N unset would have stopped every PRM.
  const count = countText !== undefined && /^\d+$/.test(countText) ? Number(countText) : Number.NaN;
  if (actor !== 'prm' || !Number.isSafeInteger(count) || count > MAX_SCALE || extra.length > 0) {
    io.stderr(`usage: reef scale prm N   (N: an integer from 0 to ${MAX_SCALE})`);
    return 2;
  }
  const rf = await findStack(args);
  if (rf.state === 'starting') {
    io.stderr(`${starting(rf)}; scale it once it is up`);
    return 1;
  }
  const rpc = await connect(args, rf);
  try {
    // Starting actors waits for them to register, which can take a while on a busy machine.
    const reply = (await rpc.call({ type: 'scale', actor, count }, { timeoutMs: 120_000 })) as { before: number; after: number };
    io.stdout(`scaled ${actor}: ${reply.before} → ${reply.after}`);
    return 0;
  } finally {
    await rpc.close();
  }
}

/**
 * `reef keys reload`: each running gateway re-reads `reef.api_keys` from the config file (and the
 * environment) it was started with. A refused reload leaves the old keys in force and exits 2 with
 * the gateway's error, which names the key path.
 */
export async function keysCommand(args: ParsedArgs, rest: string[], io: Io): Promise<number> {
  if (rest.length !== 1 || rest[0] !== 'reload') {
    io.stderr('usage: reef keys reload [-c FILE | --data-dir DIR]');
    return 2;
  }
  const rf = await findStack(args);
  if (rf.state === 'starting') {
    io.stderr(`${starting(rf)}; the gateway reads the keys as they are when it starts`);
    return 1;
  }
  const rpc = await connect(args, rf);
  try {
    const reply = (await rpc.call({ type: 'reload-keys' }, { timeoutMs: 30_000 })) as ReloadKeysReply;
    for (const g of reply.gateways) {
      io.stdout(g.keys === null ? `${g.id}: not running (${g.state}); it reads the keys when it starts` : `${g.id}: ${g.keys} API key${g.keys === 1 ? '' : 's'} in force`);
    }
    return 0;
  } finally {
    await rpc.close();
  }
}

/** Send `sig` to `pid`; false if it is gone already (it exited since its run file was read). */
function signal(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false;
    throw err;
  }
}

/** `ackTimeoutMs`: how long a running stack has to acknowledge `down` before it gets SIGTERM instead. */
export async function downCommand(args: ParsedArgs, io: Io, opts: { ackTimeoutMs?: number } = {}): Promise<number> {
  const rf = await findStack(args);
  if (rf.state === 'starting') {
    // Its SIGTERM handler stops it after the start-up step in progress.
    signal(rf.pid, 'SIGTERM');
    io.stdout(`stopping reef (pid ${rf.pid}), which was still starting …`);
  } else {
    const rpc = await connect(args, rf);
    try {
      await rpc.call({ type: 'down' }, { timeoutMs: opts.ackTimeoutMs ?? 15_000 });
      io.stdout(`stopping reef (pid ${rf.pid}) …`);
    } catch (err) {
      // A control socket that does not answer (the stack is busy, or already closing it) left the
      // stack running with only the RPC's error said; `reef up` drains on SIGTERM the same way.
      if (signal(rf.pid, 'SIGTERM')) io.stdout(`reef (pid ${rf.pid}) did not answer down on ${rf.control} (${(err as Error).message}); sent it SIGTERM, which drains it the same way …`);
    } finally {
      await rpc.close();
    }
  }
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
