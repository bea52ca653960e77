import { setTimeout as delay } from 'node:timers/promises';
import { lookupMailbox } from '../../cluster/lookup.js';
import { ReefError } from '../runtime/errors.js';
import type { LogFn } from '../runtime/log.js';
import { type CallOptions, type Request, RpcClient } from '../runtime/rpc.js';
import { completeReply, type JudgeTurn, leaseReply, renewReply } from '../judge/messages.js';
import type { PrmCaller } from './prm-client.js';
import { Semaphore, voteTurn } from './voter.js';

/**
 * Finds the judge's mailbox through the supervisor (`lookup`), or uses a fixed endpoint, and makes
 * every call to it. A call that got no answer (timed out, not sent, or cut off by a closed socket)
 * drops the client, so that the next call looks the judge up again: a restarted judge has a new
 * port. An error reply is the judge answering: the link is fine, and the client stays, with the
 * other calls in flight on it (a long-poll whose turn may be granted already).
 */
export class JudgeLink {
  private rpc: Promise<RpcClient> | null = null;

  constructor(private readonly supervisor: string | null, private readonly fixed: string | null, private readonly log: LogFn) {}

  async call<T>(msg: Request, options: CallOptions<T>): Promise<T> {
    const opening = this.connect();
    const rpc = await opening;
    try {
      return await rpc.call(msg, options);
    } catch (err) {
      if (unanswered(err)) await this.drop(opening, rpc);
      throw err;
    }
  }

  /** Close the client (a draining actor). */
  async close(): Promise<void> {
    const opening = this.rpc;
    if (opening === null) return;
    this.rpc = null;
    await (await opening.catch(() => null))?.close();
  }

  /** The client, shared by concurrent callers: one lookup, one socket. */
  private connect(): Promise<RpcClient> {
    if (this.rpc === null) {
      const opening = this.open();
      this.rpc = opening;
      // A failed lookup is not kept: the next call looks again.
      opening.catch(() => {
        if (this.rpc === opening) this.rpc = null;
      });
    }
    return this.rpc;
  }

  private async open(): Promise<RpcClient> {
    let endpoint = this.fixed;
    if (endpoint === null) {
      if (this.supervisor === null) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'a PRM actor needs a supervisor or REEF_JUDGE_MAILBOX to find the judge' });
      endpoint = await lookupMailbox(this.supervisor, 'judge', { running: true, timeoutMs: 3000, log: this.log });
      if (endpoint === null) throw new ReefError('REEF_ERR_NOT_FOUND', { what: 'a running judge' });
    }
    return new RpcClient(endpoint, { name: 'prm→judge', defaultTimeoutMs: 10_000, log: this.log });
  }

  /**
   * Close the client a call failed on. Its other calls fail with it (REEF_ERR_ACTOR_CLOSED) and
   * come here too; by then a retry may have opened a new client, which they must leave alone.
   */
  private async drop(opening: Promise<RpcClient>, rpc: RpcClient): Promise<void> {
    if (this.rpc === opening) this.rpc = null;
    await rpc.close();
  }
}

/**
 * No answer came from the judge: the client's own timeout, its close, a full send queue, or a
 * zeromq send error (not a ReefError); or the answer came from an actor that is not the judge.
 * The judge's handlers reply with none of these codes.
 */
function unanswered(err: unknown): boolean {
  if (!(err instanceof ReefError)) return true;
  // An actor that does not know the judge's messages is not the judge: after a restart the
  // judge's old port can be another actor's, and the client kept would ask it forever.
  return err.code === 'REEF_ERR_TIMEOUT' || err.code === 'REEF_ERR_ACTOR_CLOSED' || err.code === 'REEF_ERR_QUEUE_FULL' || err.code === 'REEF_ERR_UNKNOWN_MESSAGE';
}

interface Job {
  turn: JudgeTurn;
  leaseId: string;
  abort: AbortController;
  why: 'lost' | 'drain' | null;
  done: Promise<void>;
}

