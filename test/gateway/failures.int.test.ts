import { request as httpRequest } from 'node:http';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/wait.js';
import { CHAT, openAIError, postChat, readSse, startStack, type Stack } from './harness.js';

/** What happens to the client and to the record when the client or the engine goes away. */

const LONG = Array.from({ length: 60 }, (_, i) => ` t${i}`);

describe('gateway failures', () => {
  let s: Stack;

  beforeAll(async () => {
    s = await startStack({ engine: { respond: () => ({ pieces: LONG }) } });
  });
  afterEach(() => {
    Object.assign(s.engine.options, { tokenDelayMs: 0, failWith: null, dieAfterTokens: null, answerWith: null });
  });
  afterAll(async () => {
    await s?.close();
  });

  async function latestRecord() {
    const page = await s.gw.store.list({ scenario: 'default', order: 'desc', limit: 1 });
    return page.items[0] ?? null;
  }

  it('a non-streamed client that leaves before its answer cuts the engine request off and leaves an aborted record', async () => {
    // The engine answers in 30 s, unless its client goes away first.
    s.engine.options.delayMs = () => 30_000;
    try {
      const headBefore = await s.gw.store.headOffset();
      const body = JSON.stringify(CHAT);
      let engineRequestClosed = false;
      const engineGotIt = new Promise<void>((resolve) =>
        s.engine.server.once('request', (req) => {
          req.socket.once('close', () => (engineRequestClosed = true));
          resolve();
        }),
      );
      const req = httpRequest(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } });
      req.on('error', () => {});
      req.end(body);
      await engineGotIt;
      req.destroy();
      const rec = await waitFor(async () => ((await s.gw.store.headOffset()) > headBefore ? latestRecord() : null), { what: 'the aborted record' });
      expect(rec).toMatchObject({ status: 'aborted', error: 'client disconnected' });
      await waitFor(() => engineRequestClosed, { what: 'the engine connection to close' });
      expect((await s.gw.store.get(rec.id))!.outputIds.length).toBe(0);
      await waitFor(() => s.gw.gate.inflight === 0, { what: 'the request to leave the gate' });
    } finally {
      delete s.engine.options.delayMs;
    }
  });

  it('a client that disconnects mid-stream leaves a complete record with status aborted', async () => {
    s.engine.options.tokenDelayMs = 15;
    const headBefore = await s.gw.store.headOffset();
    const body = JSON.stringify({ ...CHAT, stream: true });
    let engineRequestClosed = false;
    s.engine.server.once('request', (req) => req.socket.once('close', () => (engineRequestClosed = true)));
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
        let contentChunks = 0;
        res.on('data', (d: Buffer) => {
          contentChunks += (d.toString().match(/"content":" t/g) ?? []).length;
          if (contentChunks >= 3) {
            req.destroy();
            resolve();
          }
        });
        res.on('error', () => {});
      });
      req.on('error', (err) => ((err as NodeJS.ErrnoException).code === 'ECONNRESET' ? undefined : reject(err)));
      req.end(body);
    });
    const rec = await waitFor(async () => ((await s.gw.store.headOffset()) > headBefore ? latestRecord() : null), { what: 'the aborted record' });
    expect(rec.status).toBe('aborted');
    expect(rec.error).toBe('client disconnected');
    // The engine was told to stop: its connection was closed before it produced every token.
    await waitFor(() => engineRequestClosed, { what: 'the engine connection to close' });
    const full = (await s.gw.store.get(rec.id))!;
    expect(full.outputIds.length).toBeGreaterThanOrEqual(3);
    expect(full.outputIds.length).toBeLessThan(LONG.length);
    expect(full.logprobs.length).toBe(full.outputIds.length);
    expect(full.topkIds.length).toBe(full.outputIds.length * 4);
    expect(Array.from(full.promptIds)).toEqual(s.engine.requests.at(-1)!.input_ids);
    expect(s.gw.gate.inflight).toBe(0);
  });

  it('an engine that dies mid-stream gives an SSE error event and a failed record', async () => {
    // A delay lets each event leave the fake engine before it destroys the socket.
    Object.assign(s.engine.options, { dieAfterTokens: 5, tokenDelayMs: 5 });
    const res = await postChat(s.url, { ...CHAT, stream: true });
    expect(res.status).toBe(200);
    const events = await readSse(res);
    expect(events).not.toContain('[DONE]');
    const last = JSON.parse(events.at(-1)!);
    const err = openAIError(last);
    expect(err.code).toMatch(/^REEF_ERR_ENGINE_(FAILED|DOWN)$/);
    const content = events.slice(0, -1).map((e) => JSON.parse(e).choices[0]?.delta?.content ?? '').join('');
    expect(content).toBe(LONG.slice(0, 5).join('').trim());
    const rec = (await latestRecord())!;
    expect(rec.status).toBe('failed');
    expect(rec.error).toBeTruthy();
    expect((await s.gw.store.get(rec.id))!.outputIds.length).toBe(5);
    expect(s.gw.metrics.render()).toMatch(/reef_engine_errors_total\{kind="stream"\} [1-9]/);
  });

  it('an engine answering 503 gives the client 503 with Retry-After and the OpenAI error body, streamed and not', async () => {
    s.engine.options.failWith = 503;
    const head = await s.gw.store.headOffset();
    for (const stream of [false, true]) {
      const res = await postChat(s.url, { ...CHAT, stream });
      expect(res.status).toBe(503);
      expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
      expect(openAIError(await res.json()).code).toBe('REEF_ERR_ENGINE_DOWN');
    }
    // Nothing was generated, so nothing was recorded.
    expect(await s.gw.store.headOffset()).toBe(head);
  });

  it('an engine that answers 200 with an error, or with what is not JSON, gives 503 with Retry-After and its words, streamed and not (regression: a 500 internal error, or "without [DONE]")', async () => {
    const head = await s.gw.store.headOffset();
    for (const answer of [{ contentType: 'application/json', body: '{"error": {"message": "CUDA out of memory"}}', words: 'CUDA out of memory' }, { contentType: 'text/html', body: '<html>upstream connect error</html>', words: 'upstream connect error' }]) {
      s.engine.options.answerWith = { status: 200, contentType: answer.contentType, body: answer.body };
      for (const stream of [false, true]) {
        const res = await postChat(s.url, { ...CHAT, stream });
        expect(res.status).toBe(503);
        expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
        const err = openAIError(await res.json());
        expect(err.code).toBe('REEF_ERR_ENGINE_DOWN');
        expect(err.message).toContain(answer.words);
      }
    }
    expect(await s.gw.store.headOffset()).toBe(head);
  });

  it('an engine that refuses the request (400) gives the client 400, streamed and not (regression: streamed answered 200 + error event)', async () => {
    s.engine.options.failWith = 400;
    for (const stream of [false, true]) {
      const res = await postChat(s.url, { ...CHAT, stream });
      expect(res.status).toBe(400);
      expect(openAIError(await res.json()).type).toBe('invalid_request_error');
    }
  });

  it('an engine that closes the stream before its first event gives 503, not a 200 with an empty stream', async () => {
    s.engine.options.dieAfterTokens = 0;
    const res = await postChat(s.url, { ...CHAT, stream: true });
    expect(res.status).toBe(503);
    expect(res.headers.get('retry-after')).toBeTruthy();
    expect(openAIError(await res.json()).code).toBe('REEF_ERR_ENGINE_DOWN');
  });

  it('a stream whose record cannot be committed ends with an error event, not a silent cut (regression: no receipt, no error)', async () => {
    const { startStack } = await import('./harness.js');
    const own = await startStack({ engine: { respond: () => ({ pieces: LONG.slice(0, 10) }), tokenDelayMs: 10 } });
    try {
      let closed: Promise<void> | null = null;
      const events = await readSse(await postChat(own.url, { ...CHAT, stream: true }), () => {
        // The store goes away mid-stream (as on shutdown), so the final commit fails.
        closed ??= own.gw.store.close();
      });
      await closed;
      expect(events).not.toContain('[DONE]');
      expect(events.some((e) => e.includes('agent_record_id'))).toBe(false);
      expect(openAIError(JSON.parse(events.at(-1)!)).code).toBe('REEF_ERR_STORE_CLOSED');
    } finally {
      await own.close();
    }
  });

  it('an engine that is gone (connection refused) gives 503 with Retry-After, streamed and not', async () => {
    const { startFakeEngine } = await import('../helpers/fake-engine.js');
    const { startGateway } = await import('../../actors/gateway/index.js');
    const { testConfig } = await import('./harness.js');
    const { mkdtempSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const dead = await startFakeEngine();
    const url = dead.url;
    await dead.close();
    const dir = mkdtempSync(join(tmpdir(), 'reef-gw-dead-'));
    const gw = await startGateway({ config: await testConfig(dir), engineUrl: url, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: 1 });
    try {
      for (const stream of [false, true]) {
        const res = await postChat(gw.url, { ...CHAT, stream });
        expect(res.status).toBe(503);
        expect(res.headers.get('retry-after')).toBeTruthy();
        expect(openAIError(await res.json()).code).toBe('REEF_ERR_ENGINE_DOWN');
      }
      expect(gw.metrics.render()).toMatch(/reef_engine_errors_total\{kind="generate"\} 2/);
    } finally {
      await gw.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
