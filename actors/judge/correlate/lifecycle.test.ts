import { describe, expect, it } from 'vitest';
import { Correlator } from './correlator.js';
import { asst, kinds, rec, sys, user } from './fixtures.js';
import type { SavedSession } from './state.js';
import type { CorrelationEvent, CorrelationRecord } from './types.js';

const S = sys('You are a helpful agent.');
const warnings = (ev: readonly CorrelationEvent[]): string[] => ev.flatMap((e) => (e.kind === 'warning' ? [e.code] : []));

/** A one-request conversation: opens a session that nothing will extend. */
const lone = (id: string, at: number, o: { session?: string; scenario?: string; keyId?: string } = {}): CorrelationRecord => rec(id, [S, user(`q ${id}`)], `a ${id}`, { at, ...o });

describe('TTL', () => {
  it('closes a session idle for more than sessionTtlS and drops its pending turn', () => {
    const c = new Correlator({ sessionTtlS: 60 });
    c.observe(lone('a', 0, { session: 'a' }));
    expect(c.tick(60_000)).toEqual([]);
    const ev = c.tick(60_001);
    expect(ev).toEqual([
      { kind: 'turn-dropped', sessionKey: 'tag:a', scenario: 'default', turnRecordId: 'a', reason: 'expired' },
      { kind: 'session-closed', sessionKey: 'tag:a', scenario: 'default', reason: 'expired' },
    ]);
    expect(c.openSessions).toBe(0);
    // The tag comes back: a new session, nothing bound to the expired one.
    expect(kinds(c.observe(rec('b', [S, user('q a'), asst('a a'), user('more')], 'x', { session: 'a', at: 70_000 })))).toEqual(['opened']);
  });

  it('measures idleness from the last request, on the clock of record times', () => {
    const c = new Correlator({ sessionTtlS: 60 });
    c.observe(rec('r1', [S, user('hi')], 'hello', { at: 0 }));
    c.observe(rec('r2', [S, user('hi'), asst('hello'), user('more')], 'x', { at: 50_000 }));
    // A record that finished earlier than the clock (out of commit order) does not move it back:
    // its session is as old as the clock (50 s), not 10 s.
    c.observe(lone('z', 10_000));
    expect(c.tick(100_000)).toEqual([]);
    const closed = c.tick(110_001).flatMap((e) => (e.kind === 'session-closed' ? [e.sessionKey] : []));
    expect(closed).toEqual(['chain:r1', 'chain:z']);
  });

  it('takes the time from an injected clock', () => {
    let t = 0;
    const c = new Correlator({ sessionTtlS: 1, now: () => t });
    c.observe(lone('a', 999_999));
    t = 2000;
    expect(kinds(c.observe(lone('b', 0)))).toEqual(['turn-dropped', 'session-closed', 'opened']);
  });
});

describe('retried turns that nothing extends', () => {
  it('count one dropped turn, as in tag mode: a retry is no reason to lose the conversation’s last turn from the counts', () => {
    const untagged = new Correlator({ sessionTtlS: 60 });
    untagged.observe(rec('r1', [S, user('hi')], 'hello', { at: 0 }));
    untagged.observe(rec('r1b', [S, user('hi')], 'hey', { at: 1000 }));
    const ev = untagged.tick(100_000);
    // The client went on from neither reply; the retry (the reply it most likely kept) is the lost turn.
    expect(ev.filter((e) => e.kind === 'turn-dropped').map((e) => e.kind === 'turn-dropped' && e.turnRecordId)).toEqual(['r1b']);
    expect(untagged.counters()).toMatchObject({ retries: 1, bound: 0, dropped_unbound: 1 });

    const tagged = new Correlator({ sessionTtlS: 60 });
    tagged.observe(rec('r1', [S, user('hi')], 'hello', { at: 0, session: 'a' }));
    tagged.observe(rec('r1b', [S, user('hi')], 'hey', { at: 1000, session: 'a' }));
    tagged.tick(100_000);
    expect(tagged.counters()).toMatchObject({ retries: 1, bound: 0, dropped_unbound: 1 });
  });

  it('count none once the client went on from either reply', () => {
    for (const kept of ['hello', 'hey']) {
      const c = new Correlator({ sessionTtlS: 60 });
      c.observe(rec('r1', [S, user('hi')], 'hello', { at: 0 }));
      c.observe(rec('r1b', [S, user('hi')], 'hey', { at: 1000 }));
      c.observe(rec('r2', [S, user('hi'), asst(kept), user('ok')], 'k', { at: 2000 }));
      c.observe(rec('r3', [S, user('hi'), asst(kept), user('ok'), asst('k'), user('bye')], 'bye', { at: 3000 }));
      const ev = c.tick(100_000);
      // Only the conversation's last turn is lost; the reply the client did not keep was a retry.
      expect(ev.filter((e) => e.kind === 'turn-dropped').map((e) => e.kind === 'turn-dropped' && e.turnRecordId)).toEqual(['r3']);
      expect(c.counters()).toMatchObject({ retries: 1, bound: 2, dropped_unbound: 1 });
    }
  });
});

