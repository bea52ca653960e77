import type { AgentRecord } from '../../actors/gateway/store/types.js';
import { engineSampling, type RequestSampling } from '../../actors/gateway/tokenize/prepare.js';

/**
 * record2task: a judged turn becomes a training task. The response is exactly the tokens the
 * engine generated for that turn (so the loss mask covers only that turn's assistant tokens),
 * with the logprobs and top-K the engine recorded; teacher candidates are the turn's prompt with
 * each hint appended to the last user message, or the plain prompt for an anchor-only turn.
 */

/** The line that separates the user's words from an appended hint in a teacher prompt. */
export const HINT_MARKER = '[Hint for a better reply]';

/** The last user message with the hint appended after a blank line and the marker line. */
export function withHint(content: string, hint: string): string {
  return `${content}\n\n${HINT_MARKER}\n${hint}`;
}

export interface JudgedTurnInput {
  /** The turn's record (the request whose reply was judged). */
  record: AgentRecord;
  /** The turn's reward: +1, -1 or 0 (a non-dropped turn). */
  reward: number;
  /** Accepted hints, shortest first; empty for an anchor-only turn. */
  hints: readonly string[];
}

export interface Task {
  taskId: string;
  scenario: string;
  promptIds: Int32Array;
  responseIds: Int32Array;
  logprobs: Float32Array;
  topK: number;
  topkIds: Int32Array;
  topkLogprobs: Float32Array;
  reward: number;
  teacherPromptIds: Int32Array[];
  sampling: { temperature: number; topP: number; topK: number };
  weightVersion: string | null;
}

/**
 * Renders a teacher prompt from the recorded request's messages (the hint in the last user one) and
 * its tools as recorded; it must render them as the gateway rendered the turn's prompt
 * (actors/gateway/tokenize/prepare.ts `renderChat`).
 */
export type TeacherRenderer = (messages: unknown[], tools: readonly unknown[] | null) => Promise<Int32Array>;

/** The position of the last user message, or -1. */
export function lastUserIndex(messages: readonly unknown[]): number {
  for (let i = messages.length - 1; i >= 0; i--) if ((messages[i] as { role?: unknown })?.role === 'user') return i;
  return -1;
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => (p && typeof p === 'object' && 'text' in p ? String((p as { text: unknown }).text) : '')).join('');
  return '';
}

/** Teacher prompt ids for every hint (or the plain prompt when there is none). */
export async function teacherPrompts(record: AgentRecord, hints: readonly string[], render: TeacherRenderer): Promise<Int32Array[]> {
  const messages = record.request.messages;
  const at = lastUserIndex(messages);
  if (hints.length === 0 || at < 0) return [record.promptIds];
  const out: Int32Array[] = [];
  for (const hint of hints) {
    const copy = messages.map((m, i) => (i === at ? { ...(m as object), content: withHint(textOf((m as { content: unknown }).content), hint) } : m));
    out.push(await render(copy, record.request.tools));
  }
  return out;
}

/** Builds the task of one judged turn. */
export async function recordToTask(turn: JudgedTurnInput, render: TeacherRenderer): Promise<Task> {
  const r = turn.record;
  // What the gateway sent the engine for this request, not the request's fields as such.
  const sampling = engineSampling(r.request.params as RequestSampling);
  return {
    taskId: r.id,
    scenario: r.scenario,
    promptIds: r.promptIds,
    responseIds: r.outputIds,
    logprobs: r.logprobs,
    topK: r.topK,
    topkIds: r.topkIds,
    topkLogprobs: r.topkLogprobs,
    reward: turn.reward,
    teacherPromptIds: await teacherPrompts(r, turn.hints, render),
    sampling: { temperature: sampling.temperature, topP: sampling.top_p, topK: sampling.top_k },
    weightVersion: r.weightVersion,
  };
}

/** `v<n>` → n; the base weights (null or any other name) are release 0. */
export function releaseIndex(weightVersion: string | null): number {
  const m = weightVersion ? /^v(\d+)$/.exec(weightVersion) : null;
  return m ? Number(m[1]) : 0;
}

/**
 * A turn is not trained when it was generated more than `maxStaleness` releases before the current
 * one, or by a release newer than the current one. Release numbers only grow (the trainer names
 * each checkpoint one past every version it has made), so a newer release is never an ancestor of
 * the current weights: it is one a rollback put aside, and its turns sampled from weights that are
 * no longer trained on (after a rollback from v5 to v2, v5's turns counted as fresh).
 */
export function isStale(weightVersion: string | null, currentVersion: string | null, maxStaleness: number): boolean {
  const behind = releaseIndex(currentVersion) - releaseIndex(weightVersion);
  return behind < 0 || behind > maxStaleness;
}
