import type Database from 'better-sqlite3';
import { ReefError } from '../../runtime/errors.js';
import { invalid, jsonText } from './rows.js';
import type { JudgedPoint, JudgedTurn, JudgedTurnView, NewJudgedTurn, Page } from './types.js';

/**
 * The judged-turn log: the judge's output and the trainer's input. A row and the record's judgment
 * are written in one transaction, and a turn is in the log at most once, so neither a repeated PRM
 * completion nor a judge restart can train a turn twice.
 */

interface JudgedRow {
  seq: number;
  turn_record_id: string;
  next_state_record_id: string;
  scenario: string;
  session_key: string;
  decision: JudgedTurn['decision'];
  reward: number;
  teacher_candidates: string;
  created_at: number;
}

interface ViewRow extends JudgedRow {
  score_votes: string | null;
  hint_votes: string | null;
  hints: string | null;
  next_state: string | null;
  response: string | null;
}

/**
 * What a listing reads of a judgment: its parts by JSON path, never the whole text, which holds
 * every raw PRM reply (prm_m thinking replies of up to prm_max_tokens each).
 */
const VIEW_COLUMNS = `t.*, j.judgment -> '$.score.votes' AS score_votes, j.judgment -> '$.hint.votes' AS hint_votes,
  j.judgment -> '$.hint.hints' AS hints, j.judgment -> '$.nextState' AS next_state, r.response AS response`;
const VIEW_FROM = 'judged_turns t LEFT JOIN judgments j ON j.record_id = t.turn_record_id LEFT JOIN records r ON r.id = t.turn_record_id';

/** Most points one series holds. */
export const MAX_SERIES = 5000;

const parsed = <T>(text: string | null, fallback: T): T => (text === null ? fallback : (JSON.parse(text) as T));
const votesOf = (v: unknown): (number | null)[] => (Array.isArray(v) ? v.map((x) => (typeof x === 'number' ? x : null)) : []);

/** The assistant text of a stored response (the message returned to the client): string content, or text parts joined. */
export function replyText(response: string | null): string | null {
  const msg = parsed<unknown>(response, null) as { content?: unknown } | null;
  const c = msg?.content;
  if (typeof c === 'string') return c;
  if (Array.isArray(c)) {
    const parts = c.filter((p): p is { text: string } => typeof p?.text === 'string').map((p) => p.text);
    return parts.length > 0 ? parts.join('') : null;
  }
  return null;
}

function viewOf(row: ViewRow): JudgedTurnView {
  const next = parsed<unknown>(row.next_state, null) as { role?: unknown; content?: unknown } | null;
  const hints = parsed<unknown>(row.hints, []);
  return {
    ...fromRow(row),
    votes: { score: votesOf(parsed(row.score_votes, [])), hint: votesOf(parsed(row.hint_votes, [])) },
    hints: Array.isArray(hints) ? hints.filter((h): h is string => typeof h === 'string') : [],
    nextState: next !== null && typeof next.content === 'string' ? { role: String(next.role), content: next.content } : null,
    reply: replyText(row.response),
  };
}

const DECISIONS = new Set(['hint', 'anchor', 'dropped']);
/** SQLite's limit on bound parameters is 32766; stay well under it per query. */
const IDS_PER_QUERY = 500;

function fromRow(row: JudgedRow): JudgedTurn {
  return {
    offset: row.seq,
    turnRecordId: row.turn_record_id,
    nextStateRecordId: row.next_state_record_id,
    scenario: row.scenario,
    sessionKey: row.session_key,
    decision: row.decision,
    reward: row.reward,
    teacherCandidates: JSON.parse(row.teacher_candidates) as (string | null)[],
    createdAt: row.created_at,
  };
}

function validate(t: NewJudgedTurn): void {
  for (const key of ['turnRecordId', 'nextStateRecordId', 'scenario', 'sessionKey'] as const) {
    if (typeof t[key] !== 'string' || t[key].length === 0) throw invalid(`judged turn ${key} must be a non-empty string`);
  }
  if (!DECISIONS.has(t.decision)) throw invalid(`judged turn decision must be hint, anchor or dropped, got ${JSON.stringify(t.decision)}`);
  if (typeof t.reward !== 'number' || !Number.isFinite(t.reward)) throw invalid('judged turn reward must be a finite number');
  if (!Array.isArray(t.teacherCandidates) || !t.teacherCandidates.every((c) => c === null || typeof c === 'string')) {
    throw invalid('judged turn teacherCandidates must be an array of strings or nulls');
  }
  jsonText(t.judgment, 'judged turn judgment');
}

export class JudgedTurnTable {
  private readonly sql;
  private readonly appendTx: (t: NewJudgedTurn) => { offset: number; created: boolean };

  private readonly inQueries = new Map<number, Database.Statement>();
  private readonly replyQueries = new Map<number, Database.Statement>();

