import { randomBytes } from 'node:crypto';
import { clip, MAX_FIELD_CHARS } from '../../recipes/openclawrl/judge/prompts.js';
import { verdict } from '../../recipes/openclawrl/judge/votes.js';
import type { JudgeDecision, RecordStore } from '../gateway/store/types.js';
import { ReefError } from '../runtime/errors.js';
import type { LogFn } from '../runtime/log.js';
import { Correlator, type CorrelationCounters, type CorrelatorOptions, type TurnFinished } from './correlate/index.js';
import type { CompleteTurn, JudgeTurn } from './messages.js';
import { byActivity, type PendingRow, type SavedPending, type SavedState, SESSION_PREFIX, sessionRowKey, zeroCounters } from './saved-state.js';
import { contextOf, replyOf, taskOf } from './turn-text.js';

/**
 * The judge without sockets: reads records by offset into the Correlator, keeps the finished
 * turns until a PRM actor completes them, and hands them out under leases. Offset, correlator
 * state and pending turns (with their leases) are saved in ONE transaction, so after a crash the
 * judge resumes exactly where its last commit left it; a turn is judged once because the
 * judged-turn log refuses a second row for it (see store `appendJudgedTurn`). Each pending turn is
 * a state row of its own (`PENDING_PREFIX` + its id) holding its lease and its place in line,
 * written when it is bound and again when its lease or place changes, and deleted once it is
 * judged; the state itself is the head alone (offset, counters, the next place). Each open session
 * is a row too (`SESSION_PREFIX`), written by the commits whose records touched it and deleted by
 * the one after it closed, so a commit writes the sessions that changed, not the up to 4096 open.
 */

export type JudgeStore = Pick<RecordStore, 'readFrom' | 'headOffset' | 'get' | 'getOffset' | 'getState' | 'statesWithPrefix' | 'commitConsumer' | 'appendJudgedTurn' | 'judgedTurnIds'>;

export const CONSUMER = 'judge';
export const STATE_KEY = 'judge/state';
/** Deleted record ids a judge keeps in memory (`forget`): a session goes on after its deletion for minutes, not for 100,000 deletions. */
const FORGOTTEN_MAX = 100_000;
/** Where the pending turns' rows are: one key per turn, its turn record id after the prefix. */
export const PENDING_PREFIX = 'judge/pending/';
export interface JudgeOptions {
  store: JudgeStore;
  /** `correlate-only` binds sessions and judges nothing (no PRM configured). */
  mode: 'judge' | 'correlate-only';
  correlator: Omit<CorrelatorOptions, 'log'>;
  maxHintCandidates: number;
  /** How long a lease lasts without renewal. @default 15000 */
  leaseMs?: number;
  /** Records read per pump. @default 256 */
  batch?: number;
  /** Reading stops while this many turns wait for a PRM (keeps the saved state bounded; judge mode only). @default 2048 */
  maxPending?: number;
  /** @default Date.now */
  now?: () => number;
  log: LogFn;
}

interface Pending {
  ev: TurnFinished;
  leaseId: string | null;
  actorId: string | null;
  expiresAt: number;
  /** Its place in line: turns are handed out in ascending order (the map's order, saved). */
  seq: number;
  /** Leases this turn ran out of before it was dispatched again, with the actor each went to. */
  earlier?: Map<string, string>;
}

/**
 * Characters of a next state a pending turn keeps. The PRM prompt shows at most MAX_FIELD_CHARS of
 * it (prompts.ts clip), so the rest only made the saved state grow: 2048 pending turns of
 * long-context next states (hundreds of KB each) passed V8's longest string, and every commit
 * then threw and retried for good. Clipped here with room for clip's "left out" line, so that the
 * prompt's own clip leaves it as it is and a PRM sees the same text before and after a restart.
 */
export const NEXT_STATE_CHARS = MAX_FIELD_CHARS - 64;

/** The turn as it is kept pending and saved: its next state clipped to what a PRM prompt shows. */
export function boundTurn(ev: TurnFinished): TurnFinished {
  const { content } = ev.nextState;
  if (content.length <= MAX_FIELD_CHARS) return ev;
  return { ...ev, nextState: { role: ev.nextState.role, content: clip(content, NEXT_STATE_CHARS) } };
}

