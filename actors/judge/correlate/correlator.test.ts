import { describe, expect, it } from 'vitest';
import { Correlator, nextStateOf } from './correlator.js';
import { asst, kinds, rec, sys, tool, turns, user, type Msg } from './fixtures.js';
import type { CorrelationEvent, CorrelationRecord } from './types.js';

const S = sys('You are a helpful agent.');

function feed(c: Correlator, records: CorrelationRecord[]): CorrelationEvent[] {
  return records.flatMap((r) => c.observe(r));
}

describe('tag mode', () => {
  it('binds requests of one tag in arrival order; the newest message is the next state', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('r2', [S, user('hi'), asst('hello'), user('thanks, now 2+2?')], '4', { session: 'a' }),
      rec('r3', [S, user('hi'), asst('hello'), user('thanks, now 2+2?'), asst('4'), user('wrong, redo')], '5', { session: 'a' }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: thanks, now 2+2?', 'r2→r3: wrong, redo']);
    expect(ev.filter((e) => e.kind === 'turn-finished').every((e) => e.kind === 'turn-finished' && e.sessionKey === 'tag:a' && e.nextState.role === 'user')).toBe(true);
    expect(c.counters()).toMatchObject({ tagged: 3, untagged: 0, bound: 2, dropped_unbound: 0 });
  });

  it('keeps the chain across a history rewrite (compaction) without text matching', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('long task')], 'step 1', { session: 'a' }),
      rec('r2', [S, user('long task'), asst('step 1'), user('go on')], 'step 2', { session: 'a' }),
      rec('r3', [S, user('summary: steps 1-2 done'), user('and finish')], 'done', { session: 'a' }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: go on', 'r2→r3: and finish']);
    expect(ev.filter((e) => e.kind === 'continued').map((e) => e.kind === 'continued' && e.how)).toEqual(['extends', 'rewrite']);
  });

  it('keeps tags of different scenarios and different tags apart', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('a1', [S, user('x')], 'y', { session: 's', scenario: 'one' }),
      rec('b1', [S, user('x')], 'y', { session: 's', scenario: 'two' }),
      rec('c1', [S, user('x')], 'y', { session: 't', scenario: 'one' }),
      rec('b2', [S, user('x'), asst('y'), user('more')], 'z', { session: 's', scenario: 'two' }),
    ]);
    expect(turns(ev)).toEqual(['b1→b2: more']);
    expect(c.openSessions).toBe(3);
  });

  it('binds a tag to its API key: key B sending key A\'s tag is its own session, and A\'s turn binds only to A\'s next request', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('a1', [S, user('draft my letter')], 'Dear Sir...', { session: 'victim', keyId: 'aaaa0001' }),
      // B knows the tag and even the transcript: its "reaction" must not become A's next state.
      rec('b1', [S, user('draft my letter'), asst('Dear Sir...'), user('perfect, well done')], 'ok', { session: 'victim', keyId: 'bbbb0002' }),
      rec('a2', [S, user('draft my letter'), asst('Dear Sir...'), user('too formal, redo')], 'Hi...', { session: 'victim', keyId: 'aaaa0001' }),
    ]);
    expect(turns(ev)).toEqual(['a1→a2: too formal, redo']);
    expect(ev.filter((e) => e.kind === 'opened').map((e) => e.kind === 'opened' && e.recordId)).toEqual(['a1', 'b1']);
    expect(c.sessions().map((s) => [s.keyId, s.pendingTurnId])).toEqual([['bbbb0002', 'b1'], ['aaaa0001', 'a2']]);
  });

  it('keeps the key of saved sessions across a restore, and a state saved before key ids resumes them as keyless (null)', () => {
    const c = new Correlator();
    feed(c, [rec('a1', [S, user('hi')], 'hello', { session: 't', keyId: 'aaaa0001' })]);
    const saved = c.toJSON();
    const resumed = Correlator.fromJSON(saved);
    expect(turns(resumed.observe(rec('b2', [S, user('hi'), asst('hello'), user('great')], 'x', { session: 't', keyId: 'bbbb0002' })))).toEqual([]);
    expect(turns(resumed.observe(rec('a2', [S, user('hi'), asst('hello'), user('meh')], 'x', { session: 't', keyId: 'aaaa0001' })))).toEqual(['a1→a2: meh']);

    const old = Correlator.fromJSON({ ...saved, sessions: saved.sessions.map((t) => t.slice(0, 19) as typeof t) });
    expect(old.sessions()[0]!.keyId).toBeNull();
    expect(turns(old.observe(rec('o2', [S, user('hi'), asst('hello'), user('fine')], 'x', { session: 't', keyId: null })))).toEqual(['a1→o2: fine']);
  });

  it('treats an exact repeat as a retry whose reply the next request is judged against', () => {
    const c = new Correlator();
    const first = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('r1b', [S, user('hi')], 'hey there', { session: 'a' }),
    ]);
    expect(first.find((e) => e.kind === 'retry')).toMatchObject({ recordId: 'r1b', ofRecordId: 'r1' });
    expect(turns(c.observe(rec('r2', [S, user('hi'), asst('hey there'), user('ok')], 'k', { session: 'a' })))).toEqual(['r1b→r2: ok']);
    expect(c.counters()).toMatchObject({ retries: 1, bound: 1, dropped_unbound: 0 });

    // The client went on from the first reply instead: that one is the turn.
    const d = new Correlator();
    feed(d, [rec('r1', [S, user('hi')], 'hello', { session: 'a' }), rec('r1b', [S, user('hi')], 'hey there', { session: 'a' })]);
    expect(turns(d.observe(rec('r2', [S, user('hi'), asst('hello'), user('ok')], 'k', { session: 'a' })))).toEqual(['r1→r2: ok']);
  });

  it('a retry over an edited history is a retry: the retried turn is not judged against its own question', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('r2', [S, user('hi'), asst('hello'), user('2+2?')], '4', { session: 'a' }),
      // The client never saw r2's reply and asks again, with a note added to the history.
      rec('r2b', [S, user('hi'), asst('hello'), sys('Note: answer briefly.'), user('2+2?')], 'four', { session: 'a' }),
      rec('r3', [S, user('hi'), asst('hello'), sys('Note: answer briefly.'), user('2+2?'), asst('four'), user('thanks')], 'np', { session: 'a' }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: 2+2?', 'r2b→r3: thanks']);
    expect(ev.find((e) => e.kind === 'retry')).toMatchObject({ recordId: 'r2b', ofRecordId: 'r2' });
    expect(c.counters()).toMatchObject({ bound: 2, retries: 1, dropped_unbound: 0 });

    // The same newest message right after the pending reply is an answer to it (a rewritten history
    // where the user said the same thing again).
    const d = new Correlator();
    const again = feed(d, [
      rec('r1', [S, user('go on')], 'part 1', { session: 'a' }),
      rec('r2', [S, user('summary: part 1 written'), asst('part 1'), user('go on')], 'part 2', { session: 'a' }),
    ]);
    expect(turns(again)).toEqual(['r1→r2: go on']);
  });

  it('takes a tool result as the next state and skips system reminders after it', () => {
    const c = new Correlator();
    const call = { id: 'call_1', type: 'function', function: { name: 'ls', arguments: '{"path":"/"}' } };
    const ev = feed(c, [
      rec('r1', [S, user('list /')], asst('', { tool_calls: [call] }), { session: 'a' }),
      rec('r2', [S, user('list /'), asst('', { tool_calls: [call] }), tool('bin etc', 'call_1'), sys('reminder')], 'bin and etc', { session: 'a' }),
    ]);
    const t = ev.find((e) => e.kind === 'turn-finished');
    expect(t).toMatchObject({ turnRecordId: 'r1', nextStateRecordId: 'r2', nextState: { role: 'tool', content: 'bin etc' } });
  });

  it('parallel tool calls: the next state holds every result, not only the last', () => {
    const c = new Correlator();
    const calls = [
      { id: 'call_1', type: 'function', function: { name: 'cat', arguments: '{"path":"/etc/hostnme"}' } },
      { id: 'call_2', type: 'function', function: { name: 'ls', arguments: '{"path":"/"}' } },
    ];
    const reply = asst('', { tool_calls: calls });
    const ev = feed(c, [
      rec('r1', [S, user('what host is this, and what is in /?')], reply, { session: 'a' }),
      rec('r2', [S, user('what host is this, and what is in /?'), reply, tool('cat: /etc/hostnme: No such file or directory', 'call_1'), tool('bin etc', 'call_2')], 'x', { session: 'a' }),
    ]);
    const t = ev.find((e) => e.kind === 'turn-finished');
    // The failed first call is what the PRM must see; the last result alone reads as a success.
    expect(t).toMatchObject({ turnRecordId: 'r1', nextState: { role: 'tool', content: '[tool cat]\ncat: /etc/hostnme: No such file or directory\n\n[tool ls]\nbin etc' } });
    // Untagged, and after a rewrite (no position to go by), the same.
    const d = new Correlator();
    const untagged = feed(d, [
      rec('u1', [S, user('what host is this, and what is in /?')], reply),
      rec('u2', [S, user('what host is this, and what is in /?'), reply, tool('cat: /etc/hostnme: No such file or directory', 'call_1'), tool('bin etc', 'call_2')], 'x'),
    ]);
    expect(untagged.find((e) => e.kind === 'turn-finished')).toMatchObject({ nextState: (t as { nextState: unknown }).nextState });
    expect(nextStateOf([S, user('q'), reply, tool('no such file', 'call_1'), sys('reminder'), tool('bin etc', 'call_2')], -1)).toEqual({
      role: 'tool',
      content: '[tool cat]\nno such file\n\n[tool ls]\nbin etc',
    });
  });

  it('takes every user message between the reply and the next assistant message (one whose request failed, then another)', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('write a haiku')], 'old pond / frog jumps', { session: 'a' }),
      // r2 (asking "shorter lines please") failed, so the client's next request carries both messages.
      rec('r3', [S, user('write a haiku'), asst('old pond / frog jumps'), user('shorter lines please'), user('hello? still there?')], 'yes', { session: 'a' }),
    ]);
    expect(ev.find((e) => e.kind === 'turn-finished')).toMatchObject({
      turnRecordId: 'r1',
      nextState: { role: 'user', content: '[user]\nshorter lines please\n\n[user]\nhello? still there?' },
    });
  });

  it('drops the turn when the next request brings no user or tool message', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('r2', [S, user('hi'), asst('hello'), asst('prefill')], 'x', { session: 'a' }),
    ]);
    expect(ev.find((e) => e.kind === 'turn-dropped')).toMatchObject({ turnRecordId: 'r1', reason: 'no-next-state' });
    expect(c.counters()).toMatchObject({ bound: 0, dropped_unbound: 1 });
  });
});

