import { createReadStream, existsSync, statSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { Correlator } from '../../actors/judge/correlate/correlator.js';
import type { CorrelationCounters, CorrelationEvent, CorrelationRecord } from '../../actors/judge/correlate/types.js';
import { decimalNumber } from '../../actors/runtime/decimal.js';
import { ReefError } from '../../actors/runtime/errors.js';
import { flagBool, flagString, type ParsedArgs } from '../args.js';
import type { Io } from '../cli.js';

/**
 * `reef correlate FILE.jsonl [--json] [--session-ttl-s=N] [--max-open-sessions=N]`: runs
 * correlation offline over `reef export records` output, in file order, and shows every session
 * with its requests, bound turns, drops, retries and side requests, then the counters and
 * warnings — so a user sees why their harness's turns don't bind before spending GPU time.
 * Sessions still open at the end of the file are shown `open` (their last turn pending).
 */
export interface SessionReport {
  key: string;
  scenario: string;
  status: 'open' | 'expired' | 'evicted' | 'done';
  requests: string[];
  turns: { turn: string; nextState: string; role: 'user' | 'tool'; content: string }[];
  dropped: { turn: string; reason: string }[];
  retries: string[];
  side: string[];
}

export interface CorrelateReport {
  records: number;
  skipped: { recordId: string; reason: string }[];
  /** Side requests that belong to no session (tagged side without a session tag). */
  sideWithoutSession: string[];
  sessions: SessionReport[];
  counters: CorrelationCounters;
  warnings: { code: string; message: string }[];
}

export async function correlateFile(path: string, options: { sessionTtlS?: number; maxOpenSessions?: number } = {}): Promise<CorrelateReport> {
  if (!existsSync(path)) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `file ${path}` });
  // Read as a stream, a directory failed with a bare EISDIR and no error code.
  if (!statSync(path).isFile()) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${path} is not a file (reef correlate reads the JSON lines of reef export records)` });
  const correlator = new Correlator(options);
  const report: CorrelateReport = { records: 0, skipped: [], sideWithoutSession: [], sessions: [], counters: correlator.counters(), warnings: [] };
  const live = new Map<string, SessionReport>();
  const lines = createInterface({ input: createReadStream(path, 'utf8'), crlfDelay: Infinity });
  let lineNo = 0;
  for await (const line of lines) {
    lineNo++;
    if (line.trim() === '') continue;
    let record: CorrelationRecord;
    try {
      record = JSON.parse(line) as CorrelationRecord;
    } catch (err) {
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${path}:${lineNo}: not a JSON record (${(err as Error).message})` });
    }
    if (typeof record?.id !== 'string' || typeof record.scenario !== 'string') {
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${path}:${lineNo}: not an exported record (no id or scenario)` });
    }
    report.records++;
    for (const e of correlator.observe({ ...record, tags: record.tags ?? {} })) apply(report, live, e);
  }
  report.counters = correlator.counters();
  return report;
}

function apply(report: CorrelateReport, live: Map<string, SessionReport>, e: CorrelationEvent): void {
  if (e.kind === 'warning') {
    report.warnings.push({ code: e.code, message: e.message });
    return;
  }
  if (e.kind === 'skipped') {
    report.skipped.push({ recordId: e.recordId, reason: e.reason });
    return;
  }
  if (e.kind === 'side' && e.sessionKey === null) {
    report.sideWithoutSession.push(e.recordId);
    return;
  }
  const id = `${e.scenario}\u0000${e.sessionKey}`;
  let s = live.get(id);
  if (s === undefined || e.kind === 'opened') {
    s = { key: e.sessionKey!, scenario: e.scenario, status: 'open', requests: [], turns: [], dropped: [], retries: [], side: [] };
    live.set(id, s);
    report.sessions.push(s);
  }
  switch (e.kind) {
    case 'opened':
    case 'continued':
      s.requests.push(e.recordId);
      break;
    case 'retry':
      s.retries.push(e.recordId);
      break;
    case 'side':
      s.side.push(e.recordId);
      break;
    case 'turn-finished':
      s.turns.push({ turn: e.turnRecordId, nextState: e.nextStateRecordId, role: e.nextState.role, content: e.nextState.content });
      break;
    case 'turn-dropped':
      s.dropped.push({ turn: e.turnRecordId, reason: e.reason });
      break;
    case 'session-closed':
      s.status = e.reason;
      live.delete(id);
      break;
  }
}

function clip(text: string, n = 72): string {
  const one = text.replace(/\s+/g, ' ').trim();
  return JSON.stringify(one.length > n ? `${one.slice(0, n - 1)}…` : one);
}

export function renderCorrelation(r: CorrelateReport): string {
  const out: string[] = [];
  const c = r.counters;
  out.push(`${r.records} records, ${r.sessions.length} sessions, ${c.bound} bound turns`);
  for (const s of r.sessions) {
    out.push('');
    out.push(`session ${s.key} (scenario ${s.scenario}, ${s.status}): ${s.requests.length} requests, ${s.turns.length} bound turns`);
    for (const t of s.turns) out.push(`  turn ${t.turn} → ${t.nextState}  ${t.role}: ${clip(t.content)}`);
    for (const d of s.dropped) out.push(`  dropped ${d.turn} (${d.reason})`);
    if (s.retries.length > 0) out.push(`  retries: ${s.retries.join(', ')}`);
    if (s.side.length > 0) out.push(`  side: ${s.side.join(', ')}`);
  }
  if (r.sideWithoutSession.length > 0) out.push('', `side requests without a session: ${r.sideWithoutSession.join(', ')}`);
  if (r.skipped.length > 0) out.push('', `skipped: ${r.skipped.map((s) => `${s.recordId} (${s.reason})`).join(', ')}`);
  out.push('', `counters: ${Object.entries(c).map(([k, v]) => `${k}=${v}`).join(' ')}`);
  for (const w of r.warnings) out.push(`warning ${w.code}: ${w.message}`);
  return out.join('\n');
}

/**
 * A flag's value, checked as the config checks the key it stands for (`session_ttl_s`,
 * `max_open_sessions`): the correlator refuses a fractional session count with a RangeError, which
 * the CLI printed as a crash. Only decimal text counts: Number() also reads '0x10' and 'Infinity'.
 */
function numberFlag(args: ParsedArgs, name: string, integer: boolean): number | undefined {
  const v = flagString(args, name);
  if (v === null) return undefined;
  const n = decimalNumber(v);
  const ok = integer ? Number.isSafeInteger(n) && n >= 1 : Number.isFinite(n) && n > 0;
  if (!ok) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--${name} must be ${integer ? 'an integer >= 1' : 'a positive number'}, got ${v}` });
  return n;
}

export async function correlateCommand(args: ParsedArgs, io: Io): Promise<number> {
  const [, file, ...extra] = args.positionals;
  if (file === undefined || extra.length > 0) {
    io.stderr('usage: reef correlate FILE.jsonl [--json] [--session-ttl-s=N] [--max-open-sessions=N]   (FILE from reef export records)');
    return 2;
  }
  let options: { sessionTtlS?: number; maxOpenSessions?: number };
  try {
    options = { sessionTtlS: numberFlag(args, 'session-ttl-s', false), maxOpenSessions: numberFlag(args, 'max-open-sessions', true) };
  } catch (err) {
    // A bad flag value is a usage error, as an unknown flag is: exit 2, not 1.
    const e = err as ReefError;
    io.stderr(`reef: ${e.code}: ${e.message}`);
    return 2;
  }
  const report = await correlateFile(file, options);
  io.stdout(flagBool(args, 'json') ? JSON.stringify(report, null, 2) : renderCorrelation(report));
  return 0;
}