/** A pending turn's saved row: a copy, so that a lease changed while the commit is written stays out of it. */
function rowOf(p: Pending): PendingRow {
  return { turn: p.ev, seq: p.seq, leaseId: p.leaseId, actorId: p.actorId };
}

export class JudgeCore {
  readonly leaseMs: number;
  private correlator!: Correlator;
  private nextOffset = 0;
  private readonly pending = new Map<string, Pending>();
  private readonly completing = new Map<string, Promise<{ accepted: boolean; offset: number | null }>>();
  private counters = zeroCounters();
  /** Pending turns whose rows the next commit writes: their lease or place changed, or they were resumed from an earlier version's state. */
  private rewrite = new Set<string>();
  /** The place in line the next bound or released turn gets. */
  private nextSeq = 0;
  /** Turns no longer pending whose rows the next commit deletes. */
  private gone = new Set<string>();
  /** Session rows no session has (left beside a state of an earlier version), deleted by the next commit. */
  private strayRows: string[] = [];
  private dirty = false;
  private serial: Promise<unknown> = Promise.resolve();
  private waiters = new Set<() => void>();
  private closed = false;
  private readonly now: () => number;
  /** Record ids deleted on request (`forget`), newest last, at most FORGOTTEN_MAX. */
  private readonly forgotten = new Set<string>();

  constructor(private readonly opts: JudgeOptions) {
    this.leaseMs = opts.leaseMs ?? 15_000;
    this.now = opts.now ?? Date.now;
  }

  /** Resume from the last commit: offset, correlator, pending turns not judged meanwhile. */
  async start(): Promise<void> {
    const { store } = this.opts;
    this.nextOffset = await store.getOffset(CONSUMER);
    const saved = (await store.getState(STATE_KEY)) as SavedState | null;
    const log = this.opts.log;
    const corr = this.correlatorOptions();
    const sessionRows = await store.statesWithPrefix(SESSION_PREFIX);
    if (saved?.version === 3 || saved?.version === 4) {
      this.correlator = Correlator.fromJSON({ ...saved.correlator, sessions: byActivity(sessionRows) }, corr);
    } else {
      this.correlator = saved === null ? new Correlator(corr) : Correlator.fromJSON(saved.correlator, corr);
      // Its sessions, saved inside the state, become rows with the first commit. Rows beside a state
      // that does not name them (a later judge's, before a downgrade or a reset) would come back
      // as sessions at the next start: they go with it.
      const keys = this.correlator.sessionKeys();
      this.correlator.markChanged(keys);
      const current = new Set(keys.map(sessionRowKey));
      this.strayRows = sessionRows.map(([k]) => k).filter((k) => !current.has(k));
      if (keys.length > 0 || this.strayRows.length > 0) this.dirty = true;
    }
    if (saved === null) return;
    this.counters = { ...zeroCounters(), ...saved.counters };
    const rows = await store.statesWithPrefix(PENDING_PREFIX);
    // Earlier versions' turns get their places in the order their state saved them.
    const entries: PendingRow[] = [];
    if (saved.version === 4) {
      for (const [, row] of rows) entries.push(row as PendingRow);
      entries.sort((a, b) => a.seq - b.seq);
      this.nextSeq = Math.max(saved.nextSeq, (entries.at(-1)?.seq ?? -1) + 1);
    } else if (saved.version === 1) {
      for (const [ev, leaseId, actorId] of saved.pending) entries.push({ turn: boundTurn(ev), leaseId, actorId, seq: this.nextSeq++ });
    } else {
      const events = new Map(rows.map(([k, ev]) => [k.slice(PENDING_PREFIX.length), ev as TurnFinished]));
      for (const [id, leaseId, actorId] of saved.pending) {
        const ev = events.get(id);
        if (ev !== undefined) entries.push({ turn: ev, leaseId, actorId, seq: this.nextSeq++ });
      }
    }
    const judged = await store.judgedTurnIds(entries.map((r) => r.turn.turnRecordId));
    const expiresAt = this.now() + this.leaseMs;
    for (const { turn: ev, leaseId, actorId, seq } of entries) {
      if (judged.has(ev.turnRecordId)) continue;
      // A lease held before the restart stays valid for one more period, so its actor can finish.
      this.pending.set(ev.turnRecordId, { ev, leaseId, actorId, expiresAt: leaseId === null ? 0 : expiresAt, seq });
      // An earlier version's row is the bare event: rewritten as a version 4 row.
      if (saved.version !== 4) this.rewrite.add(ev.turnRecordId);
    }
    // Rows of turns judged since the last commit go with the next one.
    for (const [k] of rows) {
      const id = k.slice(PENDING_PREFIX.length);
      if (!this.pending.has(id)) this.gone.add(id);
    }
    if (this.rewrite.size > 0 || this.gone.size > 0) this.dirty = true;
    log(`resumed at offset ${this.nextOffset} with ${this.pending.size} pending turns (${judged.size} judged since the last commit)`);
  }

