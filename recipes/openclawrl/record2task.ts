import type { AgentRecord } from '../../actors/gateway/store/types.js';
import { engineSampling, templateKwargs, type RequestSampling } from '../../actors/gateway/tokenize/prepare.js';

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
 * its tools and chat template variables as recorded; it must render them as the gateway rendered the turn's prompt
 * (actors/gateway/tokenize/prepare.ts `renderChat`).
 */
export type TeacherRenderer = (messages: unknown[], tools: readonly unknown[] | null, templateKwargs: Record<string, unknown> | null) => Promise<Int32Array>;

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

/**
 * Teacher prompt ids for every hint (or the plain prompt when there is none). A request without a
 * user message takes the hint in its last message, as the paper's reference code does: falling
 * back to the plain prompt there dropped every accepted hint and trained the turn toward the
 * unhinted base model, even at reward 0, which the judge's decision table drops.
 */
export async function teacherPrompts(record: AgentRecord, hints: readonly string[], render: TeacherRenderer): Promise<Int32Array[]> {
  const messages = record.request.messages;
  if (hints.length === 0 || messages.length === 0) return [record.promptIds];
  const user = lastUserIndex(messages);
  const at = user >= 0 ? user : messages.length - 1;
  const out: Int32Array[] = [];
  for (const hint of hints) {
    const copy = messages.map((m, i) => (i === at ? { ...(m as object), content: withHint(textOf((m as { content: unknown }).content), hint) } : m));
    out.push(await render(copy, record.request.tools, templateKwargs(record.request.params)));
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

/** What staleness needs of a release: the version it serves, the one it replaced, and whether it is a rollback. */
export interface ReleaseLink {
  weightVersion: string;
  parent: string | null;
  rollbackOf: string | null;
}

/** `vN` names a trained release; anything else (null, `base`, an engine's `default`) the base weights. */
function versionKey(weightVersion: string | null): string | null {
  return weightVersion !== null && /^v\d+$/.test(weightVersion) ? weightVersion : null;
}

/**
 * The versions the current weights descend from, each with how many training steps back it lies:
 * the current version 0, the one it was trained from 1, and so on to the base weights (key null).
 * A rollback release serves an earlier version again, so the chain goes on from the release that
 * first trained that version, not from what the rollback replaced: after v1, v2, v3, a rollback to
 * v1 and a release v4 trained from it, the lineage is v4, v1, base, and v2 and v3 are not in it.
 */
export function releaseLineage(releases: readonly ReleaseLink[]): Map<string | null, number> {
  const trainedFrom = new Map<string, string | null>();
  for (const r of releases) {
    const v = versionKey(r.weightVersion);
    if (r.rollbackOf === null && v !== null && !trainedFrom.has(v)) trainedFrom.set(v, versionKey(r.parent));
  }
  const lineage = new Map<string | null, number>();
  let v = versionKey(releases.at(-1)?.weightVersion ?? null);
  // A version seen twice would be a corrupt history; stopping there keeps this finite.
  for (let d = 0; !lineage.has(v); d++) {
    lineage.set(v, d);
    if (v === null || !trainedFrom.has(v)) break;
    v = trainedFrom.get(v)!;
  }
  return lineage;
}

/**
 * A turn is not trained when it was sampled from weights more than `maxStaleness` training steps
 * behind the current ones, or from weights the current ones do not descend from at all: a release
 * a rollback put aside (after a rollback from v5 to v2, v5's turns, and after the next release v6,
 * v3's to v5's too). A version that is not in the lineage is stale.
 */
export function isStale(weightVersion: string | null, lineage: ReadonlyMap<string | null, number>, maxStaleness: number): boolean {
  const behind = lineage.get(versionKey(weightVersion));
  return behind === undefined || behind > maxStaleness;
}
