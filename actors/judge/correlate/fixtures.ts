import type { CorrelationEvent, CorrelationRecord } from './types.js';

/** Builders of correlation inputs for tests, the CLI test and the benchmark. */

export type Msg = Record<string, unknown>;

export const sys = (content: string): Msg => ({ role: 'system', content });
export const user = (content: string): Msg => ({ role: 'user', content });
export const asst = (content: string, extra: Msg = {}): Msg => ({ role: 'assistant', content, ...extra });
export const tool = (content: string, id: string): Msg => ({ role: 'tool', content, tool_call_id: id });

export interface RecOptions {
  scenario?: string;
  /** @default 'open' */
  keyId?: string | null;
  session?: string;
  side?: boolean;
  /** Tagged `session-done: true`: the client's last request of the session. */
  done?: boolean;
  /** finishedAt in ms. @default 0 */
  at?: number;
  status?: CorrelationRecord['status'];
}

let offset = 0;

/** A record with `messages` as its request and `reply` (an assistant message) as its response. */
export function rec(id: string, messages: Msg[], reply: Msg | string, o: RecOptions = {}): CorrelationRecord {
  const tags: Record<string, string> = {};
  if (o.session !== undefined) tags.session = o.session;
  if (o.side) tags['turn-type'] = 'side';
  if (o.done) tags['session-done'] = 'true';
  return {
    id,
    offset: ++offset,
    scenario: o.scenario ?? 'default',
    keyId: o.keyId === undefined ? 'open' : o.keyId,
    tags,
    status: o.status ?? 'ok',
    finishedAt: o.at ?? 0,
    request: { messages },
    response: typeof reply === 'string' ? asst(reply) : reply,
  };
}

/** The turn-finished events as `turn→nextState record: content`, for compact assertions. */
export function turns(events: readonly CorrelationEvent[]): string[] {
  return events.flatMap((e) => (e.kind === 'turn-finished' ? [`${e.turnRecordId}→${e.nextStateRecordId}: ${e.nextState.content}`] : []));
}

export function kinds(events: readonly CorrelationEvent[]): string[] {
  return events.map((e) => e.kind);
}
