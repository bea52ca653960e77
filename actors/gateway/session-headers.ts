import type { IncomingHttpHeaders } from 'node:http';

const TAG_PREFIX = 'x-reef-tag-';

/**
 * The headers OpenClaw-RL's bundled OpenClaw sends on every request, read as aliases of Reef's
 * own tags: `x-session-id` is `x-reef-tag-session`, `x-turn-type: main|side` is
 * `x-reef-tag-turn-type`, `x-session-done` is `x-reef-tag-session-done`. So such an agent needs no
 * header shim. One difference is kept on purpose: the reference trains only turns marked `main`
 * (a request without the header is a side turn there); Reef trains every turn not marked `side`,
 * since an agent that sends no header at all is the common case (docs/internals.md).
 */
const ALIASES: readonly (readonly [alias: string, tag: string])[] = [
  ['x-session-id', 'session'],
  ['x-turn-type', 'turn-type'],
  ['x-session-done', 'session-done'],
];

// The spellings the reference accepts for X-Session-Done; anything else is refused rather than
// read as false, so a typo cannot leave a session open until its TTL.
const TRUE = new Set(['1', 'true', 'yes', 'on']);
const FALSE = new Set(['0', 'false', 'no', 'off']);

export type SessionHeaders = { tags: Record<string, string> } | { error: string; param: string };

function one(v: string | string[]): string {
  return Array.isArray(v) ? v.join(',') : v;
}

/**
 * The record's tags from a request's headers: every `x-reef-tag-<name>` (stored opaquely), plus
 * the aliases above. Refused (the error names the headers): an alias and its tag that disagree,
 * an `x-turn-type` that is neither `main` nor `side`, a session-done flag that is not a boolean,
 * and a session-done without the session it ends (unless `sessionMayFollow`: the route derives
 * the session itself, and checks that flag once it has).
 */
export function sessionHeaders(headers: IncomingHttpHeaders, sessionMayFollow = false): SessionHeaders {
  const tags: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) {
    if (!k.startsWith(TAG_PREFIX) || v === undefined) continue;
    tags[k.slice(TAG_PREFIX.length)] = one(v);
  }
  const done = tags['session-done'];
  if (done !== undefined) {
    const b = boolOf(done);
    if (b === null) return { error: `${TAG_PREFIX}session-done ${JSON.stringify(done)} is not a boolean (true or false)`, param: `${TAG_PREFIX}session-done` };
    tags['session-done'] = String(b);
  }
  for (const [alias, tag] of ALIASES) {
    const raw = headers[alias];
    if (raw === undefined) continue;
    let value = one(raw).trim();
    if (tag === 'turn-type') {
      value = value.toLowerCase();
      if (value !== 'main' && value !== 'side') return { error: `${alias} ${JSON.stringify(one(raw))} is neither main nor side`, param: alias };
    } else if (tag === 'session-done') {
      const b = boolOf(value);
      if (b === null) return { error: `${alias} ${JSON.stringify(one(raw))} is not a boolean (true, false, 1, 0, yes, no, on or off)`, param: alias };
      value = String(b);
    } else if (value === '') {
      return { error: `${alias} is empty: send the conversation's id, or leave the header out`, param: alias };
    }
    const own = tags[tag];
    const same = own === undefined || (tag === 'turn-type' ? own.trim().toLowerCase() === value : own === value);
    if (!same) {
      return { error: `${alias} ${JSON.stringify(value)} and ${TAG_PREFIX}${tag} ${JSON.stringify(own)} disagree: send one of them, or the same value in both`, param: alias };
    }
    if (own === undefined) tags[tag] = value;
  }
  // OpenClaw's provider library (@openclaw/ai) sends OpenClaw's session id as `session_id`, the
  // header OpenAI reads for cache affinity (on every Responses request, and on chat completions
  // where session affinity is configured). It names the same conversation, so it tags the session
  // too, but only when no header above does: it is a cache hint, not the agent's claim, so it never
  // overrides or contradicts one, and an empty one is left out rather than refused.
  const affinity = headers['session_id'];
  if (tags['session'] === undefined && affinity !== undefined) {
    const value = one(affinity).trim();
    if (value !== '') tags['session'] = value;
  }
  if (tags['session-done'] === 'true' && !tags['session'] && !sessionMayFollow) {
    return { error: SESSION_DONE_WITHOUT_SESSION, param: 'x-session-done' };
  }
  if (tags['session-done'] === 'false') delete tags['session-done'];
  return { tags };
}

export const SESSION_DONE_WITHOUT_SESSION = 'x-session-done needs the session it ends: send x-session-id (or x-reef-tag-session) with it';

function boolOf(v: string): boolean | null {
  const s = v.trim().toLowerCase();
  return TRUE.has(s) ? true : FALSE.has(s) ? false : null;
}
