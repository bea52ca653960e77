import { closeSync, existsSync, fsyncSync, openSync, renameSync, rmSync, writeSync } from 'node:fs';
import { resolve } from 'node:path';
import { logprobFromJson, logprobToJson } from '../../actors/gateway/store/json-numbers.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import type { AgentRecord } from '../../actors/gateway/store/types.js';
import { ReefError } from '../../actors/runtime/errors.js';
import { flagString, type ParsedArgs } from '../args.js';
import type { Io } from '../cli.js';
import { loadConfig } from '../config/index.js';

/**
 * `reef export records --scenario S [--out FILE] [-c FILE | --data-dir DIR]`: one JSON record per
 * line, oldest first, every field of the stored record. Token payloads (`promptIds`, `outputIds`,
 * `logprobs`, `topkIds`, `topkLogprobs`) are JSON arrays; a masked candidate's logprob
 * (-Infinity, which JSON cannot write) is `null`, the other values JSON cannot write are the
 * strings `"NaN"` (the gateway's logprob of a token the engine gave none for) and `"Infinity"`;
 * `recordFromJson` reads them all back.
 */
const PAYLOADS = ['promptIds', 'outputIds', 'logprobs', 'topkIds', 'topkLogprobs'] as const;
const PAGE = 500;
/**
 * Characters of lines held before they are written. A page of 500 records was one string: with
 * long outputs (a 9,000-token answer with top-4 is over 1 MB of JSON) that is past the longest
 * string V8 can make (~512 Mi characters), and the export died with "Invalid string length".
 */
export const WRITE_CHARS = 4 * 1024 * 1024;

/** Where the record store lives: `--data-dir`, the config's `reef.data_dir`, or `.reef`. */
export async function dataDirOf(args: ParsedArgs): Promise<string> {
  const dataDir = flagString(args, 'data-dir');
  if (dataDir) return resolve(dataDir);
  const config = flagString(args, 'config');
  if (config) return resolve((await loadConfig(config, args.overrides)).reef.data_dir);
  return resolve('.reef');
}

/** One exported line (without its newline). */
export function recordToJson(r: AgentRecord): string {
  const out: Record<string, unknown> = { ...r };
  for (const k of PAYLOADS) out[k] = Array.from(r[k], logprobToJson);
  return JSON.stringify(out);
}

/** The record of an exported line, payloads as typed arrays again. */
export function recordFromJson(line: string): AgentRecord {
  const raw = JSON.parse(line) as Record<string, unknown>;
  const nums = (k: string): number[] => (Array.isArray(raw[k]) ? (raw[k] as unknown[]).map(logprobFromJson) : []);
  return {
    ...(raw as unknown as AgentRecord),
    promptIds: Int32Array.from(nums('promptIds')),
    outputIds: Int32Array.from(nums('outputIds')),
    logprobs: Float32Array.from(nums('logprobs')),
    topkIds: Int32Array.from(nums('topkIds')),
    topkLogprobs: Float32Array.from(nums('topkLogprobs')),
  };
}

/**
 * write(2) may take fewer bytes than it is given without an error (a file size limit, a disk
 * filling up; the next write then fails): one writeSync per page cut the file short mid-record
 * and the export still reported every record.
 */
function writeAll(fd: number, text: string): void {
  const bytes = Buffer.from(text);
  for (let at = 0; at < bytes.length;) {
    const n = writeSync(fd, bytes, at, bytes.length - at);
    // As an fs error would be: this command reports its file's I/O failures as they come.
    if (n <= 0) throw new Error(`export file: a write of ${bytes.length - at} bytes took none`);
    at += n;
  }
}

export async function exportCommand(args: ParsedArgs, io: Io): Promise<number> {
  const [what] = args.positionals.slice(1);
  const scenario = flagString(args, 'scenario');
  if (what !== 'records' || scenario === null) {
    io.stderr('usage: reef export records --scenario S [--out FILE] [-c FILE | --data-dir DIR]');
    return 2;
  }
  const path = resolve(await dataDirOf(args), 'records.sqlite');
  // Opening would create an empty store; a wrong path should say so instead.
  if (!existsSync(path)) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `record store ${path}` });
  // Read-only: an export neither upgrades a running gateway's store under it nor needs write
  // access to the file (a backup copy).
  const store = SqliteStore.open(path, { readonly: true });
  const outPath = flagString(args, 'out');
  // Written beside the target and renamed over it at the end: a failed export (an unknown
  // scenario, a record that cannot be read) leaves an earlier file at that path as it was.
  const partPath = outPath === null ? null : `${outPath}.part-${process.pid}`;
  let fd: number | null = null;
  let count = 0;
  let done = false;
  try {
    if (partPath !== null) fd = openSync(partPath, 'w');
    if ((await store.getScenario(scenario)) === null) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `scenario ${scenario} in ${path}` });
    let lines: string[] = [];
    let chars = 0;
    const flush = () => {
      if (fd !== null && lines.length > 0) writeAll(fd, `${lines.join('\n')}\n`);
      lines = [];
      chars = 0;
    };
    let after: string | null = null;
    do {
      const page = await store.list({ scenario, after, limit: PAGE });
      for (const summary of page.items) {
        const record = await store.get(summary.id);
        if (record === null) continue;
        const line = recordToJson(record);
        count += 1;
        if (fd === null) {
          io.stdout(line);
          continue;
        }
        lines.push(line);
        chars += line.length + 1;
        if (chars >= WRITE_CHARS) flush();
      }
      after = page.next;
    } while (after !== null);
    flush();
    // On disk before the rename puts it in place of an earlier file, which a crash must not leave empty.
    if (fd !== null) fsyncSync(fd);
    done = true;
  } finally {
    if (fd !== null) closeSync(fd);
    if (partPath !== null && outPath !== null) {
      if (done) renameSync(partPath, outPath);
      else rmSync(partPath, { force: true });
    }
    await store.close();
  }
  if (outPath !== null) io.stderr(`exported ${count} records of scenario ${scenario} to ${outPath}`);
  return 0;
}