describe('fallback (untagged)', () => {
  it('chains requests whose messages extend a session’s last request and reply', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello'),
      rec('r2', [S, user('hi'), asst('hello'), user('2+2?')], '4'),
      rec('r3', [S, user('hi'), asst('hello'), user('2+2?'), asst('4'), user('thanks')], 'welcome'),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: 2+2?', 'r2→r3: thanks']);
    expect(ev.filter((e) => e.kind === 'turn-finished').every((e) => e.kind === 'turn-finished' && e.sessionKey === 'chain:r1')).toBe(true);
    expect(c.counters()).toMatchObject({ untagged: 3, bound: 2 });
    expect(c.openSessions).toBe(1);
  });

  it('compares what a client resends: no reasoning, think blocks, parts, re-serialised arguments', () => {
    const c = new Correlator();
    const call = { id: 'c1', type: 'function', function: { name: 'f', arguments: '{"b":2,"a":1}' } };
    c.observe(rec('r1', [S, user('go')], { role: 'assistant', content: 'calling', reasoning_content: 'let me think', tool_calls: [call] }));
    const resent: Msg = {
      role: 'assistant',
      content: [{ type: 'text', text: '<think>let me think</think>\n\ncalling' }],
      tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{ "a": 1, "b": 2 }' } }],
    };
    expect(turns(c.observe(rec('r2', [S, user('go'), resent, tool('ok', 'c1')], 'done')))).toEqual(['r1→r2: ok']);
    // A changed tool call is a different reply: no binding.
    const other: Msg = { ...resent, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{"a":2,"b":2}' } }] };
    expect(kinds(c.observe(rec('r3', [S, user('go'), other, tool('ok', 'c1')], 'done')))).toEqual(['opened']);
  });

  it('binds to the longest matching prefix and requires one message after the reply', () => {
    const c = new Correlator();
    c.observe(rec('r1', [S, user('hi')], 'hello'));
    // Only the reply appended: extends nothing, opens a session.
    expect(kinds(c.observe(rec('r2', [S, user('hi'), asst('hello')], 'more')))).toEqual(['opened']);
    expect(turns(c.observe(rec('r3', [S, user('hi'), asst('hello'), asst('more'), user('and?')], 'x')))).toEqual(['r2→r3: and?']);
  });

  it('treats an exact repeat as a retry; the reply the client kept decides the turn', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { at: 0 }),
      rec('r1b', [S, user('hi')], 'hey', { at: 1000 }),
      rec('r2', [S, user('hi'), asst('hey'), user('ok')], 'k', { at: 2000 }),
    ]);
    expect(ev.find((e) => e.kind === 'retry')).toMatchObject({ recordId: 'r1b', ofRecordId: 'r1' });
    expect(turns(ev)).toEqual(['r1b→r2: ok']);
    // The retried original expires silently: it is counted as a retry, not as a lost turn.
    const later = c.tick(2000 + 901_000);
    expect(later.filter((e) => e.kind === 'turn-dropped').map((e) => e.kind === 'turn-dropped' && e.turnRecordId)).toEqual(['r2']);
    expect(c.counters()).toMatchObject({ retries: 1, bound: 1, dropped_unbound: 1 });
  });

  it('gives a tie to the most recently active session', () => {
    const c = new Correlator();
    feed(c, [
      rec('a1', [S, user('hi')], 'hello', { at: 0 }),
      rec('b1', [S, user('hi')], 'hello', { at: 10 }),
    ]);
    expect(turns(c.observe(rec('x2', [S, user('hi'), asst('hello'), user('one')], 'r', { at: 20 })))).toEqual(['b1→x2: one']);
    expect(turns(c.observe(rec('y2', [S, user('hi'), asst('hello'), user('two')], 'r', { at: 30 })))).toEqual(['a1→y2: two']);
  });

  it('binds concurrent conversations that share a system prompt and first message', () => {
    const c = new Correlator();
    const A = (n: number): Msg[] => [S, user('hi'), asst('hello A'), user('A1'), asst('ra1'), user('A2')].slice(0, n);
    const B = (n: number): Msg[] => [S, user('hi'), asst('hello B'), user('B1'), asst('rb1'), user('B2')].slice(0, n);
    const ev = feed(c, [
      rec('a1', A(2), 'hello A'),
      rec('b1', B(2), 'hello B'),
      rec('b2', B(4), 'rb1'),
      rec('a2', A(4), 'ra1'),
      rec('a3', A(6), 'ra2'),
      rec('b3', B(6), 'rb2'),
    ]);
    expect(turns(ev)).toEqual(['b1→b2: B1', 'a1→a2: A1', 'a2→a3: A2', 'b2→b3: B2']);
    expect(c.counters()).toMatchObject({ bound: 4, retries: 1 });
    expect(c.openSessions).toBe(2);
  });

  it('breaks the chain on a rewrite and leaves the pre-rewrite turn unmatched until it expires', () => {
    const c = new Correlator({ sessionTtlS: 60 });
    const ev = feed(c, [
      rec('r1', [S, user('task')], 'a', { at: 0 }),
      rec('r2', [S, user('task'), asst('a'), user('more')], 'b', { at: 1000 }),
      // Sliding window: the first exchange fell out of the transcript.
      rec('r3', [S, user('more'), asst('b'), user('finish')], 'c', { at: 2000 }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: more']);
    expect(ev[ev.length - 1]).toMatchObject({ kind: 'opened', sessionKey: 'chain:r3' });
    const expired = c.tick(62_000);
    expect(expired.filter((e) => e.kind === 'turn-dropped').map((e) => e.kind === 'turn-dropped' && [e.turnRecordId, e.reason])).toEqual([['r2', 'expired']]);
  });

  it('never matches across scenarios or onto tagged sessions', () => {
    const c = new Correlator();
    feed(c, [rec('r1', [S, user('hi')], 'hello', { scenario: 'one' }), rec('t1', [S, user('yo')], 'hey', { session: 'x' })]);
    expect(kinds(c.observe(rec('r2', [S, user('hi'), asst('hello'), user('ok')], 'k', { scenario: 'two' })))).toEqual(['opened']);
    expect(kinds(c.observe(rec('r3', [S, user('yo'), asst('hey'), user('ok')], 'k')))).toEqual(['opened']);
  });

  it('never matches another API key\'s transcript, even one that extends it exactly', () => {
    const c = new Correlator();
    feed(c, [rec('a1', [S, user('hi')], 'hello', { keyId: 'aaaa0001' })]);
    expect(kinds(c.observe(rec('b2', [S, user('hi'), asst('hello'), user('ok')], 'k', { keyId: 'bbbb0002' })))).toEqual(['opened']);
    expect(turns(c.observe(rec('a2', [S, user('hi'), asst('hello'), user('fine')], 'k', { keyId: 'aaaa0001' })))).toEqual(['a1→a2: fine']);
  });

  it('skips records that are not ok', () => {
    const c = new Correlator();
    expect(c.observe(rec('r1', [S, user('hi')], 'x', { status: 'failed' }))).toEqual([{ kind: 'skipped', recordId: 'r1', scenario: 'default', reason: 'status' }]);
    expect(c.counters()).toMatchObject({ tagged: 0, untagged: 0 });
  });
});

describe('session-done (X-Session-Done)', () => {
  it('binds the turn before it, then drops its own reply at once and frees the session, long before the TTL', () => {
    const c = new Correlator({ sessionTtlS: 3600 });
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a', at: 1_000 }),
      rec('r2', [S, user('hi'), asst('hello'), user('thanks, bye')], 'bye', { session: 'a', done: true, at: 2_000 }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: thanks, bye']);
    expect(ev.filter((e) => e.kind === 'turn-dropped' || e.kind === 'session-closed').map((e) => [e.kind, e.kind === 'turn-dropped' ? e.turnRecordId : e.sessionKey, e.reason])).toEqual([
      ['turn-dropped', 'r2', 'session-done'],
      ['session-closed', 'tag:a', 'done'],
    ]);
    expect(c.openSessions).toBe(0);
    // Not a binding failure: the unbound count (and its warning) leave it out.
    expect(c.counters()).toMatchObject({ bound: 1, dropped_unbound: 0, ended: 1 });
    // The same tag afterwards is a new conversation, not the next state of `r2`.
    const again = c.observe(rec('r3', [S, user('hi'), asst('hello'), user('thanks, bye'), asst('bye'), user('one more thing')], 'yes?', { session: 'a', at: 3_000 }));
    expect(kinds(again)).toEqual(['opened']);
    expect(turns(again)).toEqual([]);
  });

  it('on a side request ends the session and drops its pending main turn', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('f1', [sys('Flush memory'), user('hi / hello')], 'ok', { session: 'a', side: true, done: true }),
    ]);
    expect(ev.find((e) => e.kind === 'turn-dropped')).toMatchObject({ turnRecordId: 'r1', reason: 'session-done' });
    expect(c.counters()).toMatchObject({ side: 1, ended: 1, dropped_unbound: 0 });
    expect(c.openSessions).toBe(0);
  });

  it("ends only the sending key's session of that tag, and survives a saved state", () => {
    const c = new Correlator();
    feed(c, [rec('a1', [S, user('hi')], 'hello', { session: 's', keyId: 'aaaa' }), rec('b1', [S, user('hi')], 'hello', { session: 's', keyId: 'bbbb' })]);
    const resumed = Correlator.fromJSON(JSON.parse(JSON.stringify(c.toJSON())));
    const ev = resumed.observe(rec('b2', [S, user('hi'), asst('hello'), user('bye')], 'bye', { session: 's', keyId: 'bbbb', done: true }));
    expect(turns(ev)).toEqual(['b1→b2: bye']);
    expect(resumed.sessions().map((s) => [s.keyId, s.pendingTurnId])).toEqual([['aaaa', 'a1']]);
    expect(resumed.counters().ended).toBe(1);
  });
});