describe('eviction', () => {
  it('evicts the least recently active sessions above maxOpenSessions and drops their turns', () => {
    const c = new Correlator({ maxOpenSessions: 2 });
    c.observe(rec('a1', [S, user('a')], 'ra', { at: 0 }));
    c.observe(rec('b1', [S, user('b')], 'rb', { at: 1 }));
    // a is touched, so b becomes the least recently active.
    c.observe(rec('a2', [S, user('a'), asst('ra'), user('a again')], 'ra2', { at: 2 }));
    const ev = c.observe(rec('c1', [S, user('c')], 'rc', { at: 3 }));
    expect(ev.filter((e) => e.kind !== 'warning')).toEqual([
      { kind: 'opened', sessionKey: 'chain:c1', scenario: 'default', recordId: 'c1' },
      { kind: 'turn-dropped', sessionKey: 'chain:b1', scenario: 'default', turnRecordId: 'b1', reason: 'evicted' },
      { kind: 'session-closed', sessionKey: 'chain:b1', scenario: 'default', reason: 'evicted' },
    ]);
    expect(c.counters()).toMatchObject({ evicted: 1, dropped_unbound: 1, bound: 1 });
    expect(c.sessions().map((s) => s.key)).toEqual(['chain:a1', 'chain:c1']);
    // The evicted session's continuation finds nothing to extend.
    expect(kinds(c.observe(rec('b2', [S, user('b'), asst('rb'), user('b again')], 'x', { at: 4 })))).toContain('opened');
  });
});

describe('eviction between tenants', () => {
  it('a scenario that floods more sessions than the cap evicts only its own: another scenario\'s session still binds', () => {
    const c = new Correlator({ maxOpenSessions: 8 });
    c.observe(rec('a1', [S, user('mine')], 'ra', { at: 0, session: 'a', scenario: 'alpha' }));
    const flood = Array.from({ length: 50 }, (_, i) => c.observe(lone(`b${i}`, 1 + i, { session: `b${i}`, scenario: 'beta' }))).flat();
    expect(flood.filter((e) => e.kind === 'session-closed').every((e) => e.scenario === 'beta')).toBe(true);
    expect(c.counters().evicted).toBe(43);
    expect(c.openSessions).toBe(8);
    const ev = c.observe(rec('a2', [S, user('mine'), asst('ra'), user('thanks')], 'x', { at: 100, session: 'a', scenario: 'alpha' }));
    expect(ev.filter((e) => e.kind === 'turn-finished').map((e) => e.kind === 'turn-finished' && e.turnRecordId)).toEqual(['a1']);
  });

  it('so does another API key in the same scenario, untagged too: the tenant holding the most gives way, its oldest session first', () => {
    const c = new Correlator({ maxOpenSessions: 4 });
    c.observe(rec('a1', [S, user('mine')], 'ra', { at: 0, keyId: 'aaaa0001' }));
    c.observe(rec('a9', [S, user('other of mine')], 'r9', { at: 1, keyId: 'aaaa0001' }));
    for (let i = 0; i < 20; i++) c.observe(lone(`b${i}`, 2 + i, { keyId: 'bbbb0002' }));
    // Four open: A's two, B's two newest (B held the most at each eviction).
    expect(c.sessions().map((s) => s.pendingTurnId)).toEqual(['a1', 'a9', 'b18', 'b19']);
    // Even at an equal share, B's next sessions push out B's own.
    c.observe(lone('b20', 30, { keyId: 'bbbb0002' }));
    c.observe(lone('b21', 31, { keyId: 'bbbb0002' }));
    expect(c.sessions().map((s) => s.pendingTurnId)).toEqual(['a1', 'a9', 'b20', 'b21']);
    const ev = c.observe(rec('a2', [S, user('mine'), asst('ra'), user('thanks')], 'x', { at: 40, keyId: 'aaaa0001' }));
    expect(ev.filter((e) => e.kind === 'turn-finished').map((e) => e.kind === 'turn-finished' && e.turnRecordId)).toEqual(['a1']);
  });

  it('the tenants are rebuilt from a saved state', () => {
    const c = new Correlator({ maxOpenSessions: 3 });
    c.observe(rec('a1', [S, user('mine')], 'ra', { at: 0, session: 'a', scenario: 'alpha' }));
    c.observe(lone('b0', 1, { session: 'b0', scenario: 'beta' }));
    const resumed = Correlator.fromJSON(c.toJSON(), { maxOpenSessions: 3 });
    for (let i = 1; i < 10; i++) resumed.observe(lone(`b${i}`, 1 + i, { session: `b${i}`, scenario: 'beta' }));
    expect(resumed.sessions().filter((s) => s.scenario === 'alpha').map((s) => s.pendingTurnId)).toEqual(['a1']);
  });
});

