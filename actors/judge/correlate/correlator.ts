import type { LogFn } from '../../runtime/log.js';
import { canonicalJson, contentText, HashMemo, messageHash, mix, roleOf, sessionSeed } from './hash.js';
import { type Session, sessionMapKey, SessionTable } from './sessions.js';
import {
  type CorrelationCounters,
  type CorrelationEvent,
  type CorrelationRecord,
  type CorrelatorConfig,
  type CorrelatorOptions,
  DEFAULT_CORRELATOR_CONFIG,
  type NextState,
  type WarningCode,
} from './types.js';
import { type CorrelatorHead, type CorrelatorState, restoreSession, type SavedSession, saveSession, STATE_VERSION } from './state.js';

/**
 * Rebuilds sessions from recorded requests, fed in offset order. Rules (issue 4 §1):
 *
 * Tag mode (`tags.session` set): requests of one tag and scenario form one session in arrival
 * order, without text matching. Each main request finishes the previous one's turn: the next
 * state is its newest user/tool message. At most five message hashes are compared (see tagMode).
 * A request's root is its first message:
 * - an exact repeat of the last request (same length, root and newest message) is a retry: the
 *   repeat becomes the pending turn (its reply is the one the client saw), the replaced one is
 *   kept as an alternative in case the next request extends its reply instead;
 * - inferred side request: a request whose root differs from that of the session's last main
 *   request cannot extend it, nor be extended by it (transcripts that differ at their first
 *   message are not prefixes of one another). It is held as a candidate: if the session's next
 *   request extends it after all (same conversation root, the first message that is not a system
 *   or developer message, and the candidate's reply at its position), the session moved to a new
 *   root (the previous pending turn is dropped as a rewrite) and the candidate is its main line;
 *   otherwise it is counted `side` and never trained. `inferSide: false` turns this off.
 * - a system prompt that changes along the main line (a timestamp, injected memory) shows as such
 *   a promotion with the conversation root unchanged. From then on the session's root is its
 *   conversation root: otherwise every request would be a candidate and no turn would bind. Only
 *   the first change costs a turn. The system prompt is not ignored from the start because side
 *   requests (summaries, memory extraction) often resend the transcript under a prompt of their
 *   own, and would then bind as turns; in such a session they still can.
 * - a request that neither extends nor repeats, with the same root, is a history rewrite
 *   (compaction, sliding window): tag mode keeps the chain. One whose newest message is the last
 *   request's newest, and whose last assistant message is not that request's reply, asked the same
 *   again over an edited history: a retry (the replaced turn is not kept as an alternative).
 *
 * Fallback (no tag): a request binds to the session whose last request its messages extend —
 * the same earlier messages, then that request's assistant reply, then at least one more
 * message. Candidates come from a hash lookup of the request's prefix at each of its assistant
 * messages (longest first); ties go to the most recently active session. An exact repeat of a
 * session's last request is a retry (counted) and opens a sibling session, so the conversation
 * binds whichever reply the client went on from; once one of the group is extended the others
 * expire silently (they were retries, already counted), and if none is, the newest expires as one
 * dropped turn — and two conversations that began identically both bind. A
 * request that extends nothing opens a session; a rewritten history therefore opens a new one and
 * leaves the pre-rewrite turn unmatched until it expires. Untagged requests never bind to tagged
 * sessions, and fallback has no inferred side requests: with no session to compare against, an
 * unmatched request is indistinguishable from a new conversation.
 *
 * `turn-type: side` (tagged or not) is counted `side`, keeps its session alive, and is otherwise
 * ignored. Records that are not `ok` are skipped (an aborted or failed reply is never a turn; the
 * client's retry carries the same messages).
 *
 * The next state of a turn is the user and tool messages after the turn's reply, up to the next
 * assistant message (if the client resends turns we never saw, the messages that answered our
 * reply are the ones that judge it): all the results of parallel tool calls, both user messages
 * when the request between them failed. System/developer messages in between are skipped. With
 * none, the turn is dropped (`no-next-state`).
 *
 * Cost per request: one hash per message (long text memoised by value, see hash.ts), one Map
 * lookup per assistant message; nothing scans the sessions.
 */
