import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { conversation, interleave, reaction, replyText } from '../../test/judge/conversations.js';
import { SqliteStore } from '../gateway/store/sqlite-store.js';
import { MAX_FIELD_CHARS, renderPrompt } from '../../recipes/openclawrl/judge/prompts.js';
import { JudgeCore, PENDING_PREFIX, STATE_KEY, type JudgeOptions } from './handler.js';
import { type PendingRow, SESSION_PREFIX, sessionRowKey } from './saved-state.js';

let dir: string;
let store: SqliteStore;
let clock: number;
const logs: string[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-judge-'));
  store = SqliteStore.open(join(dir, 'records.sqlite'));
  clock = 1_000_000;
  logs.length = 0;
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

async function core(over: Partial<JudgeOptions> = {}): Promise<JudgeCore> {
  const c = new JudgeCore({
    store,
    mode: 'judge',
    correlator: { sessionTtlS: 3600, maxOpenSessions: 100 },
    maxHintCandidates: 2,
    leaseMs: 1000,
    now: () => clock,
    log: (l) => logs.push(l),
    ...over,
  });
  await c.start();
  return c;
}

async function write(records: ReturnType<typeof conversation>): Promise<void> {
  for (const r of records) await store.append(r);
}

/** The test's store with some methods replaced (a full disk, a held lock). */
function storeWith(over: Partial<JudgeOptions['store']>): JudgeOptions['store'] {
  return {
    readFrom: (o, n) => store.readFrom(o, n),
    get: (id) => store.get(id),
    getOffset: (c) => store.getOffset(c),
    getState: (k) => store.getState(k),
    headOffset: () => store.headOffset(),
    commitConsumer: (c, o, k, s, r) => store.commitConsumer(c, o, k, s, r),
    statesWithPrefix: (p) => store.statesWithPrefix(p),
    appendJudgedTurn: (t) => store.appendJudgedTurn(t),
    judgedTurnIds: (ids) => store.judgedTurnIds(ids),
    ...over,
  };
}

type Lease = [id: string, leaseId: string | null, actorId: string | null];

type V3 = { version: 3; correlator: object; pending: Lease[]; counters: unknown };

/**
 * Rewrites the saved state as a version 3 judge saved it: the pending turns' order and leases in
 * the state, their rows the bare events. Returns the offset it was saved at.
 */
async function downgradeToV3(): Promise<{ v3: V3; offset: number }> {
  const v4 = (await store.getState(STATE_KEY)) as { version: 4; correlator: object; counters: unknown };
  expect(v4.version).toBe(4);
  const rows = (await store.statesWithPrefix(PENDING_PREFIX)).map(([k, v]) => [k, v as PendingRow] as const).sort((x, y) => x[1].seq - y[1].seq);
  const v3: V3 = { version: 3, correlator: v4.correlator, counters: v4.counters, pending: rows.map(([, r]) => [r.turn.turnRecordId, r.leaseId, r.actorId]) };
  const offset = await store.getOffset('judge');
  await store.commitConsumer('judge', offset, STATE_KEY, v3, { put: rows.map(([k, r]) => [k, r.turn]), delete: [] });
  return { v3, offset };
}

/** The saved state (version 3) with its pending turns' events and its sessions, as a state saved whole held them. */
async function savedWhole(): Promise<{ v3: V3; evs: Map<string, unknown>; sessions: unknown[][] }> {
  const { v3 } = await downgradeToV3();
  const evs = new Map((await store.statesWithPrefix(PENDING_PREFIX)).map(([k, v]) => [k.slice(PENDING_PREFIX.length), v]));
  const sessions = (await store.statesWithPrefix(SESSION_PREFIX)).map(([, t]) => t as unknown[]).sort((x, y) => (x[16] as number) - (y[16] as number));
  return { v3, evs, sessions };
}

const accept = { output: '[HINT_START]Answer without any bullet lists.[HINT_END] \\boxed{1}', error: null };
const yes = { output: 'The user moved on. \\boxed{1}', error: null };
const failed = { output: null, error: 'REEF_ERR_TIMEOUT: prm timed out' };
const done = (actorId: string, leaseId: string, turnRecordId: string, score = [yes, yes, failed], hint = [accept, failed, yes]) => ({
  actorId,
  leaseId,
  turnRecordId,
  scoreCalls: score,
  hintCalls: hint,
  prm: { api: 'sglang' as const, url: 'http://prm', model: null },
  startedAt: 1,
  finishedAt: 2,
});

describe('JudgeCore', () => {
  it('turns bound turns into leases, and the first completion into a judgment and a log row', async () => {
    await write(interleave([conversation(1, 3), conversation(2, 3)]));
    const judge = await core();
    expect(await judge.pump()).toBe(6);
    expect(judge.stats()).toMatchObject({ bound: 4, pending: 4, tagged: 6, next_offset: 7 });

    const a = await judge.lease('prm-0', 0);
    expect(a.turn).toMatchObject({ context: 'Question 1.0?', reply: replyText(1, 0), nextState: { role: 'user', content: reaction(1, 0) }, sessionKey: 'tag:conv-1' });
    const r = await judge.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId));
    expect(r).toEqual({ accepted: true, offset: 1 });
    const judgment = (await store.getJudgment(a.turn!.turnRecordId)) as Record<string, unknown>;
    expect(judgment).toMatchObject({ decision: 'hint', reward: 1, teacherCandidates: ['Answer without any bullet lists.'], votesOk: 4, votesFailed: 2, actorId: 'prm-0' });
    expect((judgment.score as { outputs: unknown[] }).outputs).toEqual([yes.output, yes.output, null]);
    const [row] = await store.readJudgedTurns(1, 10);
    expect(row).toMatchObject({ turnRecordId: a.turn!.turnRecordId, decision: 'hint', reward: 1, scenario: 'default' });

    // A repeat (same or other actor) changes nothing.
    expect(await judge.complete(done('prm-1', a.leaseId!, a.turn!.turnRecordId, [failed], [failed]))).toEqual({ accepted: false, offset: null });
    expect(await store.judgedHeadOffset()).toBe(1);
    expect(judge.stats()).toMatchObject({ judged: 1, pending: 3, votes_ok: 4, votes_failed: 2, duplicate_completions: 1 });
  });

  it('a scenario flooding more sessions than max_open_sessions evicts only its own: the other scenario\'s turn still binds and is judged', async () => {
    const [a1, a2] = conversation(1, 2).map((r) => ({ ...r, scenario: 'alpha' }));
    await write([a1!]);
    await write(Array.from({ length: 300 }, (_, i) => conversation(100 + i, 1)[0]!).map((r) => ({ ...r, scenario: 'beta' })));
    await write([a2!]);
    const judge = await core({ correlator: { sessionTtlS: 3600, maxOpenSessions: 50 } });
    while ((await judge.pump()) > 0);
    expect(judge.stats()).toMatchObject({ evicted: 251, bound: 1, pending: 1, open_sessions: 50 });
    const a = await judge.lease('prm-0', 0);
    expect(a.turn).toMatchObject({ scenario: 'alpha', sessionKey: 'tag:conv-1', nextState: { content: reaction(1, 0) } });
    expect(await judge.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId))).toEqual({ accepted: true, offset: 1 });
    expect((await store.readJudgedTurns(1, 10)).map((t) => t.scenario)).toEqual(['alpha']);
  });

  it('concurrent completions of one turn: exactly one is accepted', async () => {
    await write(conversation(1, 2));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    const results = await Promise.all([judge.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId)), judge.complete(done('prm-1', 'other', a.turn!.turnRecordId))]);
    expect(results.map((x) => x.accepted).sort()).toEqual([false, true]);
    expect(await store.judgedHeadOffset()).toBe(1);
  });

  it('a lease not renewed runs out and the turn goes to another actor; renewal keeps it', async () => {
    await write(conversation(1, 3));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    const b = await judge.lease('prm-1', 0);
    expect(b.turn!.turnRecordId).not.toBe(a.turn!.turnRecordId);
    expect((await judge.lease('prm-2', 0)).turn).toBeNull();

    clock += 800;
    expect(judge.renew('prm-0', [a.leaseId!])).toEqual({ renewed: [a.leaseId], lost: [] });
    expect(judge.renew('prm-2', [b.leaseId!])).toEqual({ renewed: [], lost: [b.leaseId] });
    clock += 800; // prm-1's lease is over, prm-0's renewed one is not
    const c = await judge.lease('prm-2', 0);
    expect(c.turn!.turnRecordId).toBe(b.turn!.turnRecordId);
    expect(judge.renew('prm-1', [b.leaseId!])).toEqual({ renewed: [], lost: [b.leaseId] });
    expect(judge.stats()).toMatchObject({ redispatched: 1, leased: 2 });

    // The slow first holder finishes first: its work counts; the new holder's is ignored.
    expect((await judge.complete(done('prm-1', b.leaseId!, b.turn!.turnRecordId))).accepted).toBe(true);
    expect((await judge.complete(done('prm-2', c.leaseId!, c.turn!.turnRecordId))).accepted).toBe(false);
    expect(judge.stats()).toMatchObject({ judged: 1, late_completions: 1 });
  });

  it('refuses a completion under a lease the turn was never given, or given to another actor, and judges it later from its holder', async () => {
    await write(conversation(1, 2));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    const id = a.turn!.turnRecordId;
    // Whoever reaches the judge's mailbox could otherwise turn forged votes into rewards and hints.
    expect(await judge.complete(done('evil', 'f00dfeedf00dfeed', id))).toEqual({ accepted: false, offset: null });
    expect(await judge.complete(done('evil', a.leaseId!, id))).toEqual({ accepted: false, offset: null });
    expect(await judge.complete(done('prm-1', a.leaseId!, id))).toEqual({ accepted: false, offset: null });
    expect(judge.stats()).toMatchObject({ judged: 0, refused_completions: 3, pending: 1, leased: 1 });
    expect((await judge.complete(done('prm-0', a.leaseId!, id))).accepted).toBe(true);
    expect(judge.stats()).toMatchObject({ judged: 1, refused_completions: 3, pending: 0 });
  });

  it('a lease renewed late, before any other actor took its turn, is still its holder\'s', async () => {
    await write(conversation(1, 2));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    clock += 1500; // past leaseMs: the renewal was held up
    expect(judge.renew('prm-0', [a.leaseId!])).toEqual({ renewed: [a.leaseId], lost: [] });
    expect((await judge.lease('prm-1', 0)).turn).toBeNull();
    expect((await judge.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId))).accepted).toBe(true);
    expect(judge.stats()).toMatchObject({ judged: 1, redispatched: 0, late_completions: 0 });
  });

  it('a lease whose turn could not be read is given back at once, not held for leaseMs by an actor that never got it', async () => {
    await write(conversation(1, 2));
    let failures = 1;
    const flaky = storeWith({
      get: async (id) => {
        if (failures-- > 0) throw new Error('SQLITE_BUSY: database is locked');
        return store.get(id);
      },
    });
    const judge = await core({ store: flaky });
    await judge.pump();
    await expect(judge.lease('prm-0', 0)).rejects.toThrow('SQLITE_BUSY');
    const again = await judge.lease('prm-1', 0);
    expect(again.turn).not.toBeNull();
    expect(judge.stats()).toMatchObject({ leased: 1, redispatched: 0 });
  });

  it('a released lease is dispatched again at once, and a waiting long-poll gets it', async () => {
    await write(conversation(1, 2));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    const waiting = judge.lease('prm-1', 5000);
    expect(judge.release('prm-1', [a.leaseId!])).toEqual([]); // not prm-1's to release
    expect(judge.release('prm-0', [a.leaseId!])).toEqual([a.leaseId]);
    expect((await waiting).turn!.turnRecordId).toBe(a.turn!.turnRecordId);
  });

  it('a released turn goes to the back of the line: the turns behind it are leased first', async () => {
    await write(conversation(1, 4));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    judge.release('prm-0', [a.leaseId!]);
    const b = await judge.lease('prm-0', 0);
    expect(b.turn!.turnRecordId).not.toBe(a.turn!.turnRecordId);
    judge.release('prm-0', [b.leaseId!]);
    const leased = [(await judge.lease('prm-0', 0)).turn!.turnRecordId, (await judge.lease('prm-0', 0)).turn!.turnRecordId, (await judge.lease('prm-0', 0)).turn!.turnRecordId];
    expect(leased).toEqual([expect.any(String), a.turn!.turnRecordId, b.turn!.turnRecordId]);
    expect(new Set([...leased])).toHaveProperty('size', 3);
  });

  it('a released turn stays at the back of the line across a restart, and its lease and place are saved in its own row', async () => {
    await write(conversation(1, 5));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    judge.release('prm-0', [a.leaseId!]);
    const b = await judge.lease('prm-1', 0);
    await judge.flush();
    const rows = new Map((await store.statesWithPrefix(PENDING_PREFIX)).map(([k, v]) => [k.slice(PENDING_PREFIX.length), v as PendingRow]));
    expect(rows.get(b.turn!.turnRecordId)).toMatchObject({ leaseId: b.leaseId, actorId: 'prm-1' });
    expect(rows.get(a.turn!.turnRecordId)).toMatchObject({ leaseId: null, actorId: null });
    expect(Math.max(...[...rows.values()].map((r) => r.seq))).toBe(rows.get(a.turn!.turnRecordId)!.seq);
    expect(await store.getState(STATE_KEY)).not.toHaveProperty('pending');

    const resumed = await core();
    expect(resumed.renew('prm-1', [b.leaseId!])).toEqual({ renewed: [b.leaseId], lost: [] });
    const order = [];
    for (let i = 0; i < 3; i++) order.push((await resumed.lease('prm-2', 0)).turn!.turnRecordId);
    expect(order).toHaveLength(3);
    expect(order.at(-1)).toBe(a.turn!.turnRecordId);
    expect(order).not.toContain(b.turn!.turnRecordId);
  });

  it('resumes a version 3 state (order and leases of every pending turn in it) with the same order and leases, and rewrites its turns as rows', async () => {
    await write(conversation(1, 5));
    const before = await core();
    await before.pump();
    const a = await before.lease('prm-0', 0);
    const b = await before.lease('prm-0', 0);
    before.release('prm-0', [a.leaseId!]);
    await before.flush();
    const { v3, offset } = await downgradeToV3();
    expect(v3.pending.at(-1)).toEqual([a.turn!.turnRecordId, null, null]);
    expect(v3.pending).toContainEqual([b.turn!.turnRecordId, b.leaseId, 'prm-0']);

    const resumed = await core();
    expect(resumed.stats()).toMatchObject({ next_offset: offset, pending: 4, leased: 1 });
    await resumed.flush();
    const state = (await store.getState(STATE_KEY)) as { version: number; nextSeq: number };
    expect(state).toMatchObject({ version: 4, nextSeq: 4 });
    expect(state).not.toHaveProperty('pending');
    const rows = (await store.statesWithPrefix(PENDING_PREFIX)).map(([, v]) => v as PendingRow).sort((x, y) => x.seq - y.seq);
    expect(rows.map((r) => [r.turn.turnRecordId, r.leaseId, r.actorId])).toEqual(v3.pending);
    expect(rows.map((r) => r.seq)).toEqual([0, 1, 2, 3]);

    const again = await core();
    expect((await again.complete(done('prm-0', b.leaseId!, b.turn!.turnRecordId))).accepted).toBe(true);
    const next = [(await again.lease('prm-1', 0)).turn!.turnRecordId, (await again.lease('prm-1', 0)).turn!.turnRecordId, (await again.lease('prm-1', 0)).turn!.turnRecordId];
    expect(next.at(-1)).toBe(a.turn!.turnRecordId);
  });

  it('keeps the saved state bounded with long next states (clipped to what the PRM prompt shows), and resumes the same turns', async () => {
    // 64 turns whose next state is 300k characters: 19 MB of next state, unclipped, in every commit.
    const N = 64;
    const big = (c: number) => `${'long tool output line\n'.repeat(13_700)}end of output ${c}`;
    for (let c = 0; c < N; c++) {
      const [r1, r2] = conversation(c, 2);
      const messages = (r2!.request as { messages: { role: string; content: string }[] }).messages;
      messages[messages.length - 1] = { role: 'tool', content: big(c) };
      await write([r1!, r2!]);
    }
    const written: { put: number; deleted: number; chars: number }[] = [];
    const counting = storeWith({
      commitConsumer: async (c, o, k, s, r) => {
        written.push({ put: r?.put.length ?? 0, deleted: r?.delete.length ?? 0, chars: JSON.stringify(s).length + JSON.stringify(r?.put ?? []).length });
        await store.commitConsumer(c, o, k, s, r);
      },
    });
    const first = await core({ batch: 1000, store: counting });
    await first.pump();
    expect(first.stats()).toMatchObject({ pending: N, bound: N });
    const state = JSON.stringify(await store.getState(STATE_KEY));
    const rows = await store.statesWithPrefix(PENDING_PREFIX);
    expect(rows).toHaveLength(N);
    const saved = state.length + rows.reduce((n, [k, v]) => n + k.length + JSON.stringify(v).length, 0);
    // Each pending turn holds at most MAX_FIELD_CHARS of next state, plus its ids and keys.
    expect(saved).toBeLessThan(N * (MAX_FIELD_CHARS + 1024));
    expect(saved).toBeGreaterThan(N * (MAX_FIELD_CHARS - 1024));
    // The state row is the head alone: nothing in it grows with the pending turns.
    expect(state.length).toBeLessThan(2_000);

    const a = await first.lease('prm-0', 0);
    // Later commits write what changed: a lease writes its own turn's row, a judged turn deletes it.
    await first.flush();
    expect(written.at(-1)).toMatchObject({ put: 1, deleted: 0 });
    expect(written.at(-1)!.chars).toBeLessThan(MAX_FIELD_CHARS + 4_000);
    const content = a.turn!.nextState.content;
    expect(content.length).toBeLessThanOrEqual(MAX_FIELD_CHARS);
    expect(content).toMatch(/^long tool output line\n/);
    expect(content).toMatch(/characters left out …\]\n[\s\S]*end of output \d+$/);
    // The prompt's own clip leaves it as it is: one "left out" line, the PRM sees this very text.
    const prompt = renderPrompt('score', a.turn!);
    expect(prompt).toContain(content);
    expect(prompt.match(/characters left out/g)).toHaveLength(1);

    // A restart resumes the same turns with the same next states, and the saved lease.
    const second = await core({ batch: 1000 });
    expect(second.stats()).toMatchObject({ pending: N, leased: 1, next_offset: 2 * N + 1 });
    const again = await second.lease('prm-1', 0);
    expect(again.turn!.nextState.content).toMatch(/characters left out …\]\n[\s\S]*end of output 1$/);
    const kept = new Map(await store.statesWithPrefix(PENDING_PREFIX));
    expect((kept.get(PENDING_PREFIX + a.turn!.turnRecordId) as PendingRow).turn.nextState).toEqual(a.turn!.nextState);
    expect((await second.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId))).accepted).toBe(true);
    await second.flush();
    expect(await store.statesWithPrefix(PENDING_PREFIX)).toHaveLength(N - 1);
    const third = await core({ batch: 1000 });
    expect(third.stats()).toMatchObject({ pending: N - 1 });
  });

  it('resumes a state saved whole by an earlier judge (version 1: pending turns and sessions inside it), and moves them into rows', async () => {
    await write(interleave([conversation(1, 3), conversation(2, 2)]));
    const before = await core();
    await before.pump();
    const a = await before.lease('prm-0', 0);
    const { v3, evs, sessions } = await savedWhole();
    const v1 = { version: 1, correlator: { ...v3.correlator, sessions }, counters: v3.counters, pending: v3.pending.map(([id]) => [evs.get(id), id === a.turn!.turnRecordId ? a.leaseId : null, id === a.turn!.turnRecordId ? 'prm-0' : null]) };
    await store.commitConsumer('judge', 6, STATE_KEY, v1, { put: [], delete: [...[...evs.keys()].map((id) => PENDING_PREFIX + id), ...(await store.statesWithPrefix(SESSION_PREFIX)).map(([k]) => k)] });

    const resumed = await core();
    expect(resumed.stats()).toMatchObject({ next_offset: 6, pending: 3, bound: 3, open_sessions: 2 });
    expect(resumed.renew('prm-0', [a.leaseId!])).toEqual({ renewed: [a.leaseId], lost: [] });
    await resumed.flush();
    expect((await store.getState(STATE_KEY)) as { version: number }).toMatchObject({ version: 4 });
    expect(await store.statesWithPrefix(PENDING_PREFIX)).toHaveLength(3);
    expect(await store.statesWithPrefix(SESSION_PREFIX)).toHaveLength(2);
    const again = await core();
    expect(again.stats()).toMatchObject({ pending: 3 });
    expect((await again.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId))).accepted).toBe(true);
  });

  it('a commit writes the rows of the sessions its records touched, not every open session, and deletes those that closed', async () => {
    const at = Date.now();
    // 300 conversations open, 256 kept: the oldest 44 are evicted in the same read and never get a row.
    await write(Array.from({ length: 300 }, (_, c) => conversation(c, 1, { at })[0]!));
    const written: { state: number; sessions: string[]; deleted: string[]; pending: number }[] = [];
    const counting = storeWith({
      commitConsumer: async (c, o, k, s, r) => {
        const put = r?.put.map(([key]) => key) ?? [];
        written.push({ state: JSON.stringify(s).length, sessions: put.filter((key) => key.startsWith(SESSION_PREFIX)), deleted: r?.delete.filter((key) => key.startsWith(SESSION_PREFIX)) ?? [], pending: put.filter((key) => key.startsWith(PENDING_PREFIX)).length });
        await store.commitConsumer(c, o, k, s, r);
      },
    });
    const judge = await core({ store: counting, batch: 1000, correlator: { sessionTtlS: 60, maxOpenSessions: 256 } });
    await judge.pump();
    expect(judge.stats()).toMatchObject({ open_sessions: 256, evicted: 44 });
    expect(await store.statesWithPrefix(SESSION_PREFIX)).toHaveLength(256);
    expect(written.at(-1)!.sessions).toHaveLength(256);

    // Conversation 299 goes on: one session row and the turn it bound; the state holds no session.
    await write(conversation(299, 2, { at }).slice(1));
    await judge.pump();
    const row = sessionRowKey(`default\u0000k1d0e5f7\u0000tag:conv-299`);
    expect(written.at(-1)).toMatchObject({ sessions: [row], deleted: [], pending: 1 });
    expect(written.at(-1)!.state).toBeLessThan(1500);
    const after = new Map(await store.statesWithPrefix(SESSION_PREFIX));
    expect((after.get(row) as unknown[])[3]).toBe((await store.readFrom(301, 1))[0]!.id);
    // A lease changes no session.
    await judge.lease('prm-0', 0);
    await judge.flush();
    expect(written.at(-1)).toMatchObject({ sessions: [], deleted: [] });

    // Once every record is read, idle time closes the sessions: one commit deletes their rows.
    await judge.flush(at + 3_600_000);
    expect(written.at(-1)).toMatchObject({ sessions: [] });
    expect(written.at(-1)!.deleted).toHaveLength(256);
    expect(await store.statesWithPrefix(SESSION_PREFIX)).toEqual([]);
    expect((await core()).stats()).toMatchObject({ open_sessions: 0, pending: 1 });
  });

  it('a read undone after a failed commit still saves what was unsaved before it: sessions closed by a flush whose commit failed too stay closed', async () => {
    const at = Date.now() - 600_000;
    await write([conversation(1, 1, { at })[0]!, conversation(2, 1, { at })[0]!]);
    let failures = 0;
    const flaky = storeWith({
      commitConsumer: async (c, o, k, s, r) => {
        if (failures-- > 0) throw new Error('SQLITE_FULL: database or disk is full');
        await store.commitConsumer(c, o, k, s, r);
      },
    });
    const judge = await core({ store: flaky, correlator: { sessionTtlS: 60, maxOpenSessions: 100 } });
    await judge.pump();
    expect(await store.statesWithPrefix(SESSION_PREFIX)).toHaveLength(2);
    failures = 2;
    // The idle clock closes both sessions; the commit fails, and so does the next read's.
    await expect(judge.flush(at + 120_000)).rejects.toThrow('SQLITE_FULL');
    await write(conversation(3, 1, { at: at + 130_000 }));
    await expect(judge.pump()).rejects.toThrow('SQLITE_FULL');
    expect(await judge.pump()).toBe(1);
    const rows = await store.statesWithPrefix(SESSION_PREFIX);
    expect(rows.map(([k]) => k)).toEqual([sessionRowKey('default\u0000k1d0e5f7\u0000tag:conv-3')]);
    // A restart finds the one open session, not the two closed ones back.
    expect((await core()).stats()).toMatchObject({ open_sessions: 1, dropped_unbound: 2, next_offset: 4 });
  });

  it('a crash in a commit that evicts and binds loses no acknowledged turn and judges none twice: the restart reads the same records into the same sessions', async () => {
    await write([conversation(1, 1)[0]!, conversation(2, 1)[0]!]);
    const opts = { correlator: { sessionTtlS: 3600, maxOpenSessions: 2 } };
    const first = await core(opts);
    await first.pump();
    // Conversation 3 evicts conversation 1; conversation 2 goes on and binds its turn. The process dies in that commit.
    await write([conversation(3, 1)[0]!, conversation(2, 2)[1]!]);
    const killed = await core({ ...opts, store: storeWith({ commitConsumer: async () => Promise.reject(new Error('killed')) }) });
    await expect(killed.pump()).rejects.toThrow('killed');
    expect((await store.statesWithPrefix(SESSION_PREFIX)).map(([k]) => k).sort()).toEqual([1, 2].map((c) => sessionRowKey(`default\u0000k1d0e5f7\u0000tag:conv-${c}`)).sort());

    const second = await core(opts);
    expect(await second.pump()).toBe(2);
    expect(second.stats()).toMatchObject({ open_sessions: 2, evicted: 1, bound: 1, pending: 1 });
    expect((await store.statesWithPrefix(SESSION_PREFIX)).map(([k]) => k).sort()).toEqual([2, 3].map((c) => sessionRowKey(`default\u0000k1d0e5f7\u0000tag:conv-${c}`)).sort());
    const a = await second.lease('prm-0', 0);
    expect(a.turn).toMatchObject({ sessionKey: 'tag:conv-2', nextState: { content: reaction(2, 0) } });
    expect((await second.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId))).accepted).toBe(true);
    // Crash again before the judged turn's commit: the next start neither hands it out nor judges it again.
    const third = await core(opts);
    expect(third.stats()).toMatchObject({ pending: 0, open_sessions: 2, next_offset: 5 });
    expect((await third.lease('prm-1', 0)).turn).toBeNull();
    // The sessions came back from their rows: conversation 3 goes on and binds.
    await write(conversation(3, 2).slice(1));
    expect(await third.pump()).toBe(1);
    expect((await third.lease('prm-1', 0)).turn).toMatchObject({ sessionKey: 'tag:conv-3', nextState: { content: reaction(3, 0) } });
    expect((await store.readJudgedTurns(0, 10)).map((t) => t.turnRecordId)).toEqual([a.turn!.turnRecordId]);
  });

  it('resumes a state whose sessions are inside it (version 2), moves them into rows, and drops session rows it does not name', async () => {
    await write(interleave([conversation(1, 2), conversation(2, 1), conversation(3, 1)]));
    const before = await core();
    await before.pump();
    const { v3, sessions } = await savedWhole();
    const v2 = { version: 2, correlator: { ...v3.correlator, sessions }, pending: v3.pending, counters: v3.counters };
    // A row no session of that state has: left by a later judge, before a downgrade.
    const stray = sessionRowKey('default\u0000k1d0e5f7\u0000tag:gone');
    await store.commitConsumer('judge', 5, STATE_KEY, v2, { put: [[stray, sessions[0]]], delete: (await store.statesWithPrefix(SESSION_PREFIX)).map(([k]) => k) });

    const resumed = await core();
    expect(resumed.stats()).toMatchObject({ next_offset: 5, open_sessions: 3, pending: 1 });
    await resumed.flush();
    expect((await store.getState(STATE_KEY)) as { version: number; correlator: object }).toMatchObject({ version: 4, correlator: { clock: expect.any(Number) } });
    expect((await store.getState(STATE_KEY)) as { correlator: object }).not.toHaveProperty('correlator.sessions');
    const rows = new Map(await store.statesWithPrefix(SESSION_PREFIX));
    expect([...rows.keys()].sort()).toEqual([1, 2, 3].map((c) => sessionRowKey(`default\u0000k1d0e5f7\u0000tag:conv-${c}`)).sort());
    const again = await core();
    expect(again.stats()).toMatchObject({ open_sessions: 3, pending: 1 });
    await write(conversation(2, 2).slice(1));
    await again.pump();
    expect(again.stats()).toMatchObject({ bound: 2, pending: 2 });
  });

  it('resumes after a crash: same offset, unjudged turns pending again, judged ones not, old leases still valid', async () => {
    await write(interleave([conversation(1, 3), conversation(2, 2)]));
    const first = await core();
    await first.pump();
    const a = await first.lease('prm-0', 0);
    const b = await first.lease('prm-1', 0);
    await first.flush(); // the leases are saved
    await first.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId));
    // Crash: nothing more is saved. The completion above is in the log but not in the saved state.
    const second = await core();
    expect(second.stats()).toMatchObject({ next_offset: 6, pending: 2, bound: 3 });
    expect(await second.pump()).toBe(0);
    expect(second.renew('prm-1', [b.leaseId!])).toEqual({ renewed: [b.leaseId], lost: [] });
    expect(second.stats()).toMatchObject({ leased: 1 });
    expect((await second.complete(done('prm-1', b.leaseId!, b.turn!.turnRecordId))).accepted).toBe(true);
    const c = await second.lease('prm-2', 0);
    expect([a.turn!.turnRecordId, b.turn!.turnRecordId]).not.toContain(c.turn!.turnRecordId);
    await second.complete(done('prm-2', c.leaseId!, c.turn!.turnRecordId));
    expect((await second.lease('prm-2', 0)).turn).toBeNull();

    await write(conversation(1, 4).slice(3)); // conversation 1 goes on: one more turn
    expect(await second.pump()).toBe(1);
    const d = await second.lease('prm-0', 0);
    expect(d.turn!.nextState.content).toBe(reaction(1, 2));
    await second.complete(done('prm-0', d.leaseId!, d.turn!.turnRecordId));
    const rows = await store.readJudgedTurns(0, 100);
    expect(rows.length).toBe(4);
    expect(new Set(rows.map((r) => r.turnRecordId)).size).toBe(4);
  });

  it('a crash between reading and committing re-reads the same records into the same turns', async () => {
    await write(conversation(1, 3));
    const failing = storeWith({
      commitConsumer: async () => {
        throw new Error('disk full');
      },
    });
    const broken = await core({ store: failing });
    await expect(broken.pump()).rejects.toThrow('disk full');
    expect((await broken.lease('prm-0', 0)).turn).toBeNull(); // nothing unsaved is handed out
    const judge = await core();
    expect(await judge.pump()).toBe(3);
    expect(judge.stats()).toMatchObject({ bound: 2, pending: 2 });
  });

  it('a commit that fails once loses no turn: the retry reads the same records into the same turns', async () => {
    await write(interleave([conversation(1, 3), conversation(2, 2)]));
    let failures = 1;
    const flaky = storeWith({
      commitConsumer: async (c, o, k, s, r) => {
        if (failures-- > 0) throw new Error('SQLITE_BUSY: database is locked');
        await store.commitConsumer(c, o, k, s, r);
      },
    });
    const judge = await core({ store: flaky });
    await expect(judge.pump()).rejects.toThrow('SQLITE_BUSY');
    expect(judge.stats()).toMatchObject({ next_offset: 0, tagged: 0, bound: 0, pending: 0 });
    await judge.flush(); // the flush timer may come first: it must not save a read that was not committed
    expect(await judge.pump()).toBe(5);
    expect(judge.stats()).toMatchObject({ next_offset: 6, tagged: 5, bound: 3, pending: 3 });
    const leased = [];
    for (let t = await judge.lease('prm-0', 0); t.turn !== null; t = await judge.lease('prm-0', 0)) leased.push(t.turn.turnRecordId);
    expect(leased).toHaveLength(3);
    // A restart finds the same: the committed offset and state hold every turn.
    const again = await core();
    expect(again.stats()).toMatchObject({ next_offset: 6, bound: 3, pending: 3 });
  });

  it('an idle flush while records wait unread expires no session: a backlog binds as if read in one go', async () => {
    // Written 20 minutes ago (the judge was down), TTL 15 minutes: only the records' own times count.
    const wall = Date.now();
    const old = interleave([conversation(1, 4, { at: wall - 1_200_000 }), conversation(2, 3, { at: wall - 1_200_000 })]);
    await write(old);
    const pendingOf = async (judge: JudgeCore): Promise<string[]> => {
      const ids: string[] = [];
      for (let t = await judge.lease('prm-0', 0); t.turn !== null; t = await judge.lease('prm-0', 0)) ids.push(`${t.turn.context} → ${t.turn.nextState.content}`);
      return ids.sort();
    };
    const read = async (judge: JudgeCore, flushEach: boolean): Promise<void> => {
      while ((await judge.pump()) > 0) if (flushEach) await judge.flush(wall);
    };

    const straight = await core({ correlator: { sessionTtlS: 900, maxOpenSessions: 100 }, batch: 2 });
    await read(straight, false);
    const expected = await pendingOf(straight);
    expect(expected).toHaveLength(5);

    await store.close();
    rmSync(dir, { recursive: true, force: true });
    dir = mkdtempSync(join(tmpdir(), 'reef-judge-'));
    store = SqliteStore.open(join(dir, 'records.sqlite'));
    await write(old);
    const flushed = await core({ correlator: { sessionTtlS: 900, maxOpenSessions: 100 }, batch: 2 });
    await read(flushed, true);
    expect(await pendingOf(flushed)).toEqual(expected);
    // Once the last record is read, the idle clock is wall time again: the stale sessions expired.
    expect(flushed.stats()).toMatchObject({ bound: 5, dropped_unbound: 2, open_sessions: 0 });
  });

  it('correlate-only: sessions bind, nothing is pending or leased', async () => {
    await write(conversation(1, 3));
    const judge = await core({ mode: 'correlate-only' });
    await judge.pump();
    expect(judge.stats()).toMatchObject({ bound: 2, pending: 0 });
    expect((await judge.lease('prm-0', 0)).turn).toBeNull();
  });

  it('correlate-only after a judging run: turns left pending do not stop reading (nothing will ever judge them)', async () => {
    await write(interleave([conversation(1, 3), conversation(2, 3)]));
    const judging = await core({ maxPending: 2 });
    await judging.pump();
    expect(judging.stats()).toMatchObject({ pending: 4 });
    // The PRM is switched off; the judge restarts correlating only, with the same limit.
    await write(conversation(3, 3));
    const correlating = await core({ mode: 'correlate-only', maxPending: 2 });
    expect(await correlating.pump()).toBe(3);
    expect(correlating.stats()).toMatchObject({ next_offset: 10, bound: 6 });
  });

  it('stops reading while maxPending turns wait', async () => {
    await write(conversation(1, 3));
    await write(conversation(2, 3));
    const judge = await core({ maxPending: 2, batch: 3 });
    expect(await judge.pump()).toBe(3);
    expect(await judge.pump()).toBe(0);
    const a = await judge.lease('prm-0', 0);
    await judge.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId));
    expect(await judge.pump()).toBe(3);
  });

  it('a turn whose votes say nothing is logged as dropped and counted', async () => {
    await write(conversation(1, 2));
    const judge = await core();
    await judge.pump();
    const a = await judge.lease('prm-0', 0);
    await judge.complete(done('prm-0', a.leaseId!, a.turn!.turnRecordId, [failed, failed, failed], [failed, failed, failed]));
    expect((await store.readJudgedTurns(0, 5))[0]).toMatchObject({ decision: 'dropped', reward: 0, teacherCandidates: [] });
    expect(judge.stats()).toMatchObject({ judged: 1, dropped: 1, votes_failed: 6 });
  });

  it('forget (deletion on request) drops the deleted session\'s pending turns, its rows stay deleted after the next commit, and a later record of that session makes no deleted turn pending', async () => {
    const one = conversation(1, 4);
    await write(interleave([one.slice(0, 3), conversation(2, 3)]));
    const judge = await core();
    await judge.pump();
    expect(judge.stats()).toMatchObject({ pending: 4 });
    // A lease on one of the doomed turns is outstanding while the deletion runs.
    let held = await judge.lease('prm-0', 0);
    while (held.turn!.sessionKey !== 'tag:conv-1') held = await judge.lease('prm-0', 0);
    const counts = await store.deleteRecords({ scenario: 'default', session: 'conv-1' }, async (ids) => void (await judge.forget(ids)));
    expect(counts).toMatchObject({ records: 3, pendingJudgments: 2 });
    expect(judge.stats()).toMatchObject({ pending: 2 });
    await judge.flush();
    expect((await store.statesWithPrefix(PENDING_PREFIX)).map(([, r]) => (r as PendingRow).turn.sessionKey)).toEqual(['tag:conv-2', 'tag:conv-2']);
    // The user goes on in the same session: the turn it finishes was deleted, so nothing is judged.
    await write([one[3]!]);
    await judge.pump();
    expect(judge.stats()).toMatchObject({ pending: 2 });
    // The held lease's completion is answered as of an unknown turn.
    expect(await judge.complete(done('prm-0', held.leaseId!, held.turn!.turnRecordId))).toEqual({ accepted: false, offset: null });
  });

  it('a pending turn whose record was deleted while the judge was not told is dropped at its lease, with its row, instead of failing every lease', async () => {
    await write(interleave([conversation(1, 2), conversation(2, 2)]));
    const judge = await core();
    await judge.pump();
    expect(judge.stats()).toMatchObject({ pending: 2 });
    // The judge was not running: nobody called forget.
    await store.deleteRecords({ scenario: 'default', session: 'conv-1' }, async () => {});
    const a = await judge.lease('prm-0', 0);
    expect(a.turn!.sessionKey).toBe('tag:conv-2');
    expect(judge.stats()).toMatchObject({ pending: 1 });
    expect((await judge.lease('prm-1', 0)).turn).toBeNull();
    await judge.flush();
    expect((await store.statesWithPrefix(PENDING_PREFIX)).map(([, r]) => (r as PendingRow).turn.sessionKey)).toEqual(['tag:conv-2']);
  });
});
