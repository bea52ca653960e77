import type Database from 'better-sqlite3';
import { ReefError } from '../../runtime/errors.js';
import { newId } from './ids.js';
import { checkScenarioName, invalid, jsonText, keyId } from './rows.js';
import type { NewReport, Page, Report } from './types.js';

/**
 * Reports: a client's score and feedback on records it received receipts for. A retry with the
 * same client id must not count twice (same content → the stored report), and a different report
 * under a reused id is a client bug worth a 409 rather than a silent overwrite.
 */

interface ReportRow {
  seq: number;
  id: string;
  scenario: string;
  client_id: string | null;
  score: number;
  feedback: string;
  refs: string;
  metadata: string;
  created_at: number;
  key_id: string | null;
}

const isPlainObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** JSON with object keys sorted, so that equal content compares equal however it was built. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (isPlainObject(value)) {
    const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
  }
  return JSON.stringify(value ?? null);
}

function fromRow(row: ReportRow): Report {
  return {
    id: row.id,
    scenario: row.scenario,
    score: row.score,
    feedback: JSON.parse(row.feedback) as Report['feedback'],
    references: JSON.parse(row.refs) as string[],
    metadata: JSON.parse(row.metadata) as Report['metadata'],
    createdAt: row.created_at,
    clientId: row.client_id,
    keyId: row.key_id,
  };
}

const contentOf = (r: Pick<Report, 'score' | 'feedback' | 'references' | 'metadata'>): string =>
  canonicalJson({ score: r.score, feedback: r.feedback, references: r.references, metadata: r.metadata });

function validate(input: NewReport): void {
  checkScenarioName(input.scenario);
  if (typeof input.score !== 'number' || !Number.isFinite(input.score)) throw invalid('report.score must be a finite number');
  if (input.feedback !== null && typeof input.feedback !== 'string' && !isPlainObject(input.feedback)) {
    throw invalid('report.feedback must be a string, an object or null');
  }
  if (input.metadata !== null && !isPlainObject(input.metadata)) throw invalid('report.metadata must be an object or null');
  jsonText(input.feedback, 'report.feedback');
  jsonText(input.metadata, 'report.metadata');
  if (!Array.isArray(input.references) || input.references.some((r) => typeof r !== 'string')) {
    throw invalid('report.references must be an array of record ids');
  }
  if (input.clientId !== null && (typeof input.clientId !== 'string' || input.clientId.length === 0 || input.clientId.length > 256)) {
    throw invalid('report id must be a string of 1 to 256 characters or null');
  }
  keyId(input.keyId, 'report.keyId');
}

export class ReportTable {
  private readonly recordScenario: Database.Statement<[string], { scenario: string }>;
  private readonly byClient: Database.Statement<[string, string], ReportRow>;
  private readonly byId: Database.Statement<[string], ReportRow>;
  private readonly insert: Database.Statement<unknown[]>;
  private readonly ensureScenario: Database.Statement<[string, number]>;
  private readonly page: { asc: Database.Statement<[string, number, number], ReportRow>; desc: Database.Statement<[string, number, number], ReportRow> };
  private readonly putTx: (input: NewReport) => { report: Report; created: boolean };

  constructor(private readonly db: Database.Database) {
    this.recordScenario = db.prepare('SELECT scenario FROM records WHERE id = ?');
    this.byClient = db.prepare('SELECT * FROM reports WHERE scenario = ? AND client_id = ?');
    this.byId = db.prepare('SELECT * FROM reports WHERE id = ?');
    this.insert = db.prepare(
      'INSERT INTO reports (id, scenario, client_id, score, feedback, refs, metadata, created_at, key_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING *',
    );
    this.ensureScenario = db.prepare('INSERT OR IGNORE INTO scenarios (name, created_at, description) VALUES (?, ?, NULL)');
    this.page = {
      asc: db.prepare('SELECT * FROM reports WHERE scenario = ? AND seq > ? ORDER BY seq ASC LIMIT ?'),
      desc: db.prepare('SELECT * FROM reports WHERE scenario = ? AND seq < ? ORDER BY seq DESC LIMIT ?'),
    };
    const tx = db.transaction((input: NewReport) => this.putInTx(input));
    // IMMEDIATE: the check-then-insert must not race another process doing the same.
    this.putTx = (input) => tx.immediate(input);
  }

  put(input: NewReport): { report: Report; created: boolean } {
    validate(input);
    return this.putTx(input);
  }

  private putInTx(input: NewReport): { report: Report; created: boolean } {
    for (const ref of input.references) {
      const row = this.recordScenario.get(ref);
      // One answer for both: naming the other scenario, or telling a missing id from a foreign one,
      // would show a key limited to this scenario what it may not see.
      if (row === undefined || row.scenario !== input.scenario) {
        throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `report reference ${JSON.stringify(ref)} is not a record of scenario ${input.scenario}` }, { param: 'references' });
      }
    }
    if (input.clientId !== null) {
      const existing = this.byClient.get(input.scenario, input.clientId);
      if (existing !== undefined) {
        const stored = fromRow(existing);
        if (contentOf(stored) === contentOf(input)) return { report: stored, created: false };
        throw new ReefError('REEF_ERR_CONFLICT', {
          what: `report ${input.clientId}`,
          details: `scenario ${input.scenario} already holds a report with this id and different content`,
        });
      }
    }
    const now = Date.now();
    this.ensureScenario.run(input.scenario, now);
    const row = this.insert.get(
      newId(),
      input.scenario,
      input.clientId,
      input.score,
      JSON.stringify(input.feedback),
      JSON.stringify(input.references),
      JSON.stringify(input.metadata),
      now,
      input.keyId,
    ) as ReportRow;
    return { report: fromRow(row), created: true };
  }

  get(id: string): Report | null {
    const row = this.byId.get(id);
    return row === undefined ? null : fromRow(row);
  }

  list(scenario: string, after: number | null, limit: number, order: 'asc' | 'desc'): Page<Report> {
    const start = after ?? (order === 'asc' ? 0 : Number.MAX_SAFE_INTEGER);
    const rows = this.page[order].all(scenario, start, limit + 1);
    const more = rows.length > limit;
    const items = rows.slice(0, limit);
    return { items: items.map(fromRow), next: more ? String(items[items.length - 1]!.seq) : null };
  }
}
