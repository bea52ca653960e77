import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HandlerContext } from '../../actors/runtime/mailbox.js';
import { waitFor } from '../helpers/wait.js';
import { CHAT, openAIError, postChat, readSse, startStack, type Stack } from './harness.js';

/**
 * A weight swap as the trainer-controller brackets it: pause-generation (in-flight generations
 * finish, bounded), the engine loads new weights, resume-generation (waiting requests go on, and
 * their records carry the new version).
 */

const PIECES = Array.from({ length: 30 }, (_, i) => ` s${i}`);
const ctx = (type: string): HandlerContext => ({ requestId: `r-${type}`, type, mailbox: 'gateway-0', receivedAt: Date.now() });

describe('gateway weight swap', () => {
  let s: Stack;
  let engineFinished = 0;
  const logs: string[] = [];

  beforeAll(async () => {
    s = await startStack({ engine: { respond: () => ({ pieces: PIECES }) }, log: (line) => logs.push(line) });
    s.engine.server.on('request', (_req, res) => res.on('finish', () => engineFinished++));
  });
  afterAll(async () => {
    await s?.close();
  });

  const pause = (drainTimeoutMs: number, maxPauseMs?: number) =>
    s.gw.handlers['pause-generation']({ type: 'pause-generation', requestId: 'p', drainTimeoutMs, ...(maxPauseMs === undefined ? {} : { maxPauseMs }) }, ctx('pause-generation')) as Promise<{ drained: boolean; inflight: number }>;
  const resume = (weightVersion: string | null) => s.gw.handlers['resume-generation']({ type: 'resume-generation', requestId: 'r', weightVersion }, ctx('resume-generation')) as Promise<{ weightVersion: string | null }>;

  it('pause waits for the stream in flight; a request during the pause waits and runs on the new weights after resume', async () => {
    s.engine.options.tokenDelayMs = 15;
    let firstChunk!: () => void;
    const sawFirst = new Promise<void>((r) => (firstChunk = r));
    const streamA = postChat(s.url, { ...CHAT, stream: true }).then((res) => readSse(res, () => firstChunk()));
    await sawFirst;
    expect(s.gw.gate.inflight).toBe(1);

    const finishedBeforePause = engineFinished;
    const paused = pause(20_000);
    const requestsBeforeB = s.engine.requests.length;
    let bSettled = false;
    const b = postChat(s.url, { model: 'tiny', messages: [{ role: 'user', content: 'asked during the pause' }] }).finally(() => (bSettled = true));

    const drain = await paused;
    expect(drain).toEqual({ drained: true, inflight: 0 });
    // The in-flight generation ran to its end before pause answered.
    expect(engineFinished).toBeGreaterThan(finishedBeforePause);
    const eventsA = await streamA;
    expect(eventsA.at(-1)).toBe('[DONE]');
    const receiptA = JSON.parse(eventsA.at(-2)!).reef.agent_record_id as string;
    expect((await s.gw.store.get(receiptA))!).toMatchObject({ status: 'ok', weightVersion: 'v0' });
    expect((await s.gw.store.get(receiptA))!.outputIds.length).toBe(PIECES.length);

    // The weights change while paused; B has not reached the engine and is still waiting.
    const swap = (await (await fetch(`${s.engine.url}/update_weights_from_disk`, { method: 'POST', body: JSON.stringify({ model_path: '/tmp/ckpt-1', weight_version: 'v1' }) })).json()) as { weight_version: string };
    expect(swap.weight_version).toBe('v1');
    expect(s.gw.gate.isPaused).toBe(true);
    expect((await (await fetch(`${s.url}/reef/status`)).json()) as any).toMatchObject({ gateway: { paused: true } });
    await new Promise((r) => setTimeout(r, 100));
    expect(bSettled).toBe(false);
    expect(s.engine.requests.length).toBe(requestsBeforeB);

    // A version the engine does not serve is refused, and the pause stays on.
    await expect(resume('v999')).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    expect(s.gw.gate.isPaused).toBe(true);
    expect(await resume('v1')).toEqual({ weightVersion: 'v1' });
    const resB = await b;
    expect(resB.status).toBe(200);
    const recB = (await s.gw.store.get(resB.headers.get('x-reef-agent-record-id')!))!;
    expect(recB.weightVersion).toBe('v1');
    expect(recB.status).toBe('ok');
    expect(s.gw.gate.weightVersion).toBe('v1');
    s.engine.options.tokenDelayMs = 0;
  });

  it('the drain is bounded: pause answers drained false when a generation outlives the timeout, logs it (regression: silent), and resume lets it finish', async () => {
    s.engine.options.tokenDelayMs = 20;
    let firstChunk!: () => void;
    const sawFirst = new Promise<void>((r) => (firstChunk = r));
    const stream = postChat(s.url, { ...CHAT, stream: true }).then((res) => readSse(res, () => firstChunk()));
    await sawFirst;
    expect(await pause(50)).toEqual({ drained: false, inflight: 1 });
    // Logged: the swap goes ahead with a generation still running.
    expect(logs.filter((l) => l.includes('still running after the 50 ms drain'))).toHaveLength(1);
    resume(null);
    expect(s.gw.gate.weightVersion).toBe('v1');
    const events = await stream;
    expect(events.at(-1)).toBe('[DONE]');
    await waitFor(() => s.gw.gate.inflight === 0, { what: 'no generation in flight' });
    s.engine.options.tokenDelayMs = 0;
  });

  it('a streamed client that gives up while paused leaves no waiter, no record and no error behind', async () => {
    expect(await pause(1000)).toEqual({ drained: true, inflight: 0 });
    const head = await s.gw.store.headOffset();
    const requests = s.engine.requests.length;
    const body = JSON.stringify({ ...CHAT, stream: true });
    const req = httpRequest(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
    req.on('error', () => {});
    req.end(body);
    await waitFor(() => (s.gw.metrics.inflightCount === 1 ? true : null), { what: 'the request to wait at the gate' });
    req.destroy();
    await waitFor(() => s.gw.metrics.inflightCount === 0, { what: 'the request to be let go' });
    resume(null);
    expect(s.gw.gate.inflight).toBe(0);
    expect(await s.gw.store.headOffset()).toBe(head);
    expect(s.engine.requests.length).toBe(requests);
    expect(s.gw.metrics.render()).not.toMatch(/code="5\d\d"/);
    expect((await postChat(s.url, CHAT)).status).toBe(200);
  });

  it('a non-streamed client that gives up while paused leaves no waiter, no record and no error behind', async () => {
    expect(await pause(1000)).toEqual({ drained: true, inflight: 0 });
    const head = await s.gw.store.headOffset();
    const requests = s.engine.requests.length;
    const body = JSON.stringify(CHAT);
    const req = httpRequest(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
    req.on('error', () => {});
    req.end(body);
    await waitFor(() => (s.gw.metrics.inflightCount === 1 ? true : null), { what: 'the request to wait at the gate' });
    req.destroy();
    await waitFor(() => s.gw.metrics.inflightCount === 0, { what: 'the request to be let go' });
    resume(null);
    expect(s.gw.gate.inflight).toBe(0);
    expect(await s.gw.store.headOffset()).toBe(head);
    expect(s.engine.requests.length).toBe(requests);
    expect(s.gw.metrics.render()).not.toMatch(/code="5\d\d"/);
    expect((await postChat(s.url, CHAT)).status).toBe(200);
  });

  it('a streamed request that waits through a pause starts streaming after resume', async () => {
    expect(await pause(1000)).toEqual({ drained: true, inflight: 0 });
    let headersSeen = false;
    const res = postChat(s.url, { ...CHAT, stream: true }).then((r) => {
      headersSeen = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 100));
    expect(headersSeen).toBe(false);
    await (await fetch(`${s.engine.url}/update_weights_from_disk`, { method: 'POST', body: JSON.stringify({ model_path: '/tmp/ckpt-2', weight_version: 'v2' }) })).json();
    await resume('v2');
    const events = await readSse(await res);
    const id = JSON.parse(events.at(-2)!).reef.agent_record_id as string;
    expect((await s.gw.store.get(id))!.weightVersion).toBe('v2');
  });

  it('a pause nobody resumes ends by itself after maxPauseMs: the waiting request runs, on the unchanged version', async () => {
    const version = s.gw.gate.weightVersion;
    expect(await pause(1000, 2000)).toEqual({ drained: true, inflight: 0 });
    const res = postChat(s.url, CHAT);
    await waitFor(() => (s.gw.metrics.inflightCount === 1 ? true : null), { what: 'the request to wait at the gate' });
    expect(s.gw.gate.isPaused).toBe(true);
    const done = await res;
    expect(done.status).toBe(200);
    expect(s.gw.gate.isPaused).toBe(false);
    expect((await s.gw.store.get(done.headers.get('x-reef-agent-record-id')!))!.weightVersion).toBe(version);
  });

  it('a resume ends the lease: a later pause is not cut short by an earlier one', async () => {
    await pause(1000, 200);
    resume(null);
    await pause(1000, 60_000);
    await new Promise((r) => setTimeout(r, 400));
    expect(s.gw.gate.isPaused).toBe(true);
    resume(null);
  });

  it('a gateway closed while paused answers the waiting requests 503 draining, and its close is not held by them (regression: held for the admission bound, 60 s)', async () => {
    const own = await startStack();
    let closed = false;
    try {
      await own.gw.handlers['pause-generation']({ type: 'pause-generation', requestId: 'p', drainTimeoutMs: 1000 }, ctx('pause-generation'));
      const waiting = [false, true].map((stream) => postChat(own.url, { ...CHAT, stream }));
      await waitFor(() => (own.gw.metrics.inflightCount === 2 ? true : null), { what: 'both requests to wait at the gate' });
      await own.gw.close();
      closed = true;
      for (const res of await Promise.all(waiting)) {
        expect(res.status).toBe(503);
        expect(res.headers.get('retry-after')).toBeTruthy();
        expect(openAIError(await res.json()).code).toBe('REEF_ERR_ACTOR_DRAINING');
      }
      expect(own.engine.requests).toHaveLength(0);
    } finally {
      if (!closed) own.gw.gate.resume(null);
      await own.close();
    }
  });
});