export class Correlator {
  readonly config: Readonly<CorrelatorConfig>;
  private readonly table = new SessionTable();
  private readonly memo: HashMemo;
  private readonly nowOf: (r: CorrelationRecord) => number;
  private readonly log: LogFn | null;
  private readonly counts: CorrelationCounters = { tagged: 0, untagged: 0, bound: 0, dropped_unbound: 0, evicted: 0, retries: 0, side: 0, ended: 0 };
  private clock = 0;
  private seq = 0;
  private warnedUntagged = false;
  private warnedEvictions = false;
  private lastUnboundWarnAt: number | null = null;
  private hs = new Float64Array(64);
  private ps = new Float64Array(64);

  constructor(options: CorrelatorOptions = {}) {
    this.config = Object.freeze({
      sessionTtlS: options.sessionTtlS ?? DEFAULT_CORRELATOR_CONFIG.sessionTtlS,
      maxOpenSessions: options.maxOpenSessions ?? DEFAULT_CORRELATOR_CONFIG.maxOpenSessions,
      inferSide: options.inferSide ?? DEFAULT_CORRELATOR_CONFIG.inferSide,
    });
    if (!(this.config.sessionTtlS > 0)) throw new RangeError(`sessionTtlS must be > 0, got ${this.config.sessionTtlS}`);
    if (!Number.isInteger(this.config.maxOpenSessions) || this.config.maxOpenSessions < 1) {
      throw new RangeError(`maxOpenSessions must be an integer ≥ 1, got ${this.config.maxOpenSessions}`);
    }
    this.memo = new HashMemo(options.hashMemoChars);
    this.nowOf = options.now ?? ((r) => r.finishedAt);
    this.log = options.log ?? null;
  }

  /** Feeds one record (in offset order); returns what it caused. */
  observe(record: CorrelationRecord): CorrelationEvent[] {
    const out: CorrelationEvent[] = [];
    this.advance(this.nowOf(record), out);
    const messages = record.request?.messages;
    if (record.status !== 'ok') out.push({ kind: 'skipped', recordId: record.id, scenario: record.scenario, reason: 'status' });
    else if (!Array.isArray(messages) || messages.length === 0) out.push({ kind: 'skipped', recordId: record.id, scenario: record.scenario, reason: 'no-messages' });
    else {
      this.route(record, messages, out);
      if (record.tags?.['session-done'] === 'true') this.end(record, out);
    }
    this.checkUnbound(out);
    return out;
  }

  /** Advances the clock without a record (an idle judge), expiring what is due. */
  tick(nowMs: number): CorrelationEvent[] {
    const out: CorrelationEvent[] = [];
    this.advance(nowMs, out);
    this.checkUnbound(out);
    return out;
  }

  counters(): CorrelationCounters {
    return { ...this.counts };
  }

  get openSessions(): number {
    return this.table.size;
  }

  /** Open sessions, least recently active first. */
  sessions(): { key: string; scenario: string; keyId: string | null; tagged: boolean; pendingTurnId: string; lastAt: number }[] {
    return [...this.table.values()].map((s) => ({ key: s.key, scenario: s.scenario, keyId: s.keyId, tagged: s.tagged, pendingTurnId: s.turnId, lastAt: s.lastAt }));
  }

  /** Drops the memo of long message text (a cache: memory back now, rehashing later). */
  clearHashMemo(): void {
    this.memo.clear();
  }

  toJSON(): CorrelatorState {
    return { ...this.head(), sessions: [...this.table.values()].map(saveSession) };
  }

  /** The state without its sessions (they are saved one by one: `changes`). */
  head(): CorrelatorHead {
    return {
      version: STATE_VERSION,
      clock: this.clock,
      seq: this.seq,
      counters: this.counters(),
      warned: { untagged: this.warnedUntagged, evictions: this.warnedEvictions, unboundAt: this.lastUnboundWarnAt },
    };
  }

  /**
   * The sessions opened, changed or closed since `changesSaved`, by map key: each as it is now, or
   * null once closed. Saved with `head()`, they bring a copy of the last saved state up to this one
   * (`fromJSON` of the head with the sessions in `seq` order, which is their activity order).
   */
  changes(): [mapKey: string, session: SavedSession | null][] {
    return [...this.table.unsavedKeys()].map((k) => {
      const s = this.table.get(k);
      return [k, s === undefined ? null : saveSession(s)];
    });
  }

  /** What `changes` answered is saved; call before anything else changes the sessions. */
  changesSaved(): void {
    this.table.saved();
  }

  /** Counts these sessions as changed: those of a state undone to an earlier one, or every session of a state saved whole. */
  markChanged(mapKeys: Iterable<string>): void {
    for (const k of mapKeys) this.table.changed(k);
  }