export interface PrmWorkerOptions {
  actorId: string;
  link: JudgeLink;
  prm: PrmCaller;
  m: number;
  /** PRM calls in flight at once (`prm_concurrency`). */
  concurrency: number;
  /** Long-poll wait of one `lease-turn`. @default 2000 */
  waitMs?: number;
  log: LogFn;
}

/** How long a turn the PRM could not be reached for is held before it goes back to the judge. */
const UNREACHABLE_PAUSE_MS = 1000;
const MAX_UNREACHABLE_PAUSE_MS = 30_000;
/** How long a turn's votes are offered to a judge that does not take them (restarting, busy store). */
const COMPLETE_RETRY_MS = 60_000;
/** Tries of a turn whose every PRM call failed before it is judged, or given back, on that. */
const FAILED_TURN_TRIES = 3;

/** Resolves after `ms`, or at once when `signal` aborts (the abort is not an error here). */
const sleep = (ms: number, signal?: AbortSignal): Promise<void> => delay(ms, undefined, signal ? { signal } : {}).catch(() => {});

/**
 * Credit-based pulling: the actor holds at most `credits` turns, one long-poll asks for the next
 * whenever a credit is free, leases are renewed every third of their length, and each turn's votes
 * go back in one `complete-turn`. Credits = enough turns to keep `prm_concurrency` calls busy.
 */
export class PrmWorker {
  readonly credits: number;
  private readonly limit: Semaphore;
  private readonly jobs = new Map<string, Job>();
  /** Turns given back because every call failed: `prm_calls_ok` when their first try began. */
  private readonly failedBefore = new Map<string, number>();
  /** Turns given back for a failing PRM since it last answered a call. */
  private givenBackInARow = 0;
  private readonly counters = { turns_leased: 0, turns_completed: 0, turns_refused: 0, turns_failed: 0, turns_prm_failing: 0, leases_lost: 0, leases_released: 0, prm_calls_ok: 0, prm_calls_failed: 0 };
  private leaseMs = 15_000;
  private stopping = false;
  private loop: Promise<void> | null = null;
  private renewer: NodeJS.Timeout | null = null;
  private freed: (() => void) | null = null;

  constructor(private readonly o: PrmWorkerOptions) {
    this.credits = Math.max(1, Math.ceil(o.concurrency / (2 * o.m)));
    this.limit = new Semaphore(o.concurrency);
  }

  start(): void {
    this.loop = this.pull();
    this.scheduleRenew();
  }

  stats(): Record<string, number> {
    return { ...this.counters, turns_in_flight: this.jobs.size, credits: this.credits };
  }

  /** Turn record ids held under a lease right now. */
  held(): string[] {
    return [...this.jobs.values()].map((j) => j.turn.turnRecordId);
  }

  /** Take no new turn; finish what is held within `graceMs`, then give the rest back to the judge. */
  async drain(graceMs: number): Promise<void> {
    this.stopping = true;
    this.freed?.();
    await this.loop;
    const all = Promise.all([...this.jobs.values()].map((j) => j.done));
    await Promise.race([all, sleep(graceMs)]);
    const left = [...this.jobs.values()];
    for (const j of left) {
      j.why = 'drain';
      j.abort.abort();
    }
    await all;
    if (this.renewer !== null) clearTimeout(this.renewer);
    await this.o.link.close();
  }