  /** Read one batch of records into the correlator and commit; returns how many were read. */
  pump(): Promise<number> {
    return this.exclusive(async () => {
      // Correlate-only never hands a turn out, so turns pending from a judging run (kept for when
      // a PRM is back) would hold reading back for good.
      if (this.closed || (this.opts.mode === 'judge' && this.pending.size >= (this.opts.maxPending ?? 2048))) return 0;
      const records = await this.opts.store.readFrom(this.nextOffset, this.opts.batch ?? 256);
      if (records.length === 0) return 0;
      const next = records[records.length - 1]!.offset + 1;
      // The read counts only once it is committed. Until then the correlator can be put back, so
      // that a failed commit (a busy or full disk) leaves nothing behind for the flush timer to
      // save: the retry reads the same records into the same turns.
      const before = this.correlator.toJSON();
      const fresh: Pending[] = [];
      try {
        for (const record of records) {
          for (const ev of this.correlator.observe(record)) {
            if (ev.kind === 'turn-finished' && this.opts.mode === 'judge') fresh.push({ ev: boundTurn(ev), leaseId: null, actorId: null, expiresAt: 0, seq: -1 });
          }
        }
        // A deleted turn that a later record of its session finished is not judged: its record is gone.
        if (this.forgotten.size > 0) fresh.splice(0, fresh.length, ...fresh.filter((p) => !this.forgotten.has(p.ev.turnRecordId) && !this.forgotten.has(p.ev.nextStateRecordId)));
        // Saved before they are handed out: a turn is never judged that a restart would not know.
        await this.commit(fresh, next);
      } catch (err) {
        // What was unsaved before this read, and what it changed, is to be written still: the
        // sessions as they are again, or the deletion of those it opened.
        const unsaved = this.correlator.unsavedKeys();
        this.correlator = Correlator.fromJSON(before, this.correlatorOptions());
        this.correlator.markChanged(unsaved);
        throw err;
      }
      this.nextOffset = next;
      for (const p of fresh) if (!this.pending.has(p.ev.turnRecordId)) this.pending.set(p.ev.turnRecordId, p);
      if (fresh.length > 0) this.wake();
      return records.length;
    });
  }

  /**
   * Save leases and completions; with `idleNow`, also advance the correlator's clock to it while no
   * record arrives, so that idle sessions expire.
   */
  flush(idleNow: number | null = null): Promise<void> {
    return this.exclusive(async () => {
      // The correlator's clock is record time: sessions expire by the finishedAt of the records
      // read. Wall time may stand in for it only when every committed record has been read: any
      // record still to come then finishes after now (give or take the gateway's commit lag), so
      // it would have moved the clock as far. While records wait unread (a backlog after a
      // restart, reading held back by maxPending), ticking to wall time would close sessions that
      // those very records continue, and drop their turns. Capping the tick at the finishedAt of
      // the next unread record would be just as sound, but only does early what reading that
      // record does anyway, at the price of reading it.
      if (idleNow !== null && (await this.opts.store.headOffset()) < this.nextOffset) {
        if (this.correlator.tick(idleNow).length > 0) this.dirty = true;
      }
      if (this.dirty) await this.commit([], this.nextOffset);
    });
  }