  /** The map keys `changes` would answer. */
  unsavedKeys(): string[] {
    return [...this.table.unsavedKeys()];
  }

  /** Every open session's map key. */
  sessionKeys(): string[] {
    return [...this.table.values()].map((s) => s.mapKey);
  }

  /** A correlator that resumes from `toJSON()` output; `options` may differ from the saved run's. */
  static fromJSON(state: CorrelatorState, options: CorrelatorOptions = {}): Correlator {
    if (state?.version !== STATE_VERSION) throw new Error(`correlator state version ${String(state?.version)} is not ${STATE_VERSION}`);
    const c = new Correlator(options);
    c.clock = state.clock;
    c.seq = state.seq;
    Object.assign(c.counts, state.counters);
    c.warnedUntagged = state.warned.untagged;
    c.warnedEvictions = state.warned.evictions;
    c.lastUnboundWarnAt = state.warned.unboundAt;
    for (const saved of state.sessions) c.table.add(restoreSession(saved));
    c.table.saved();
    return c;
  }

  private route(record: CorrelationRecord, messages: unknown[], out: CorrelationEvent[]): void {
    const tag = record.tags?.session;
    const tagged = typeof tag === 'string' && tag.length > 0;
    if (tagged) this.counts.tagged++;
    else {
      this.counts.untagged++;
      if (!this.warnedUntagged) {
        this.warnedUntagged = true;
        this.warn('untagged-traffic', `scenario ${record.scenario} sends requests without x-reef-tag-session (first: ${record.id}); they are correlated by transcript, which history rewrites and identical conversations break — send one x-reef-tag-session value per conversation`, out);
      }
    }
    const keyId = record.keyId ?? null;
    const mapKey = tagged ? sessionMapKey(record.scenario, keyId, `tag:${tag}`) : null;
    if (record.tags?.['turn-type'] === 'side') {
      this.counts.side++;
      const s = mapKey === null ? undefined : this.table.get(mapKey);
      if (s !== undefined) this.table.touch(s, this.clock, ++this.seq);
      out.push({ kind: 'side', sessionKey: s?.key ?? null, scenario: record.scenario, recordId: record.id, reason: 'tagged' });
      return;
    }
    const n = messages.length;
    const reply = messageHash(record.response ?? { role: 'assistant', content: null }, this.memo);
    if (mapKey !== null) this.tagMode(record, mapKey, `tag:${tag}`, messages, reply, out);
    else {
      this.hashMessages(record.scenario, keyId, messages);
      const full = this.ps[n - 1]!;
      this.fallback(record, messages, full, mix(full, reply), out);
    }
    this.enforceCapacity(out);
  }

  /** Prefix hashes seeded by scenario and key id: transcripts of two keys never match (nor do two scenarios'). */
  private hashMessages(scenario: string, keyId: string | null, messages: unknown[]): void {
    const n = messages.length;
    if (this.hs.length < n) {
      this.hs = new Float64Array(n * 2);
      this.ps = new Float64Array(n * 2);
    }
    let p = sessionSeed(scenario, keyId);
    for (let i = 0; i < n; i++) {
      const h = messageHash(messages[i], this.memo);
      this.hs[i] = h;
      p = mix(p, h);
      this.ps[i] = p;
    }
  }