describe('warnings', () => {
  it('warns once when untagged traffic first appears, and logs it', () => {
    const lines: string[] = [];
    const c = new Correlator({ log: (l) => lines.push(l) });
    expect(warnings(c.observe(lone('t', 0, { session: 's' })))).toEqual([]);
    expect(warnings(c.observe(lone('u1', 1)))).toEqual(['untagged-traffic']);
    expect(warnings(c.observe(lone('u2', 2)))).toEqual([]);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain('untagged-traffic');
  });

  it('warns once when evictions start', () => {
    const c = new Correlator({ maxOpenSessions: 1 });
    expect(warnings(c.observe(lone('a', 0, { session: 'a' })))).toEqual([]);
    expect(warnings(c.observe(lone('b', 1, { session: 'b' })))).toEqual(['evictions']);
    expect(warnings(c.observe(lone('c', 2, { session: 'c' })))).toEqual([]);
    expect(c.counters().evicted).toBe(2);
  });

  it('warns about unbound turns at 8 drops exceeding bound, then at most every 300 s', () => {
    const c = new Correlator({ sessionTtlS: 1 });
    const fired: number[] = [];
    let t = 0;
    // Each lone request expires on the next one (2 s later): one more dropped turn each time.
    for (let i = 0; i < 9; i++) {
      t += 2000;
      if (warnings(c.observe(lone(`r${i}`, t, { session: `s${i}` }))).includes('unbound-turns')) fired.push(c.counters().dropped_unbound);
    }
    expect(fired).toEqual([8]);
    // Still above the line: silent until 300 s after the first warning.
    const firstAt = t;
    expect(warnings(c.tick(firstAt + 299_999))).toEqual([]);
    expect(warnings(c.tick(firstAt + 300_000))).toEqual(['unbound-turns']);
    expect(warnings(c.tick(firstAt + 300_001))).toEqual([]);
  });

  it('does not warn with fewer than 8 drops, nor while bound ≥ dropped', () => {
    const few = new Correlator({ sessionTtlS: 1 });
    for (let i = 0; i < 8; i++) expect(warnings(few.observe(lone(`r${i}`, i * 2000, { session: `s${i}` })))).not.toContain('unbound-turns');
    expect(few.counters().dropped_unbound).toBe(7);

    // 8 sessions of 2 requests each: 8 bound turns and, once they expire, 8 dropped.
    const healthy = new Correlator({ sessionTtlS: 1 });
    const seen: string[] = [];
    for (let i = 0; i < 8; i++) {
      const tag = { session: `s${i}` };
      seen.push(...warnings(healthy.observe(rec(`a${i}`, [S, user(`q${i}`)], 'x', { at: i * 2000, ...tag }))));
      seen.push(...warnings(healthy.observe(rec(`b${i}`, [S, user(`q${i}`), asst('x'), user('ok')], 'y', { at: i * 2000 + 1, ...tag }))));
    }
    seen.push(...warnings(healthy.tick(100_000)));
    expect(healthy.counters()).toMatchObject({ bound: 8, dropped_unbound: 8 });
    expect(seen).toEqual([]);
    // One more drop tips it over.
    healthy.observe(lone('z', 200_000, { session: 'z' }));
    expect(warnings(healthy.tick(300_000))).toEqual(['unbound-turns']);
  });
});