  /**
   * Deletion on request (gateway store deletion.ts): drops the pending turns these records are the
   * turn or the next state of, and keeps the ids, so that a later record of the same session does
   * not make a deleted turn pending again. Their rows are the gateway's to delete (zeroed, in the
   * deletion's own transactions, which run again after this), so no commit writes them again.
   * Answers how many pending turns were dropped. A lease held on one is answered as unknown.
   */
  forget(ids: readonly string[]): Promise<number> {
    return this.exclusive(async () => {
      for (const id of ids) {
        this.forgotten.delete(id);
        this.forgotten.add(id);
      }
      for (const id of this.forgotten) {
        if (this.forgotten.size <= FORGOTTEN_MAX) break;
        this.forgotten.delete(id);
      }
      let dropped = 0;
      for (const [id, p] of [...this.pending]) {
        if (!this.forgotten.has(id) && !this.forgotten.has(p.ev.nextStateRecordId)) continue;
        this.pending.delete(id);
        this.rewrite.delete(id);
        this.gone.delete(id);
        dropped++;
      }
      return dropped;
    });
  }

  async lease(actorId: string, waitMs: number): Promise<{ turn: JudgeTurn | null; leaseId: string | null; leaseMs: number }> {
    const deadline = this.now() + waitMs;
    for (;;) {
      const p = this.takeFree(actorId);
      if (p !== null) {
        const leaseId = p.leaseId;
        try {
          return { turn: await this.turnOf(p.ev), leaseId, leaseMs: this.leaseMs };
        } catch (err) {
          // Its record was deleted on request while this judge was not told (it was restarting):
          // retention keeps every record a pending turn names, so nothing else takes one. The turn
          // goes, with its row, rather than failing every lease on it.
          if (err instanceof ReefError && err.code === 'REEF_ERR_NOT_FOUND' && this.pending.get(p.ev.turnRecordId) === p) {
            this.pending.delete(p.ev.turnRecordId);
            this.rewrite.delete(p.ev.turnRecordId);
            this.gone.add(p.ev.turnRecordId);
            this.dirty = true;
            this.opts.log(`turn ${p.ev.turnRecordId} dropped: its record was deleted`);
            continue;
          }
          // The actor gets an error, not the lease: held, the turn would wait out leaseMs and then
          // count as redispatched.
          if (p.leaseId === leaseId) {
            p.leaseId = null;
            p.actorId = null;
            p.expiresAt = 0;
            this.rewrite.add(p.ev.turnRecordId);
            this.wake();
          }
          throw err;
        }
      }
      const left = deadline - this.now();
      if (left <= 0 || this.closed) return { turn: null, leaseId: null, leaseMs: this.leaseMs };
      // Woken by a new turn or a release; the short cap notices leases that ran out.
      await new Promise<void>((resolve) => {
        const done = (): void => {
          clearTimeout(timer);
          this.waiters.delete(done);
          resolve();
        };
        const timer = setTimeout(done, Math.min(left, 200));
        this.waiters.add(done);
      });
    }
  }

  renew(actorId: string, leaseIds: readonly string[]): { renewed: string[]; lost: string[] } {
    const held = this.leasesOf(actorId);
    const expiresAt = this.now() + this.leaseMs;
    const renewed: string[] = [];
    const lost: string[] = [];
    for (const id of leaseIds) {
      const p = held.get(id);
      // A lease past its time that no other actor has taken yet is still this one's: a renewal
      // held up (a slow link, a busy judge) must not throw away minutes of a thinking PRM's votes.
      if (p === undefined) lost.push(id);
      else {
        p.expiresAt = expiresAt;
        renewed.push(id);
      }
    }
    return { renewed, lost };
  }

  release(actorId: string, leaseIds: readonly string[]): string[] {
    const held = this.leasesOf(actorId);
    const released: string[] = [];
    for (const id of leaseIds) {
      const p = held.get(id);
      if (p === undefined) continue;
      p.leaseId = null;
      p.actorId = null;
      p.expiresAt = 0;
      // To the back of the line: turns are handed out oldest first, and a turn its PRM keeps
      // failing on would otherwise be the next one leased, every time, to an actor of one credit.
      this.pending.delete(p.ev.turnRecordId);
      this.pending.set(p.ev.turnRecordId, p);
      p.seq = this.nextSeq++;
      this.rewrite.add(p.ev.turnRecordId);
      released.push(id);
    }
    if (released.length > 0) {
      this.counters.released += released.length;
      this.dirty = true;
      this.wake();
    }
    return released;
  }