  /**
   * Tag mode hashes at most five messages, whatever the transcript's length: the first (root), the
   * first after the system prompt (conversation root), the newest (retry check) and the one where
   * the last reply would sit (extends check). In a tagged session "extends" therefore means: same
   * root, and the session's last reply at its position; "exact repeat": same length, same root and
   * newest message. The tag already says which conversation a request belongs to; these checks
   * only sort retries, side requests and which of two replies the client went on from.
   */
  private tagMode(record: CorrelationRecord, mapKey: string, key: string, messages: unknown[], reply: number, out: CorrelationEvent[]): void {
    const n = messages.length;
    const h0 = messageHash(messages[0], this.memo);
    const conv = this.conversationRoot(messages, h0);
    const newest = n === 1 ? h0 : messageHash(messages[n - 1], this.memo);
    const s = this.table.get(mapKey);
    if (s === undefined) {
      this.open(record, mapKey, key, true, n, newest, reply, h0, conv, false, out);
      return;
    }
    this.table.touch(s, this.clock, ++this.seq);
    const sc = record.scenario;
    const root = s.sysVaries ? conv : h0;
    if (n === s.n && root === s.root && newest === s.full) {
      this.counts.retries++;
      out.push({ kind: 'retry', sessionKey: s.key, scenario: sc, recordId: record.id, ofRecordId: s.turnId });
      s.altId = s.turnId;
      s.altExt = s.ext;
      s.turnId = record.id;
      s.ext = reply;
      return;
    }
    const atLast = n >= s.n + 2 && root === s.root ? messageHash(messages[s.n], this.memo) : -1;
    let turnId = s.turnId;
    let from = -1;
    let how: 'extends' | 'rewrite' = 'rewrite';
    if (atLast === s.ext) {
      from = s.n;
      how = 'extends';
    } else if (s.altId !== null && atLast === s.altExt) {
      turnId = s.altId;
      from = s.n;
      how = 'extends';
    } else if (s.candId !== null && n >= s.candN + 2 && conv === s.candConv && messageHash(messages[s.candN], this.memo) === s.candExt) {
      // The candidate was extended: not a side request but the session's new main line. With the
      // same conversation, only the system prompt moved, and it moves along the main line.
      this.dropTurn(s, s.turnId, 'rewrite', out);
      if (s.candConv === s.conv) s.sysVaries = true;
      turnId = s.candId;
      from = s.candN;
      how = 'extends';
      s.candId = null;
    } else if (this.config.inferSide && root !== s.root) {
      this.confirmSide(s, out);
      s.candId = record.id;
      s.candN = n;
      s.candExt = reply;
      s.candConv = conv;
      return;
    }
    if (from < 0 && newest === s.full && !this.answers(messages, s.ext)) {
      // The pending request's own newest message, not after its reply: the client asked again over
      // an edited history (a note added, old messages trimmed). Bound, the turn would be judged
      // against its own question; it is a retry, whose replaced turn has no position to go by.
      this.counts.retries++;
      out.push({ kind: 'retry', sessionKey: s.key, scenario: sc, recordId: record.id, ofRecordId: s.turnId });
      this.setLast(s, record.id, n, newest, reply, h0, conv);
      return;
    }
    this.confirmSide(s, out);
    this.finishTurn(s, turnId, record, messages, from, out);
    this.setLast(s, record.id, n, newest, reply, h0, conv);
    out.push({ kind: 'continued', sessionKey: s.key, scenario: sc, recordId: record.id, how });
  }

  private fallback(record: CorrelationRecord, messages: unknown[], full: number, ext: number, out: CorrelationEvent[]): void {
    const n = messages.length;
    const sc = record.scenario;
    const original = this.table.findByFull(full);
    if (original !== null && original.n === n) {
      this.counts.retries++;
      original.repeat = true;
      this.table.changed(original.mapKey);
      // The repeat stays loud: if nothing extends the group, it is the turn lost (the reply the
      // client most likely kept), counted once as tag mode counts it.
      const sib = this.open(record, sessionMapKey(sc, record.keyId ?? null, `chain:${record.id}`), `chain:${record.id}`, false, n, full, ext, this.hs[0]!, this.hs[0]!, false, null);
      out.push({ kind: 'retry', sessionKey: sib.key, scenario: sc, recordId: record.id, ofRecordId: original.turnId });
      return;
    }
    for (let k = n - 2; k >= 0; k--) {
      if (roleOf(messages[k]) !== 'assistant') continue;
      const s = this.table.findByExt(this.ps[k]!);
      if (s === null || s.n !== k) continue;
      this.table.touch(s, this.clock, ++this.seq);
      this.finishTurn(s, s.turnId, record, messages, k, out);
      // Its retry group (exact repeats of its last request) was retries after all: silent now.
      for (const t of this.table.withFull(s.full)) {
        if (t === s || t.n !== s.n) continue;
        t.repeat = true;
        this.table.changed(t.mapKey);
      }
      this.table.unindex(s);
      this.setLast(s, record.id, n, full, ext, this.hs[0]!, this.hs[0]!);
      this.table.index(s);
      out.push({ kind: 'continued', sessionKey: s.key, scenario: sc, recordId: record.id, how: 'extends' });
      return;
    }
    this.open(record, sessionMapKey(sc, record.keyId ?? null, `chain:${record.id}`), `chain:${record.id}`, false, n, full, ext, this.hs[0]!, this.hs[0]!, false, out);
  }

