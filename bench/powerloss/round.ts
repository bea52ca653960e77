import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import YAML from 'yaml';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { tinyModelDir } from '../../cluster/paths.js';
import { CHAT, CPU_EXAMPLE } from '../../test/gateway/harness.js';
import { cutPower, powercutEnv, watchedPids, type CutResult } from '../../test/helpers/powercut.js';
import { spawnGateway } from '../../test/helpers/gateway-process.js';

/**
 * One round of the power-loss emulation against the real gateway: a gateway process (as `reef up`
 * starts it) on a fresh data dir under the powercut library, clients posting chat completions to it
 * through the fake engine and appending each receipt to an fsynced log outside that dir, a "power
 * cut" at a random moment after the first receipt (SIGKILL, then the durable image put in place),
 * and a check of the restored store. An emulation at fsync granularity, not a power cut
 * (docs/benchmarks.md "The power-loss emulation").
 */

export type Durability = 'power' | 'process';

export interface RoundOptions {
  durability: Durability;
  /** The fake engine's URL. */
  engineUrl: string;
  /** A fresh directory for this round: the data dir, the image, the receipt log and the config go in it. */
  dir: string;
  /** Concurrent clients, each one request at a time. @default 4 */
  clients?: number;
  /** When the cut comes, in ms after the first receipt. */
  cutAfterMs: number;
}

export interface RoundResult {
  durability: Durability;
  cutAfterMs: number;
  /** Receipts the clients logged (each fsynced to the log before the next request). */
  logged: number;
  /** Logged receipts the restored store does not hold. */
  lost: string[];
  /** Records in the restored store. */
  stored: number;
  /** `PRAGMA integrity_check` of the restored store ("ok" when sound). */
  integrity: string;
  /** Whether the stored records' offsets are 1..n with no gap, and match sqlite_sequence. */
  contiguous: boolean;
  /** Logged receipts the reopened store could not read back whole (`get` failed or not `ok`). */
  unreadable: string[];
  cut: CutResult;
}

function writeConfig(dir: string, dataDir: string, durability: Durability): string {
  const raw = YAML.parse(readFileSync(CPU_EXAMPLE, 'utf8')) as Record<string, Record<string, unknown>>;
  raw.reef = { ...raw.reef, port: 0, data_dir: dataDir, durability, log_level: 'warn' };
  // The example's model path is relative to the example's folder; this config lives elsewhere.
  const cluster = raw.cluster as Record<string, Record<string, unknown>>;
  cluster.rollout = { ...cluster.rollout, model_path: tinyModelDir() };
  cluster.prm = { ...cluster.prm, model_path: tinyModelDir() };
  const r2r = (raw.pipeline as Record<string, Record<string, Record<string, unknown>>>).record2record!;
  r2r.config = { ...r2r.config, prm_tokenizer_path: tinyModelDir() };
  const path = join(dir, 'serve.yaml');
  writeFileSync(path, YAML.stringify(raw));
  return path;
}


/** Posts completions until stopped; each receipt is appended to the log and fsynced before the next request. */
async function client(url: string, log: number, stop: AbortSignal, onReceipt: (id: string) => void): Promise<void> {
  const body = JSON.stringify(CHAT);
  while (!stop.aborted) {
    let id: string | null;
    try {
      const res = await fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: stop });
      id = res.headers.get('x-reef-agent-record-id');
      await res.arrayBuffer();
      if (res.status !== 200) throw new Error(`chat completion answered ${res.status}`);
    } catch (err) {
      if (stop.aborted) return;
      throw err;
    }
    if (id === null) throw new Error('a 200 chat completion carried no x-reef-agent-record-id');
    writeSync(log, `${id}\n`);
    fsyncSync(log);
    onReceipt(id);
  }
}

/** Opens the restored store as a restarted gateway would and checks it against the receipt log. */
async function checkStore(path: string, logged: string[], durability: Durability): Promise<Omit<RoundResult, 'durability' | 'cutAfterMs' | 'cut'>> {
  // First with SQLite alone: the open recovers the WAL, and integrity_check reads every page.
  const raw = new Database(path);
  const integrity = (raw.pragma('integrity_check') as Array<{ integrity_check: string }>).map((r) => r.integrity_check).join('; ');
  raw.close();
  // Then as a restarted gateway opens it: a store that lost even its schema (process, cut before the
  // first checkpoint) is migrated afresh, as it would be.
  const store = SqliteStore.open(path, { durability });
  const unreadable: string[] = [];
  let seqs: number[], sequence: number, ids: Set<string>;
  try {
    const db = new Database(path, { readonly: true });
    seqs = db.prepare('SELECT seq FROM records ORDER BY seq').pluck().all() as number[];
    sequence = (db.prepare("SELECT seq FROM sqlite_sequence WHERE name = 'records'").pluck().get() as number | undefined) ?? 0;
    ids = new Set(db.prepare('SELECT id FROM records').pluck().all() as string[]);
    db.close();
    for (const id of logged) {
      if (!ids.has(id)) continue;
      try {
        const rec = await store.get(id);
        if (rec?.status !== 'ok' || rec.outputIds.length === 0) unreadable.push(id);
      } catch {
        unreadable.push(id);
      }
    }
  } finally {
    await store.close();
  }
  const contiguous = seqs.every((s, i) => s === i + 1) && sequence === seqs.length;
  const lost = logged.filter((id) => !ids.has(id));
  return { logged: logged.length, lost, stored: seqs.length, integrity, contiguous, unreadable };
}

export async function powerRound(o: RoundOptions): Promise<RoundResult> {
  const dataDir = join(o.dir, 'data');
  const shadow = join(o.dir, 'durable');
  mkdirSync(dataDir, { recursive: true });
  const configPath = writeConfig(o.dir, dataDir, o.durability);
  // detached: its own process group, which the cut kills whole.
  const gw = await spawnGateway({ configPath, engineUrl: o.engineUrl, env: powercutEnv(dataDir, shadow), detached: true });
  const logPath = join(o.dir, 'receipts.log');
  const log = openSync(logPath, 'a');
  const stop = new AbortController();
  let cut: CutResult;
  try {
    if (!watchedPids(shadow).includes(gw.child.pid!)) throw new Error(`the gateway (pid ${gw.child.pid}) did not load the powercut library (LD_PRELOAD)`);
    let first: () => void = () => {};
    const firstReceipt = new Promise<void>((resolve) => (first = resolve));
    const clients = Array.from({ length: o.clients ?? 4 }, () => client(gw.url, log, stop.signal, () => first()));
    // A client that fails before the cut (a 500, no receipt header) ends the round with its error.
    const failed = Promise.all(clients).then(() => {});
    await Promise.race([firstReceipt, failed]);
    await Promise.race([new Promise((resolve) => setTimeout(resolve, o.cutAfterMs)), failed]);
    cut = await cutPower([gw.child], dataDir, shadow);
    stop.abort();
    await failed.catch(() => {});
  } catch (err) {
    stop.abort();
    try {
      process.kill(-gw.child.pid!, 'SIGKILL');
    } catch {
      // gone
    }
    throw new Error(`${(err as Error).message}\ngateway stderr:\n${gw.stderr()}`);
  } finally {
    closeSync(log);
  }
  const logged = readFileSync(logPath, 'utf8').split('\n').filter(Boolean);
  const checked = await checkStore(join(dataDir, 'records.sqlite'), logged, o.durability);
  return { durability: o.durability, cutAfterMs: o.cutAfterMs, ...checked, cut };
}