  private async pull(): Promise<void> {
    let backoff = 100;
    while (!this.stopping) {
      if (this.jobs.size >= this.credits) {
        await new Promise<void>((resolve) => (this.freed = resolve));
        continue;
      }
      const waitMs = this.o.waitMs ?? 2000;
      try {
        const reply = await this.o.link.call({ type: 'lease-turn', actorId: this.o.actorId, waitMs }, { timeoutMs: waitMs + 3000, schema: leaseReply });
        backoff = 100;
        this.setLeaseMs(reply.leaseMs);
        if (reply.turn === null || reply.leaseId === null) continue;
        this.counters.turns_leased++;
        if (this.stopping) await this.giveBack([reply.leaseId]);
        else this.run(reply.turn, reply.leaseId);
      } catch (err) {
        if (this.stopping) break;
        this.o.log(`leasing from the judge failed (${err instanceof ReefError ? err.code : String(err)}); trying again in ${backoff} ms`);
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 2000);
      }
    }
  }

  private run(turn: JudgeTurn, leaseId: string): void {
    const job = { turn, leaseId, abort: new AbortController(), why: null } as unknown as Job;
    job.done = (async () => {
      const startedAt = Date.now();
      // Replies the PRM gave to any call of this actor before this turn's first try (under an
      // earlier lease too): a PRM that answers other turns meanwhile fails this one's calls for
      // reasons of its own.
      const repliesBefore = this.failedBefore.get(turn.turnRecordId) ?? this.counters.prm_calls_ok;
      this.failedBefore.delete(turn.turnRecordId);
      for (let attempt = 1; ; attempt++) {
        const votes = await voteTurn(turn, this.o.prm, this.o.m, this.limit, job.abort.signal, attempt);
        let replied = false;
        for (const c of [...votes.scoreCalls, ...votes.hintCalls]) {
          this.counters[c.error === null ? 'prm_calls_ok' : 'prm_calls_failed']++;
          if (c.error === null) replied = true;
        }
        if (replied) this.givenBackInARow = 0;
        if (job.why === 'drain') {
          await this.giveBack([leaseId]);
          return;
        }
        // A lost lease was given to another actor; its partial (aborted) votes are not worth sending.
        if (job.why === 'lost') return;
        if (replied) {
          await this.complete(job, votes, startedAt);
          return;
        }
        const reason = votes.scoreCalls[0]?.error ?? votes.hintCalls[0]?.error ?? 'no call made';
        // Sent as they are, votes with no reply in them would judge the turn "no valid vote →
        // dropped" for good. A PRM that is down, restarting, or fails every call (a 500 to all,
        // a broken model) says nothing about the turn: it goes back to the judge for a later
        // try, after a pause (the lease renewed meanwhile) that keeps the actor from spinning.
        // Only a turn that keeps failing while the PRM answers other turns is judged on its
        // failed votes (its own prompt is what the PRM cannot take).
        const prmFailing = this.counters.prm_calls_ok === repliesBefore;
        if (votes.unreachable || (prmFailing && attempt >= FAILED_TURN_TRIES)) {
          this.counters.turns_prm_failing++;
          // Longer with every turn given back since the PRM last answered: a PRM down for hours is
          // asked (and logged about) every half minute per credit, not every second.
          const pause = Math.min(UNREACHABLE_PAUSE_MS * 2 ** this.givenBackInARow++, MAX_UNREACHABLE_PAUSE_MS);
          this.o.log(`turn ${turn.turnRecordId}: the PRM ${votes.unreachable ? 'was unreachable for' : 'failed'} every call (${reason}); giving the turn back in ${pause} ms`);
          // Remembered for when it comes back: an actor of one credit tries no other turn while it
          // holds this one, so only the replies between its leases show the PRM answers others.
          if (this.failedBefore.size >= 1024) this.failedBefore.delete(this.failedBefore.keys().next().value!);
          this.failedBefore.set(turn.turnRecordId, repliesBefore);
          await sleep(pause, job.abort.signal);
          if (job.why !== 'lost') await this.giveBack([leaseId]);
          return;
        }
        if (attempt >= FAILED_TURN_TRIES) {
          this.counters.turns_failed++;
          this.o.log(`turn ${turn.turnRecordId}: every PRM call failed on ${attempt} tries while the PRM answered other turns (${reason}); completing it without a vote`);
          await this.complete(job, votes, startedAt);
          return;
        }
        this.o.log(`turn ${turn.turnRecordId}: every PRM call failed (${reason}); trying again (${attempt + 1} of ${FAILED_TURN_TRIES})`);
        await sleep(UNREACHABLE_PAUSE_MS * 2 ** (attempt - 1), job.abort.signal);
      }
    })()
      .catch((err: unknown) => this.o.log(`turn ${turn.turnRecordId} failed: ${String(err)}`))
      .finally(() => {
        this.jobs.delete(leaseId);
        this.freed?.();
        this.freed = null;
      });
    this.jobs.set(leaseId, job);
  }

  private async complete(job: Job, votes: Awaited<ReturnType<typeof voteTurn>>, startedAt: number): Promise<void> {
    const msg = {
      type: 'complete-turn',
      actorId: this.o.actorId,
      leaseId: job.leaseId,
      turnRecordId: job.turn.turnRecordId,
      scoreCalls: votes.scoreCalls,
      hintCalls: votes.hintCalls,
      prm: { api: this.o.prm.api, url: votes.url, model: this.o.prm.model },
      startedAt,
      finishedAt: Date.now(),
    };
    // The judge may be restarting: it resumes the turn as pending, and the first completion counts
    // even after the lease ran out. Rather than cast the votes (maybe minutes of a thinking PRM's
    // work) again once the lease has run out, they are offered for a minute, unless the actor drains.
    const deadline = Date.now() + COMPLETE_RETRY_MS;
    for (let pause = 200; ; pause = Math.min(pause * 2, 5000)) {
      try {
        const reply = await this.o.link.call(msg, { timeoutMs: 10_000, schema: completeReply });
        this.counters[reply.accepted ? 'turns_completed' : 'turns_refused']++;
        return;
      } catch (err) {
        if (job.why === 'drain' || Date.now() + pause > deadline) throw err;
        this.o.log(`completing turn ${job.turn.turnRecordId} failed (${err instanceof ReefError ? err.code : String(err)}); trying again in ${pause} ms`);
        await sleep(pause);
      }
    }
  }

  private async giveBack(leaseIds: string[]): Promise<void> {
    try {
      await this.o.link.call({ type: 'release-lease', actorId: this.o.actorId, leaseIds }, { timeoutMs: 3000 });
      this.counters.leases_released += leaseIds.length;
    } catch (err) {
      // The leases then simply run out and the judge dispatches the turns again.
      this.o.log(`releasing ${leaseIds.length} leases failed: ${String(err)}`);
    }
  }

  private scheduleRenew(): void {
    this.renewer = setTimeout(() => {
      this.renewer = null;
      void this.renew().finally(() => {
        if (!this.stopping || this.jobs.size > 0) this.scheduleRenew();
      });
    }, Math.max(50, Math.floor(this.leaseMs / 3)));
  }

  /**
   * The judge's lease length comes with every reply. The renewal waiting now was timed for the
   * old length (15 s before the first reply): with a shorter lease, the lease just granted would
   * run out before it, so it is timed again. (While a renewal is in flight, it times the next one
   * from the new length itself.)
   */
  private setLeaseMs(leaseMs: number): void {
    const shorter = leaseMs < this.leaseMs;
    this.leaseMs = leaseMs;
    if (shorter && this.renewer !== null) {
      clearTimeout(this.renewer);
      this.scheduleRenew();
    }
  }

  private async renew(): Promise<void> {
    const held = [...this.jobs.values()].filter((j) => j.why === null);
    if (held.length === 0) return;
    try {
      const reply = await this.o.link.call({ type: 'renew-lease', actorId: this.o.actorId, leaseIds: held.map((j) => j.leaseId) }, { timeoutMs: Math.max(1000, this.leaseMs / 3), schema: renewReply });
      this.leaseMs = reply.leaseMs;
      for (const id of reply.lost) {
        const job = this.jobs.get(id);
        if (job === undefined || job.why !== null) continue;
        this.counters.leases_lost++;
        job.why = 'lost';
        job.abort.abort();
      }
    } catch (err) {
      this.o.log(`renewing leases failed: ${String(err)}`);
    }
  }
}