  /**
   * Record a PRM actor's votes for a turn. The first completion of a pending turn counts, even
   * from an actor whose lease ran out (its work is as good); any later one is ignored.
   */
  complete(msg: Omit<CompleteTurn, 'type' | 'requestId'>): Promise<{ accepted: boolean; offset: number | null }> {
    // Votes become rewards and hints become teacher prompts: only the actor a turn was handed to,
    // under a lease it was given (the current one, or one that ran out meanwhile), may judge it.
    // Checked before anything else, so a forged completion cannot hold the turn while it runs.
    const p = this.pending.get(msg.turnRecordId);
    if (p !== undefined) {
      const holder = p.leaseId === msg.leaseId ? p.actorId : p.earlier?.get(msg.leaseId);
      if (holder == null || holder !== msg.actorId) {
        this.counters.refused_completions++;
        this.opts.log(`completion from ${msg.actorId} for turn ${msg.turnRecordId} refused: lease ${JSON.stringify(msg.leaseId)} is not one the turn was given to that actor under`);
        return Promise.resolve({ accepted: false, offset: null });
      }
    }
    const running = this.completing.get(msg.turnRecordId);
    if (running !== undefined) {
      this.counters.duplicate_completions++;
      return running.then((r) => ({ accepted: false, offset: r.offset }));
    }
    const work = this.record(msg).finally(() => this.completing.delete(msg.turnRecordId));
    this.completing.set(msg.turnRecordId, work);
    return work;
  }

  /** Wake long-polls with no turn; later pumps read nothing. */
  close(): void {
    this.closed = true;
    this.wake();
  }

  stats(): Record<string, number> {
    const c: CorrelationCounters = this.correlator?.counters() ?? { tagged: 0, untagged: 0, bound: 0, dropped_unbound: 0, evicted: 0, retries: 0, side: 0, ended: 0 };
    let leased = 0;
    for (const p of this.pending.values()) if (p.leaseId !== null && p.expiresAt > this.now()) leased++;
    return { ...c, ...this.counters, pending: this.pending.size, leased, next_offset: this.nextOffset, open_sessions: this.correlator?.openSessions ?? 0 };
  }

  get mode(): JudgeOptions['mode'] {
    return this.opts.mode;
  }

  get offset(): number {
    return this.nextOffset;
  }

  private async record(msg: Omit<CompleteTurn, 'type' | 'requestId'>): Promise<{ accepted: boolean; offset: number | null }> {
    const p = this.pending.get(msg.turnRecordId);
    if (p === undefined) {
      this.counters.duplicate_completions++;
      const judged = await this.opts.store.judgedTurnIds([msg.turnRecordId]);
      if (!judged.has(msg.turnRecordId)) this.opts.log(`completion from ${msg.actorId} for unknown turn ${msg.turnRecordId} ignored`);
      return { accepted: false, offset: null };
    }
    const v = verdict(msg.scoreCalls, msg.hintCalls, this.opts.maxHintCandidates);
    const { ev } = p;
    const judgment = {
      turnRecordId: ev.turnRecordId,
      nextStateRecordId: ev.nextStateRecordId,
      scenario: ev.scenario,
      sessionKey: ev.sessionKey,
      nextState: ev.nextState,
      ...v,
      prm: msg.prm,
      actorId: msg.actorId,
      startedAt: msg.startedAt,
      finishedAt: msg.finishedAt,
      judgedAt: this.now(),
    };
    const decision: JudgeDecision = v.decision;
    const { offset, created } = await this.opts.store.appendJudgedTurn({
      turnRecordId: ev.turnRecordId,
      nextStateRecordId: ev.nextStateRecordId,
      scenario: ev.scenario,
      sessionKey: ev.sessionKey,
      decision,
      reward: v.reward,
      teacherCandidates: v.teacherCandidates,
      judgment,
    });
    this.pending.delete(ev.turnRecordId);
    this.gone.add(ev.turnRecordId);
    this.dirty = true;
    if (!created) {
      this.counters.duplicate_completions++;
      return { accepted: false, offset };
    }
    if (p.leaseId !== msg.leaseId) this.counters.late_completions++;
    this.counters.votes_ok += v.votesOk;
    this.counters.votes_failed += v.votesFailed;
    this.counters.votes_invalid += v.votesInvalid;
    this.counters.judged++;
    if (decision === 'dropped') this.counters.dropped++;
    return { accepted: true, offset };
  }

