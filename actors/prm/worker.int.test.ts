import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { waitFor } from '../../test/helpers/wait.js';
import { conversation } from '../../test/judge/conversations.js';
import { SqliteStore } from '../gateway/store/sqlite-store.js';
import { JudgeCore } from '../judge/handler.js';
import { type JudgeMessage, judgeMessages } from '../judge/messages.js';
import { ReefError } from '../runtime/errors.js';
import { type Handlers, Mailbox } from '../runtime/mailbox.js';
import type { PrmCaller } from './prm-client.js';
import { JudgeLink, PrmWorker } from './worker.js';

/**
 * A PRM worker against a real judge mailbox (JudgeCore over a real store, real sockets) and a fake
 * PRM whose answers the test lets through.
 */

let dir: string;
let store: SqliteStore;
let core: JudgeCore | null;
let mailbox: Mailbox<typeof judgeMessages> | null;
let worker: PrmWorker | null;
const logs: string[] = [];
const log = (l: string): void => void logs.push(l);

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-prm-'));
  store = SqliteStore.open(join(dir, 'records.sqlite'));
  core = null;
  mailbox = null;
  worker = null;
  logs.length = 0;
});
afterEach(async () => {
  core?.close(); // answers the worker's long-poll, so that its drain does not wait it out
  await worker?.drain(0);
  await mailbox?.close();
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A judge mailbox as `startJudge` wires it, with some handlers replaced. */
async function judge(leaseMs: number, over: (c: JudgeCore) => Partial<Handlers<JudgeMessage>> = () => ({})): Promise<JudgeCore> {
  const c = new JudgeCore({ store, mode: 'judge', correlator: { sessionTtlS: 3600, maxOpenSessions: 100 }, maxHintCandidates: 2, leaseMs, log });
  await c.start();
  core = c;
  mailbox = await Mailbox.open({
    name: 'judge',
    schema: judgeMessages,
    handlers: {
      'judge-status': () => ({ stats: c.stats() }),
      'lease-turn': async (msg) => ({ ...(await c.lease(msg.actorId, msg.waitMs)), mode: c.mode }),
      'renew-lease': (msg) => ({ ...c.renew(msg.actorId, msg.leaseIds), leaseMs: c.leaseMs }),
      'release-lease': (msg) => ({ released: c.release(msg.actorId, msg.leaseIds) }),
      'complete-turn': (msg) => c.complete(msg),
      ...over(c),
    },
  });
  return c;
}

async function turns(records: ReturnType<typeof conversation>): Promise<void> {
  for (const r of records) await store.append(r);
  await core!.pump();
}

/** A PRM that answers `\boxed{1}` once `open()` is called (at once with `open: true`), or fails when aborted. */
function fakePrm(o: { open: boolean }): PrmCaller & { open(): void } {
  let release!: () => void;
  const gate = o.open ? Promise.resolve() : new Promise<void>((resolve) => (release = resolve));
  return {
    api: 'sglang',
    model: null,
    open: () => release(),
    async call(_prompt, { signal }) {
      await new Promise<void>((resolve, reject) => {
        signal?.addEventListener('abort', () => reject(new Error('aborted')));
        void gate.then(resolve);
      });
      return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
    },
    close: async () => {},
  };
}

function startWorker(prm: PrmCaller, o: { concurrency: number; waitMs: number }): PrmWorker {
  worker = new PrmWorker({ actorId: 'prm-0', link: new JudgeLink(null, mailbox!.endpoint, log), prm, m: 1, log, ...o });
  worker.start();
  return worker;
}

describe('PrmWorker against a judge mailbox', () => {
  it('renews a lease shorter than the 15 s default before it runs out, from the first lease on', async () => {
    const renewals: { renewed: string[]; lost: string[] }[] = [];
    const judged = await judge(3000, (c) => ({
      'renew-lease': (msg) => {
        const r = c.renew(msg.actorId, msg.leaseIds);
        renewals.push(r);
        return { ...r, leaseMs: c.leaseMs };
      },
    }));
    await turns(conversation(1, 2));
    const prm = fakePrm({ open: false });
    const w = startWorker(prm, { concurrency: 2, waitMs: 200 });

    // The vote outlasts the lease: only renewals keep it.
    await waitFor(() => renewals.length > 0, { what: 'a lease renewal', timeoutMs: 10_000 });
    expect(renewals[0]).toEqual({ renewed: [expect.any(String)], lost: [] });
    prm.open();
    await waitFor(() => judged.stats().judged === 1, { what: 'the turn judged' });
    expect(judged.stats()).toMatchObject({ redispatched: 0, late_completions: 0 });
    expect(w.stats()).toMatchObject({ turns_leased: 1, turns_completed: 1, leases_lost: 0 });
  }, 20_000);

  it('an error reply to one call leaves the link alone: a long-poll answered meanwhile still gets its turn', async () => {
    let leases = 0;
    let completions = 0;
    let retrying!: () => void;
    const retried = new Promise<void>((resolve) => (retrying = resolve));
    const judged = await judge(2000, (c) => ({
      'lease-turn': async (msg) => {
        const lease = await c.lease(msg.actorId, msg.waitMs);
        // The second credit's long-poll is granted its turn at once, but answered only once the
        // worker has had the error reply.
        if (++leases === 2) await retried;
        return { ...lease, mode: c.mode };
      },
      'complete-turn': async (msg) => {
        if (++completions === 1) throw new Error('SQLITE_BUSY: database is locked');
        retrying();
        return c.complete(msg);
      },
    }));
    await turns(conversation(1, 3));
    // Two credits: one turn voting, one long-poll waiting.
    const w = startWorker(fakePrm({ open: true }), { concurrency: 4, waitMs: 5000 });

    await waitFor(() => judged.stats().judged === 2, { what: 'both turns judged' });
    expect(completions).toBe(3); // the refused completion was retried once
    // The turn granted to the long-poll reached the worker: it never had to run out and go again.
    expect(judged.stats()).toMatchObject({ redispatched: 0, late_completions: 0 });
    expect(w.stats()).toMatchObject({ turns_leased: 2, turns_completed: 2 });
    expect(logs.filter((l) => l.startsWith('leasing from the judge failed'))).toEqual([]);
  }, 20_000);

  it('a turn none of whose calls reached the PRM goes back to the judge, not into the log as dropped', async () => {
    const judged = await judge(5000);
    await turns(conversation(1, 2));
    let down = true;
    let calls = 0;
    const prm: PrmCaller = {
      api: 'sglang',
      model: null,
      async call() {
        calls++;
        if (down) throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: 'http://prm', reason: 'connect ECONNREFUSED' });
        return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
      },
      close: async () => {},
    };
    const w = startWorker(prm, { concurrency: 2, waitMs: 200 });

    await waitFor(() => w.stats().leases_released >= 1, { what: 'the turn given back', timeoutMs: 10_000 });
    expect(judged.stats()).toMatchObject({ judged: 0, dropped: 0, pending: 1 });
    expect(await store.judgedHeadOffset()).toBe(0);
    // The PRM is back: the same turn is judged on its votes.
    down = false;
    await waitFor(() => judged.stats().judged === 1, { what: 'the turn judged', timeoutMs: 10_000 });
    expect(judged.stats()).toMatchObject({ judged: 1, dropped: 0 });
    expect(calls).toBeGreaterThan(2);
  }, 30_000);
  it('a PRM that fails every call (a 500 to all) keeps the turn: tried again, then given back, judged once the PRM answers', async () => {
    const judged = await judge(5000);
    await turns(conversation(1, 2));
    let broken = true;
    const rids: string[] = [];
    const prm: PrmCaller = {
      api: 'sglang',
      model: null,
      async call(_prompt, { rid }) {
        rids.push(rid);
        if (broken) throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: 'http://prm', reason: '/generate answered 500: internal error' });
        return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
      },
      close: async () => {},
    };
    const w = startWorker(prm, { concurrency: 2, waitMs: 200 });
    await waitFor(() => w.stats().leases_released >= 1, { what: 'the turn given back', timeoutMs: 15_000 });
    expect(judged.stats()).toMatchObject({ judged: 0, dropped: 0, pending: 1 });
    expect(judged.stats().released).toBeGreaterThanOrEqual(1); // seen in the judge's persisted counters (/metrics)
    expect(w.stats()).toMatchObject({ turns_failed: 0, turns_completed: 0 });
    // Three tries, then back to the judge (which may have leased it out again since).
    const tries = logs.filter((l) => l.includes('answered 500')).slice(0, 3);
    expect(tries.map((l) => /trying again \(\d of 3\)|giving the turn back/.exec(l)?.[0])).toEqual(['trying again (2 of 3)', 'trying again (3 of 3)', 'giving the turn back']);
    // Each try's calls have rids of their own (the engine keys requests and aborts by rid).
    expect(rids.slice(0, 6).map((r) => r.replace(/^.*-(score|hint)-/, '$1-').replace(/\.[0-9a-f]{8}$/, '')).sort()).toEqual(['hint-0', 'hint-0-try2', 'hint-0-try3', 'score-0', 'score-0-try2', 'score-0-try3']);
    broken = false;
    await waitFor(() => judged.stats().judged === 1, { what: 'the turn judged', timeoutMs: 15_000 });
    expect(judged.stats()).toMatchObject({ judged: 1, dropped: 0 });
  }, 40_000);

  it('a turn whose calls all fail while the PRM answers other turns is judged on its failed votes after three tries', async () => {
    const judged = await judge(5000);
    await turns(conversation(1, 2));
    await turns(conversation(2, 2));
    let failures = 0;
    const prm: PrmCaller = {
      api: 'sglang',
      model: null,
      async call(prompt) {
        if (prompt.includes('Question 1.0?')) {
          failures++;
          throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: 'http://prm', reason: '/generate answered 400: too long' });
        }
        // The other turn is answered while the first one is being tried.
        await waitFor(() => failures > 0, { what: 'a failed call of the first turn' });
        return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
      },
      close: async () => {},
    };
    const w = startWorker(prm, { concurrency: 4, waitMs: 200 });
    await waitFor(() => judged.stats().judged === 2 && w.stats().turns_completed === 2, { what: 'both turns judged', timeoutMs: 15_000 });
    expect(judged.stats()).toMatchObject({ judged: 2, dropped: 1, votes_failed: 2 }); // the last try's calls
    expect(failures).toBe(3 * 2);
    expect(w.stats()).toMatchObject({ turns_failed: 1, turns_prm_failing: 0, leases_released: 0 });
  }, 40_000);
  it('a turn the PRM keeps failing on does not hold up the turns behind it, even for an actor of one credit', async () => {
    const judged = await judge(5000);
    await turns(conversation(1, 2));
    await turns(conversation(2, 2));
    const prm: PrmCaller = {
      api: 'sglang',
      model: null,
      async call(prompt) {
        if (prompt.includes('Question 1.0?')) throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: 'http://prm', reason: '/generate answered 400: too long' });
        return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
      },
      close: async () => {},
    };
    const w = startWorker(prm, { concurrency: 2, waitMs: 200 });
    expect(w.credits).toBe(1);
    await waitFor(() => judged.stats().judged >= 1, { what: 'the second turn judged', timeoutMs: 15_000 });
    expect(judged.stats()).toMatchObject({ judged: 1, dropped: 0, pending: 1 });
    expect(judged.stats().released).toBe(1);
    // Leased again after the PRM answered the other turn: its own prompt is what fails.
    await waitFor(() => judged.stats().judged === 2 && w.stats().turns_failed === 1, { what: 'the first turn judged on its failed votes', timeoutMs: 15_000 });
    expect(judged.stats()).toMatchObject({ judged: 2, dropped: 1, pending: 0, released: 1 });
  }, 40_000);
  it('votes the judge does not take for a few seconds (a restart, a busy store) are offered again, not cast again', async () => {
    let refusals = 0;
    let until = Number.POSITIVE_INFINITY;
    const judged = await judge(5000, (c) => ({
      'complete-turn': async (msg) => {
        if (until === Number.POSITIVE_INFINITY) until = Date.now() + 3000;
        if (Date.now() < until) {
          refusals++;
          throw new Error('SQLITE_BUSY: database is locked');
        }
        return c.complete(msg);
      },
    }));
    await turns(conversation(1, 2));
    let calls = 0;
    const prm: PrmCaller = {
      api: 'sglang',
      model: null,
      async call() {
        calls++;
        return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
      },
      close: async () => {},
    };
    const w = startWorker(prm, { concurrency: 2, waitMs: 200 });
    await waitFor(() => judged.stats().judged === 1 && w.stats().turns_completed === 1, { what: 'the turn judged', timeoutMs: 15_000 });
    expect(refusals).toBeGreaterThanOrEqual(4);
    expect(calls).toBe(2); // voted once
    expect(judged.stats()).toMatchObject({ judged: 1, redispatched: 0 });
  }, 30_000);
  it('a PRM that stays unreachable is asked less and less often, and as often as before once it answers', async () => {
    const judged = await judge(5000);
    await turns(conversation(1, 3));
    let down = true;
    const prm: PrmCaller = {
      api: 'sglang',
      model: null,
      async call() {
        if (down) throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: 'http://prm', reason: 'connect ECONNREFUSED' });
        return { text: 'The user moved on. \\boxed{1}', url: 'http://prm' };
      },
      close: async () => {},
    };
    const pauses = (): number[] => logs.map((l) => /giving the turn back in (\d+) ms/.exec(l)?.[1]).filter((p) => p !== undefined).map(Number);
    startWorker(prm, { concurrency: 2, waitMs: 200 });
    await waitFor(() => pauses().length >= 3, { what: 'three turns given back', timeoutMs: 15_000 });
    expect(pauses().slice(0, 3)).toEqual([1000, 2000, 4000]);
    down = false;
    await waitFor(() => judged.stats().judged === 2, { what: 'both turns judged', timeoutMs: 15_000 });
    const before = pauses().length;
    down = true;
    await turns(conversation(2, 2));
    await waitFor(() => pauses().length > before, { what: 'the new turn given back', timeoutMs: 15_000 });
    expect(pauses()[before]).toBe(1000);
  }, 60_000);
});