describe('state', () => {
  /** A mixed stream: tagged and untagged chains, a retry, a side request, expiry and eviction. */
  function stream(): CorrelationRecord[] {
    const out: CorrelationRecord[] = [];
    let at = 0;
    for (let conv = 0; conv < 12; conv++) {
      const tagged = conv % 2 === 0;
      const msgs = [S, user(`conv ${conv % 5}`)];
      for (let turn = 0; turn < 4; turn++) {
        at += 7000;
        const reply = `reply ${conv}.${turn}`;
        const o = { at, ...(tagged ? { session: `c${conv}` } : {}) };
        out.push(rec(`c${conv}t${turn}`, [...msgs], reply, o));
        if (turn === 1 && conv % 3 === 0) out.push(rec(`c${conv}t${turn}retry`, [...msgs], `${reply}'`, o));
        if (turn === 2 && tagged) out.push(rec(`c${conv}title`, [sys('title'), user('x')], 'T', o));
        msgs.push(asst(turn === 1 && conv % 3 === 0 ? `${reply}'` : reply), user(`next ${turn}`));
      }
    }
    return out;
  }

  it('serialise → restore → continue gives the same events as an uninterrupted run', () => {
    const records = stream();
    const options = { sessionTtlS: 60, maxOpenSessions: 3 };
    const whole = new Correlator(options);
    const expected = records.flatMap((r) => whole.observe(r));
    for (const cut of [1, 9, 20, records.length - 1]) {
      let c = new Correlator(options);
      const got: CorrelationEvent[] = [];
      records.forEach((r, i) => {
        if (i === cut) c = Correlator.fromJSON(JSON.parse(JSON.stringify(c.toJSON())), options);
        got.push(...c.observe(r));
      });
      expect(got).toEqual(expected);
      expect(c.toJSON()).toEqual(whole.toJSON());
    }
    expect(expected.some((e) => e.kind === 'turn-finished')).toBe(true);
    expect(whole.counters()).toMatchObject({ retries: 4, side: 6, evicted: expect.any(Number) });
    expect(whole.counters().evicted).toBeGreaterThan(0);
  });

  /**
   * Feeds `records`, keeping a copy of the sessions as the judge keeps its rows (one per session, by
   * map key) from `changes()` alone, and checks after each record that the copy and `head()` are the
   * whole state. Answers how many session rows were written.
   */
  function savedCopyFollows(c: Correlator, records: readonly CorrelationRecord[], tickEvery = 0): number {
    const rows = new Map<string, SavedSession>();
    let written = 0;
    records.forEach((r, i) => {
      c.observe(r);
      if (tickEvery > 0 && i % tickEvery === tickEvery - 1) c.tick(r.finishedAt + 30_000);
      const changes = c.changes();
      written += changes.length;
      for (const [k, s] of changes) {
        if (s === null) rows.delete(k);
        else rows.set(k, s);
      }
      c.changesSaved();
      expect(c.changes()).toEqual([]);
      expect({ ...c.head(), sessions: [...rows.values()].sort((a, b) => a[16] - b[16]) }).toEqual(c.toJSON());
    });
    return written;
  }

  it('the sessions changed since the last save bring a saved copy up to date, record by record, expiry and eviction included', () => {
    const records = stream();
    const c = new Correlator({ sessionTtlS: 60, maxOpenSessions: 3 });
    const written = savedCopyFollows(c, records, 7);
    // A record changes the sessions it touches (its own, a retry's sibling, one it closes), not every one.
    expect(written).toBeLessThan(records.length * 2);
    expect(c.counters()).toMatchObject({ retries: 4, evicted: expect.any(Number) });
  });

  it('a saved copy follows an untagged retry group whose first member is extended (the others become silent retries)', () => {
    const q = [S, user('same question')];
    const records = [rec('g1', q, 'first', { at: 0 }), rec('g2', q, 'second', { at: 1 }), rec('g3', q, 'third', { at: 2 }), rec('g4', [...q, asst('first'), user('go on')], 'more', { at: 3 })];
    const c = new Correlator();
    savedCopyFollows(c, records);
    expect(c.counters()).toMatchObject({ retries: 2, bound: 1 });
  });

  it('a restored correlator has nothing to save until it changes, then what changed', () => {
    const c = new Correlator();
    for (let i = 0; i < 5; i++) c.observe(lone(`r${i}`, i, { session: `s${i}` }));
    const resumed = Correlator.fromJSON(c.toJSON());
    expect(resumed.changes()).toEqual([]);
    resumed.observe(rec('r5', [S, user('q r2'), asst('a r2'), user('more')], 'x', { at: 10, session: 's2' }));
    expect(resumed.changes().map(([, s]) => s?.[3])).toEqual(['r5']);
    resumed.markChanged(resumed.sessionKeys());
    expect(resumed.changes()).toHaveLength(5);
  });

  it('rejects a state of another version', () => {
    expect(() => Correlator.fromJSON({ version: 2 } as never)).toThrow(/version 2/);
  });
});