  private correlatorOptions(): CorrelatorOptions {
    return { ...this.opts.correlator, log: this.opts.log };
  }

  private takeFree(actorId: string): Pending | null {
    const now = this.now();
    for (const p of this.pending.values()) {
      if (this.completing.has(p.ev.turnRecordId)) continue;
      if (p.leaseId !== null && p.expiresAt > now) continue;
      if (p.leaseId !== null) {
        this.counters.redispatched++;
        this.opts.log(`lease ${p.leaseId} of ${p.actorId} on turn ${p.ev.turnRecordId} ran out; dispatching it again`);
        // Its holder's votes, if they come, are as good as the next one's (`complete` takes the first).
        if (p.actorId !== null) (p.earlier ??= new Map()).set(p.leaseId, p.actorId);
      }
      p.leaseId = randomBytes(8).toString('hex');
      p.actorId = actorId;
      p.expiresAt = now + this.leaseMs;
      this.rewrite.add(p.ev.turnRecordId);
      this.dirty = true;
      return p;
    }
    return null;
  }

  private leasesOf(actorId: string): Map<string, Pending> {
    const held = new Map<string, Pending>();
    for (const p of this.pending.values()) if (p.actorId === actorId && p.leaseId !== null) held.set(p.leaseId, p);
    return held;
  }

  private async turnOf(ev: TurnFinished): Promise<JudgeTurn> {
    const record = await this.opts.store.get(ev.turnRecordId);
    if (record === null) throw new ReefError('REEF_ERR_NOT_FOUND', { what: `turn record ${ev.turnRecordId}` });
    return {
      turnRecordId: ev.turnRecordId,
      nextStateRecordId: ev.nextStateRecordId,
      scenario: ev.scenario,
      sessionKey: ev.sessionKey,
      task: taskOf(record.request.messages),
      context: contextOf(record.request.messages),
      reply: replyOf(record.response),
      nextState: ev.nextState,
    };
  }

  /**
   * Saves the offset, the correlator's head, the rows of turns new since the last commit and of
   * those whose lease or place changed, the rows of sessions changed since, and the deletion of
   * turns judged and sessions closed since, in one transaction: a commit writes what changed, not
   * all of it.
   */
  private async commit(fresh: readonly Pending[], offset: number): Promise<void> {
    const put: [string, unknown][] = [];
    // Taken now: a lease handed out while this commit is written is the next commit's to save.
    const rewriting = this.rewrite;
    this.rewrite = new Set();
    for (const id of rewriting) {
      const p = this.pending.get(id);
      if (p !== undefined) put.push([PENDING_PREFIX + id, rowOf(p)]);
    }
    const added = new Set<string>();
    for (const p of fresh) {
      if (this.pending.has(p.ev.turnRecordId) || added.has(p.ev.turnRecordId)) continue;
      added.add(p.ev.turnRecordId);
      p.seq = this.nextSeq++;
      put.push([PENDING_PREFIX + p.ev.turnRecordId, rowOf(p)]);
    }
    // Deletes run after the writes: a turn pending again must keep its row.
    const gone = [...this.gone].filter((id) => !this.pending.has(id) && !added.has(id));
    const deletes = [...gone.map((id) => PENDING_PREFIX + id), ...this.strayRows];
    for (const [mapKey, session] of this.correlator.changes()) {
      if (session === null) deletes.push(sessionRowKey(mapKey));
      else put.push([sessionRowKey(mapKey), session]);
    }
    const state: SavedState = { version: 4, correlator: this.correlator.head(), nextSeq: this.nextSeq, counters: this.counters };
    this.dirty = false;
    try {
      await this.opts.store.commitConsumer(CONSUMER, offset, STATE_KEY, state, { put, delete: deletes });
    } catch (err) {
      this.dirty = true;
      for (const id of rewriting) this.rewrite.add(id);
      throw err;
    }
    this.correlator.changesSaved();
    this.strayRows = [];
    const deleted = new Set(gone);
    for (const id of this.gone) if (deleted.has(id) || this.pending.has(id) || added.has(id)) this.gone.delete(id);
  }

  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.serial.then(fn);
    this.serial = run.catch(() => {});
    return run;
  }

  private wake(): void {
    for (const w of [...this.waiters]) w();
  }
}