  constructor(private readonly db: Database.Database) {
    this.sql = {
      bySeq: db.prepare<[number, number], JudgedRow>('SELECT * FROM judged_turns WHERE seq >= ? ORDER BY seq LIMIT ?'),
      viewAsc: db.prepare<[string, number, number], ViewRow>(`SELECT ${VIEW_COLUMNS} FROM ${VIEW_FROM} WHERE t.scenario = ? AND t.seq > ? ORDER BY t.seq ASC LIMIT ?`),
      viewDesc: db.prepare<[string, number, number], ViewRow>(`SELECT ${VIEW_COLUMNS} FROM ${VIEW_FROM} WHERE t.scenario = ? AND t.seq < ? ORDER BY t.seq DESC LIMIT ?`),
      // Without the records: a reply is read once per turn (judgedReplies), never on every poll,
      // since reaching a record's response column walks past its request, hundreds of KB for an
      // OpenClaw turn.
      series: db.prepare<[string, number], JudgedRow>('SELECT * FROM judged_turns WHERE scenario = ? ORDER BY seq DESC LIMIT ?'),
      byTurn: db.prepare<[string], { seq: number }>('SELECT seq FROM judged_turns WHERE turn_record_id = ?'),
      head: db.prepare<[], { head: number | null }>('SELECT MAX(seq) AS head FROM judged_turns'),
      recordExists: db.prepare<[string], { one: number }>('SELECT 1 AS one FROM records WHERE id = ?'),
      insert: db.prepare(
        `INSERT INTO judged_turns (turn_record_id, next_state_record_id, scenario, session_key, decision, reward, teacher_candidates, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
      putJudgment: db.prepare<[string, string, number]>(
        `INSERT INTO judgments (record_id, judgment, updated_at) VALUES (?, ?, ?)
         ON CONFLICT (record_id) DO UPDATE SET judgment = excluded.judgment, updated_at = excluded.updated_at`),
    };
    const sql = this.sql;
    const tx = db.transaction((t: NewJudgedTurn) => {
      const existing = sql.byTurn.get(t.turnRecordId);
      if (existing !== undefined) return { offset: existing.seq, created: false };
      if (sql.recordExists.get(t.turnRecordId) === undefined) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `record ${t.turnRecordId}` });
      const now = Date.now();
      sql.putJudgment.run(t.turnRecordId, JSON.stringify(t.judgment), now);
      const info = sql.insert.run(t.turnRecordId, t.nextStateRecordId, t.scenario, t.sessionKey, t.decision, t.reward, JSON.stringify(t.teacherCandidates), now);
      return { offset: Number(info.lastInsertRowid), created: true };
    });
    // IMMEDIATE: the existence check and the insert happen under one write lock, across processes.
    this.appendTx = (t) => tx.immediate(t);
  }

  append(turn: NewJudgedTurn): { offset: number; created: boolean } {
    validate(turn);
    return this.appendTx(turn);
  }

  read(offset: number, limit: number): JudgedTurn[] {
    return this.sql.bySeq.all(offset, limit).map(fromRow);
  }

  /** A page of a scenario's turns; `after` is the offset the previous page ended at. */
  list(scenario: string, after: number | null, limit: number, order: 'asc' | 'desc'): Page<JudgedTurnView> {
    const start = after ?? (order === 'asc' ? 0 : Number.MAX_SAFE_INTEGER);
    const rows = (order === 'asc' ? this.sql.viewAsc : this.sql.viewDesc).all(scenario, start, limit + 1);
    const items = rows.slice(0, limit).map(viewOf);
    return { items, next: rows.length > limit ? String(items[items.length - 1]!.offset) : null };
  }

  /** The newest `limit` turns of a scenario, oldest first. */
  series(scenario: string, limit: number): JudgedPoint[] {
    return this.sql.series.all(scenario, Math.min(limit, MAX_SERIES)).reverse()
      .map((r) => ({ offset: r.seq, createdAt: r.created_at, decision: r.decision, reward: r.reward }));
  }

  replies(offsets: readonly number[]): Map<number, string | null> {
    const out = new Map<number, string | null>();
    for (let i = 0; i < offsets.length; i += IDS_PER_QUERY) {
      const chunk = offsets.slice(i, i + IDS_PER_QUERY);
      let stmt = this.replyQueries.get(chunk.length);
      if (stmt === undefined) {
        stmt = this.db.prepare(`SELECT t.seq AS seq, r.response AS response FROM judged_turns t LEFT JOIN records r ON r.id = t.turn_record_id WHERE t.seq IN (${Array(chunk.length).fill('?').join(',')})`);
        this.replyQueries.set(chunk.length, stmt);
      }
      for (const row of stmt.all(...chunk) as { seq: number; response: string | null }[]) out.set(row.seq, replyText(row.response));
    }
    return out;
  }

  head(): number {
    return this.sql.head.get()?.head ?? 0;
  }

  judgedIds(ids: readonly string[]): Set<string> {
    const found = new Set<string>();
    for (let i = 0; i < ids.length; i += IDS_PER_QUERY) {
      const chunk = ids.slice(i, i + IDS_PER_QUERY);
      const rows = this.inQuery(chunk.length).all(...chunk) as { turn_record_id: string }[];
      for (const r of rows) found.add(r.turn_record_id);
    }
    return found;
  }

  private inQuery(n: number): Database.Statement {
    let stmt = this.inQueries.get(n);
    if (stmt === undefined) {
      stmt = this.db.prepare(`SELECT turn_record_id FROM judged_turns WHERE turn_record_id IN (${Array(n).fill('?').join(',')})`);
      this.inQueries.set(n, stmt);
    }
    return stmt;
  }
}