describe('side requests', () => {
  it('counts a tagged side request and never trains it', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('t1', [sys('Write a title'), user('hi / hello')], 'Greeting', { session: 'a', side: true }),
      rec('m1', [S, user('hi'), asst('hello'), user('remember this')], 'ok', { side: true }),
      rec('r2', [S, user('hi'), asst('hello'), user('next')], 'sure', { session: 'a' }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: next']);
    expect(ev.filter((e) => e.kind === 'side').map((e) => e.kind === 'side' && [e.recordId, e.sessionKey, e.reason])).toEqual([
      ['t1', 'tag:a', 'tagged'],
      ['m1', null, 'tagged'],
    ]);
    expect(c.counters()).toMatchObject({ side: 2, bound: 1 });
  });

  it('infers a side request in a tagged session from its different first message', () => {
    const c = new Correlator();
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('t1', [sys('Write a short title for this chat'), user('hi / hello')], 'Greeting', { session: 'a' }),
      rec('r2', [S, user('hi'), asst('hello'), user('next')], 'sure', { session: 'a' }),
    ]);
    expect(turns(ev)).toEqual(['r1→r2: next']);
    expect(ev.find((e) => e.kind === 'side')).toMatchObject({ recordId: 't1', reason: 'inferred' });
    expect(c.counters()).toMatchObject({ side: 1, bound: 1, dropped_unbound: 0 });
  });

  it('promotes a different-first-message request that the next request extends', () => {
    const c = new Correlator();
    const S2 = sys('You are a helpful agent. (v2)');
    const ev = feed(c, [
      rec('r1', [S, user('hi')], 'hello', { session: 'a' }),
      rec('r2', [S2, user('hi'), asst('hello'), user('next')], 'sure', { session: 'a' }),
      rec('r3', [S2, user('hi'), asst('hello'), user('next'), asst('sure'), user('thanks')], 'np', { session: 'a' }),
    ]);
    expect(turns(ev)).toEqual(['r2→r3: thanks']);
    expect(ev.find((e) => e.kind === 'turn-dropped')).toMatchObject({ turnRecordId: 'r1', reason: 'rewrite' });
    expect(c.counters().side).toBe(0);
  });

  it('counts an inferred side request still pending when its session closes', () => {
    const c = new Correlator({ sessionTtlS: 10 });
    feed(c, [rec('r1', [S, user('hi')], 'hello', { session: 'a' }), rec('t1', [sys('title'), user('hi')], 'T', { session: 'a' })]);
    const ev = c.tick(11_000);
    expect(kinds(ev)).toEqual(['side', 'turn-dropped', 'session-closed']);
    expect(c.counters()).toMatchObject({ side: 1, dropped_unbound: 1 });
  });

  it('binds a session whose system prompt changes on every request, once a request extends one under a new prompt', () => {
    const c = new Correlator();
    const at = (i: number): Msg => sys(`You are a helpful agent. Current time: 10:0${i}`);
    const history: Msg[] = [user('q0')];
    const ev: CorrelationEvent[] = [];
    const ask = (i: number, o: { id?: string; reply?: string } = {}): void => {
      ev.push(...c.observe(rec(o.id ?? `r${i}`, [at(i), ...history], o.reply ?? `a${i}`, { session: 'a' })));
    };
    for (let i = 0; i < 3; i++) {
      ask(i);
      history.push(asst(`a${i}`), user(`u${i}`));
    }
    // r1 came under a new prompt: held like any other first message until r2 extended it, so r0
    // is dropped as a rewrite. From then on the prompt is not compared.
    expect(turns(ev)).toEqual(['r1→r2: u1']);
    expect(ev.find((e) => e.kind === 'turn-dropped')).toMatchObject({ turnRecordId: 'r0', reason: 'rewrite' });

    const restored = Correlator.fromJSON(JSON.parse(JSON.stringify(c.toJSON())));
    ev.length = 0;
    ev.push(...restored.observe(rec('r3', [at(3), ...history], 'a3', { session: 'a' })));
    ev.push(...restored.observe(rec('r3b', [at(4), ...history], 'a3 again', { session: 'a' }))); // a retry, with a new time
    ev.push(...restored.observe(rec('t1', [sys('Write a short title'), user('q0 / a0')], 'Title', { session: 'a' }))); // still a side request
    history.push(asst('a3 again'), user('u3'));
    ev.push(...restored.observe(rec('r4', [at(5), ...history], 'a4', { session: 'a' })));
    expect(turns(ev)).toEqual(['r2→r3: u2', 'r3b→r4: u3']);
    expect(ev.filter((e) => e.kind === 'retry' || e.kind === 'side').map((e) => e.kind === 'retry' || e.kind === 'side' ? `${e.kind} ${e.recordId}` : '')).toEqual(['retry r3b', 'side t1']);
    expect(restored.counters()).toMatchObject({ bound: 3, retries: 1, side: 1, dropped_unbound: 1 });
  });

  it('with inferSide off, a different first message is a rewrite', () => {
    const c = new Correlator({ inferSide: false });
    const ev = feed(c, [rec('r1', [S, user('hi')], 'hello', { session: 'a' }), rec('t1', [sys('title'), user('hi / hello')], 'T', { session: 'a' })]);
    expect(turns(ev)).toEqual(['r1→t1: hi / hello']);
  });
});