  private open(record: CorrelationRecord, mapKey: string, key: string, tagged: boolean, n: number, full: number, ext: number, root: number, conv: number, repeat: boolean, out: CorrelationEvent[] | null): Session {
    const s: Session = {
      mapKey, key, scenario: record.scenario, keyId: record.keyId ?? null, tagged,
      turnId: record.id, n, full, ext, root, conv, sysVaries: false,
      altId: null, altExt: 0, candId: null, candN: 0, candExt: 0, candConv: 0,
      repeat, lastAt: this.clock, seq: ++this.seq,
    };
    this.table.add(s);
    out?.push({ kind: 'opened', sessionKey: key, scenario: record.scenario, recordId: record.id });
    return s;
  }

  private setLast(s: Session, id: string, n: number, full: number, ext: number, first: number, conv: number): void {
    s.turnId = id;
    s.n = n;
    s.full = full;
    s.ext = ext;
    s.root = s.sysVaries ? conv : first;
    s.conv = conv;
    s.altId = null;
    s.repeat = false;
  }

  /** Whether the request's last assistant message hashes to `reply` (its newest messages answer it). */
  private answers(messages: unknown[], reply: number): boolean {
    for (let i = messages.length - 1; i >= 0; i--) {
      if (roleOf(messages[i]) === 'assistant') return messageHash(messages[i], this.memo) === reply;
    }
    return false;
  }

  /** Hash of the first message that is not a system or developer message (`first` when that is the first, or there is none). */
  private conversationRoot(messages: unknown[], first: number): number {
    for (let i = 0; i < messages.length; i++) {
      const role = roleOf(messages[i]);
      if (role !== 'system' && role !== 'developer') return i === 0 ? first : messageHash(messages[i], this.memo);
    }
    return first;
  }

  /** Emits `turnId`'s turn with its next state from `messages` (after index `from`; -1: rewrite). */
  private finishTurn(s: Session, turnId: string, record: CorrelationRecord, messages: unknown[], from: number, out: CorrelationEvent[]): void {
    const next = nextStateOf(messages, from);
    if (next === null) {
      this.dropTurn(s, turnId, 'no-next-state', out);
      return;
    }
    this.counts.bound++;
    out.push({ kind: 'turn-finished', sessionKey: s.key, scenario: s.scenario, turnRecordId: turnId, nextStateRecordId: record.id, nextState: next });
  }

  private dropTurn(s: Session, turnId: string, reason: 'expired' | 'evicted' | 'no-next-state' | 'rewrite' | 'session-done', out: CorrelationEvent[]): void {
    // A session's last turn, once its client said it was the last, is not a turn that failed to
    // bind: counted `ended` (per session), it stays out of the unbound warning.
    if (reason !== 'session-done') this.counts.dropped_unbound++;
    out.push({ kind: 'turn-dropped', sessionKey: s.key, scenario: s.scenario, turnRecordId: turnId, reason });
  }

  private confirmSide(s: Session, out: CorrelationEvent[]): void {
    if (s.candId === null) return;
    this.counts.side++;
    out.push({ kind: 'side', sessionKey: s.key, scenario: s.scenario, recordId: s.candId, reason: 'inferred' });
    s.candId = null;
  }

  private close(s: Session, reason: 'expired' | 'evicted' | 'done', out: CorrelationEvent[]): void {
    this.table.remove(s);
    this.confirmSide(s, out);
    if (!s.repeat) this.dropTurn(s, s.turnId, reason === 'done' ? 'session-done' : reason, out);
    out.push({ kind: 'session-closed', sessionKey: s.key, scenario: s.scenario, reason });
  }

  /**
   * The client ended the session (`session-done`, after this record was routed): its last turn,
   * this record's own reply unless the record was a side request, has no next state and never
   * will, so it is dropped now rather than at the TTL, and the session's place is free. A later
   * request with the same tag opens a new session. Dropped, not judged: a hindsight judge has
   * nothing to judge it by (the reference submits it excluded from the loss too).
   */
  private end(record: CorrelationRecord, out: CorrelationEvent[]): void {
    const tag = record.tags?.session;
    if (typeof tag !== 'string' || tag.length === 0) return;
    const s = this.table.get(sessionMapKey(record.scenario, record.keyId ?? null, `tag:${tag}`));
    if (s === undefined) return;
    this.counts.ended++;
    this.close(s, 'done', out);
  }

