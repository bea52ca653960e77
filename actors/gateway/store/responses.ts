import type Database from 'better-sqlite3';
import { jsonText } from './rows.js';

/**
 * Responses that `/v1/responses` stored (`store`, true unless the client says false): what a
 * later request names as its `previous_response_id`, and what GET and DELETE reach. A row belongs
 * to the API key that made it; asked for by another key it does not exist, so that one key cannot
 * read, continue or delete another's conversation, nor learn that its id is taken.
 */

export interface StoredResponse {
  /** The id of the record that answered it (the API's id is `resp_<id>`). */
  id: string;
  keyId: string;
  scenario: string;
  previousId: string | null;
  /** The session tag its record carries (null: none), inherited by the responses that continue it. */
  session: string | null;
  createdAt: number;
  /** Chat messages, instructions left out, the reply last: what a continuation extends. */
  conversation: unknown[];
  /** The request's own input items, as the API lists them (`input_items`). */
  inputItems: unknown[];
  /** The Response object as it was answered. */
  response: unknown;
}

export interface ResponseStore {
  putResponse(row: StoredResponse): Promise<void>;
  /** The row, or null when there is none that `keyId` made. */
  getResponse(id: string, keyId: string): Promise<StoredResponse | null>;
  /** Whether a row that `keyId` made was deleted. */
  deleteResponse(id: string, keyId: string): Promise<boolean>;
}

interface Row {
  id: string;
  key_id: string;
  scenario: string;
  previous_id: string | null;
  session: string | null;
  created_at: number;
  conversation: string;
  input_items: string;
  response: string;
}

export class ResponseTable {
  private readonly insert: Database.Statement<[string, string, string, string | null, string | null, number, string, string, string]>;
  private readonly byId: Database.Statement<[string, string], Row>;
  private readonly del: Database.Statement<[string, string]>;

  constructor(db: Database.Database) {
    this.insert = db.prepare(
      'INSERT INTO responses (id, key_id, scenario, previous_id, session, created_at, conversation, input_items, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)');
    this.byId = db.prepare('SELECT * FROM responses WHERE id = ? AND key_id = ?');
    this.del = db.prepare('DELETE FROM responses WHERE id = ? AND key_id = ?');
  }

  /** One statement: SQLite runs it as its own transaction. */
  put(r: StoredResponse): void {
    this.insert.run(r.id, r.keyId, r.scenario, r.previousId, r.session, r.createdAt, jsonText(r.conversation, 'response conversation'), jsonText(r.inputItems, 'response input items'), jsonText(r.response, 'response'));
  }

  get(id: string, keyId: string): StoredResponse | null {
    const row = this.byId.get(id, keyId);
    if (row === undefined) return null;
    return {
      id: row.id,
      keyId: row.key_id,
      scenario: row.scenario,
      previousId: row.previous_id,
      session: row.session,
      createdAt: row.created_at,
      conversation: JSON.parse(row.conversation) as unknown[],
      inputItems: JSON.parse(row.input_items) as unknown[],
      response: JSON.parse(row.response) as unknown,
    };
  }

  delete(id: string, keyId: string): boolean {
    return this.del.run(id, keyId).changes > 0;
  }
}
