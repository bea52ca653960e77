import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Correlator } from '../../actors/judge/correlate/correlator.js';
import type { CorrelationEvent } from '../../actors/judge/correlate/types.js';
import { postChat, readSse, startStack, type Stack } from './harness.js';

/**
 * OpenClaw-RL's own headers (X-Session-Id, X-Turn-Type, X-Session-Done) through the real gateway:
 * what they store, what they are refused for, and what the judge's correlator makes of the stored
 * records — the session's last turn settled when the client says so, not at the TTL (an hour here).
 */
describe('OpenClaw headers', () => {
  let s: Stack;
  beforeAll(async () => {
    s = await startStack();
  });
  afterAll(async () => {
    await s?.close();
  });

  async function turn(messages: unknown[], headers: Record<string, string>, stream = false): Promise<string> {
    const res = await postChat(s.url, { model: 'tiny', messages, max_tokens: 4, stream }, headers);
    const text = await res.text();
    expect(res.status, text).toBe(200);
    return res.headers.get('x-reef-agent-record-id') ?? /"agent_record_id":"([^"]+)"/.exec(text)![1]!;
  }

  it('are stored as the session tags, and a done session settles its last turn at once', async () => {
    const sys = { role: 'system', content: 'You are OpenClaw.' };
    const m1 = [sys, { role: 'user', content: 'hi' }];
    const r1 = await turn(m1, { 'x-session-id': 'oc-1', 'x-turn-type': 'main' });
    const r1Reply = (await s.gw.store.get(r1))!.response!;
    const heartbeat = await turn([{ role: 'system', content: 'Heartbeat: anything due?' }, { role: 'user', content: 'tick' }], { 'x-session-id': 'oc-1', 'x-turn-type': 'SIDE' }, true);
    const m2 = [...m1, r1Reply, { role: 'user', content: 'thanks, that is all' }];
    const r2 = await turn(m2, { 'x-session-id': 'oc-1', 'x-session-done': 'true' }, true);

    expect((await s.gw.store.get(r1))!.tags).toEqual({ session: 'oc-1', 'turn-type': 'main' });
    expect((await s.gw.store.get(heartbeat))!.tags).toEqual({ session: 'oc-1', 'turn-type': 'side' });
    expect((await s.gw.store.get(r2))!.tags).toEqual({ session: 'oc-1', 'session-done': 'true' });

    const correlator = new Correlator({ sessionTtlS: 3600 });
    const events: CorrelationEvent[] = [];
    for (const record of await s.gw.store.readFrom(0, 100)) events.push(...correlator.observe(record));
    expect(events.filter((e) => e.kind === 'turn-finished').map((e) => e.kind === 'turn-finished' && [e.turnRecordId, e.nextStateRecordId, e.nextState.content])).toEqual([[r1, r2, 'thanks, that is all']]);
    expect(events.find((e) => e.kind === 'side')).toMatchObject({ recordId: heartbeat });
    expect(events.find((e) => e.kind === 'turn-dropped')).toMatchObject({ turnRecordId: r2, reason: 'session-done' });
    expect(correlator.openSessions).toBe(0);
    expect(correlator.counters()).toMatchObject({ bound: 1, side: 1, ended: 1, dropped_unbound: 0 });
  });

  it.each([
    [{ 'x-session-id': 'a', 'x-reef-tag-session': 'b' }, 'x-session-id', 'x-session-id "a" and x-reef-tag-session "b" disagree'],
    [{ 'x-turn-type': 'heartbeat' }, 'x-turn-type', 'x-turn-type "heartbeat" is neither main nor side'],
    [{ 'x-turn-type': 'main', 'x-reef-tag-turn-type': 'side' }, 'x-turn-type', 'x-turn-type "main" and x-reef-tag-turn-type "side" disagree'],
    [{ 'x-session-id': 'a', 'x-session-done': 'maybe' }, 'x-session-done', 'x-session-done "maybe" is not a boolean'],
    [{ 'x-session-done': 'true' }, 'x-session-done', 'x-session-done needs the session it ends'],
  ])('refuses %j with a 400 naming %s, before the engine is asked', async (headers, param, message) => {
    const before = s.engine.requests.length;
    const head = await s.gw.store.headOffset();
    const res = await postChat(s.url, { model: 'tiny', messages: [{ role: 'user', content: 'hi' }] }, headers);
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: { message: string; type: string; param: string } };
    expect(body.error).toMatchObject({ type: 'invalid_request_error', param });
    expect(body.error.message).toContain(message);
    expect(s.engine.requests.length).toBe(before);
    expect(await s.gw.store.headOffset()).toBe(head);
  });

  it('takes both spellings when they agree, and a false done as no flag at all', async () => {
    const id = await turn([{ role: 'user', content: 'hi' }], { 'x-session-id': 'same', 'x-reef-tag-session': 'same', 'x-turn-type': 'side', 'x-reef-tag-turn-type': 'side', 'x-session-done': 'no' });
    expect((await s.gw.store.get(id))!.tags).toEqual({ session: 'same', 'turn-type': 'side' });
  });
});