  private advance(nowMs: number, out: CorrelationEvent[]): void {
    if (Number.isFinite(nowMs) && nowMs > this.clock) this.clock = nowMs;
    const ttlMs = this.config.sessionTtlS * 1000;
    for (let s = this.table.oldest(); s !== undefined && this.clock - s.lastAt > ttlMs; s = this.table.oldest()) this.close(s, 'expired', out);
  }

  private enforceCapacity(out: CorrelationEvent[]): void {
    while (this.table.size > this.config.maxOpenSessions) {
      const s = this.table.evictionVictim()!;
      this.counts.evicted++;
      if (!this.warnedEvictions) {
        this.warnedEvictions = true;
        this.warn('evictions', `more than ${this.config.maxOpenSessions} open sessions: evicting the least recently active of the scenario and API key holding the most (first: ${s.key} in ${s.scenario}, key ${s.keyId ?? 'none'}, ${this.table.sizeOf(s.scenario, s.keyId)} open) and dropping their pending turns — raise max_open_sessions or tag sessions so requests bind`, out);
      }
      this.close(s, 'evicted', out);
    }
  }

  private checkUnbound(out: CorrelationEvent[]): void {
    const { dropped_unbound: dropped, bound } = this.counts;
    if (dropped < 8 || dropped <= bound) return;
    if (this.lastUnboundWarnAt !== null && this.clock - this.lastUnboundWarnAt < 300_000) return;
    this.lastUnboundWarnAt = this.clock;
    this.warn('unbound-turns', `${dropped} turns were dropped without a next state and only ${bound} bound: sessions expire before any request extends them; check with \`reef correlate\` and send x-reef-tag-session`, out);
  }

  private warn(code: WarningCode, message: string, out: CorrelationEvent[]): void {
    out.push({ kind: 'warning', code, message, counters: this.counters() });
    this.log?.(`correlation warning ${code}: ${message}`);
  }
}

/**
 * The next state after index `from` (-1: anywhere after the request's last assistant message):
 * every user and tool message after it, up to the next assistant message. Parallel tool calls
 * answer with one tool message each, and a reply whose first result is an error must not be
 * judged on the last one alone; likewise two user messages in a row (the first one's request
 * failed) both answered the reply. With no assistant message before them, only the newest. The
 * role is the newest message's. One message is its text as it is; several are labelled blocks
 * (`[user]`, `[tool <function name>]`), oldest first.
 */
export function nextStateOf(messages: unknown[], from: number): NextState | null {
  let end = messages.length - 1;
  if (from >= 0) {
    for (let j = from + 1; j < messages.length; j++) {
      if (roleOf(messages[j]) === 'assistant') {
        end = j - 1;
        break;
      }
    }
  }
  const found: number[] = [];
  let i = end;
  for (; i > from; i--) {
    const role = roleOf(messages[i]);
    if (role === 'user' || role === 'tool') found.push(i);
    else if (role !== 'system' && role !== 'developer') break;
  }
  if (found.length === 0) return null;
  // With no assistant message before them (a rewritten history, a first request), the older user
  // messages are history (a compaction summary, pasted files), not an answer to anything.
  if (i < 0) found.length = 1;
  const role = roleOf(messages[found[0]!]) as NextState['role'];
  const textOf = (k: number): string => {
    const content = (messages[k] as { content?: unknown }).content;
    return contentText(content) ?? canonicalJson(content);
  };
  if (found.length === 1) return { role, content: textOf(found[0]!) };
  // The assistant message the run answers (when the request has it) names the tools by call id.
  const before = i >= 0 && roleOf(messages[i]) === 'assistant' ? (messages[i] as { tool_calls?: unknown }).tool_calls : null;
  const blocks = found.reverse().map((k) => `[${labelOf(messages[k], before)}]\n${textOf(k)}`);
  return { role, content: blocks.join('\n\n') };
}

function labelOf(message: unknown, calls: unknown): string {
  const m = message as { role?: unknown; name?: unknown; tool_call_id?: unknown };
  if (m.role !== 'tool') return 'user';
  let name = typeof m.name === 'string' ? m.name : null;
  if (name === null && Array.isArray(calls)) {
    for (const c of calls as { id?: unknown; function?: { name?: unknown } }[]) {
      if (c?.id === m.tool_call_id && typeof c.function?.name === 'string') name = c.function.name;
    }
  }
  return name === null ? 'tool' : `tool ${name}`;
}
