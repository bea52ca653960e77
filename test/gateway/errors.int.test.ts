import { connect } from 'node:net';
import { request } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHAT, openAIError, postChat, startStack, type Stack } from './harness.js';

/** Client errors: each answers 4xx with the OpenAI error body, names the param, and records nothing. */

describe.each([['inline', undefined], ['worker', 0]] as const)('gateway request errors (%s prepare)', (_mode, inlinePrepareBytes) => {
  let s: Stack;
  let head = 0;

  beforeAll(async () => {
    s = await startStack({ inlinePrepareBytes });
    head = await s.gw.store.headOffset();
  });
  afterAll(async () => {
    // None of the requests below reached the engine or the store.
    expect(s.engine.requests).toHaveLength(0);
    expect(await s.gw.store.headOffset()).toBe(head);
    await s?.close();
  });

  async function expect400(body: unknown, param: string | null, message: RegExp, headers: Record<string, string> = {}) {
    const res = await postChat(s.url, body, headers);
    const json = await res.json();
    expect(res.status, JSON.stringify(json)).toBe(400);
    const err = openAIError(json);
    expect(err.type).toBe('invalid_request_error');
    expect(err.param).toBe(param);
    expect(err.message).toMatch(message);
    return err;
  }

  it('malformed JSON', async () => {
    const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"messages": [' });
    expect(res.status).toBe(400);
    expect(openAIError(await res.json()).message).toMatch(/not valid JSON/);
  });

  it('a body that is not UTF-8 (a Latin-1 é), rather than a prompt with U+FFFD in its place', async () => {
    const bytes = Buffer.from(JSON.stringify({ ...CHAT, messages: [{ role: 'user', content: 'caf_' }] }));
    bytes[bytes.indexOf('_')] = 0xe9;
    const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: bytes });
    expect(res.status).toBe(400);
    expect(openAIError(await res.json()).message).toBe('request body is not valid UTF-8');
  });

  it('a body that is JSON but not an object', async () => {
    await expect400([CHAT], null, /JSON object/);
    await expect400('hello', null, /JSON object/);
  });

  it('wrong types', async () => {
    await expect400({ ...CHAT, temperature: 'hot' }, 'temperature', /number/);
    await expect400({ ...CHAT, max_tokens: 1.5 }, 'max_tokens', /int/);
    await expect400({ ...CHAT, top_k: 0 }, 'top_k', /-1 \(off\) or an integer >= 1/);
    await expect400({ ...CHAT, top_k: 2.5 }, 'top_k', /-1 \(off\) or an integer >= 1/);
    await expect400({ ...CHAT, stream: 'yes' }, 'stream', /boolean/);
    await expect400({ messages: 'hello' }, 'messages', /array/);
    await expect400({ messages: [{ role: 'user', content: 42 }] }, 'messages[0].content', /string or an array/);
  });

  it('unknown role and missing role', async () => {
    await expect400({ messages: [{ role: 'wizard', content: 'hi' }] }, 'messages[0].role', /unknown role "wizard"/);
    await expect400({ messages: [{ content: 'hi' }] }, 'messages[0].role', /missing role/);
  });

  it('empty messages', async () => {
    await expect400({ messages: [] }, 'messages', /at least one message/);
    await expect400({ model: 'x' }, 'messages', /./);
  });

  it('n other than 1', async () => {
    await expect400({ ...CHAT, n: 2 }, 'n', /n must be 1/);
  });

  it('an empty stop string, logprobs, a tool_choice no offered tool can meet', async () => {
    await expect400({ ...CHAT, stop: ['END', ''] }, 'stop', /must not be empty/);
    await expect400({ ...CHAT, logprobs: true, top_logprobs: 3 }, 'logprobs', /not returned in the reply/);
    await expect400({ ...CHAT, tool_choice: 'required' }, 'tool_choice', /needs tools/);
    await expect400({ ...CHAT, tools: [{ type: 'function', function: { name: 'g' } }], tool_choice: { type: 'function', function: { name: 'f' } } }, 'tool_choice.function.name', /not among the request's tools/);
  });

  it('an image content part', async () => {
    await expect400({ messages: [{ role: 'user', content: [{ type: 'text', text: 'see' }, { type: 'image_url', image_url: { url: 'data:,' } }] }] }, 'messages[0].content[1].type', /not supported/);
  });

  it('a prompt past the context length (4096 tokens)', async () => {
    // OpenAI's wording, which agents match to compact their history (OpenClaw: "maximum context length").
    const err = await expect400({ messages: [{ role: 'user', content: 'lorem ipsum dolor '.repeat(5000) }] }, 'messages', /^This model's maximum context length is 4096 tokens\. However, you requested \d+ tokens \(\d+ in the messages, 1 in the completion\)\. Please reduce the length of the messages or completion\.$/);
    expect(err.code).toBe('REEF_ERR_CONTEXT_LENGTH');
    await expect400({ ...CHAT, max_tokens: 4096 }, 'max_tokens', /maximum context length is 4096 tokens/);
    await expect400({ ...CHAT, max_completion_tokens: 4096 }, 'max_completion_tokens', /maximum context length/);
  });

  it('a bad scenario header', async () => {
    await expect400(CHAT, 'x-reef-scenario', /not a valid scenario name/, { 'x-reef-scenario': 'Bad Scenario!' });
  });

  it('a body nested 10,000 levels deep is 400, not 500 (regression: storing the request overflowed the stack)', async () => {
    const deep = '['.repeat(10_000) + ']'.repeat(10_000);
    for (const [path, body] of [['/v1/chat/completions', `{"messages": [{"role": "user", "content": "hi"}], "extra": ${deep}}`], ['/reef/report', `{"score": 1, "metadata": {"m": ${deep}}}`]]) {
      const res = await fetch(`${s.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      expect(res.status, path).toBe(400);
      expect(openAIError(await res.json()).message).toMatch(/nested more than 128 levels/);
    }
    // Ordinary nesting (a tool schema a few levels deep) is fine.
    const nested = { type: 'object', properties: { a: { type: 'object', properties: { b: { type: 'array', items: { type: 'string' } } } } } };
    const ok = await fetch(`${s.url}/reef/report`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ score: 1, metadata: nested }) });
    expect(ok.status).toBe(201);
  });

  it('a URL that is not valid percent-encoding gets the OpenAI error body (regression: fastify\'s own body)', async () => {
    const res = await fetch(`${s.url}/reef/scenarios/%ff/records`);
    expect(res.status).toBe(400);
    expect(openAIError(await res.json()).type).toBe('invalid_request_error');
  });

  it('a wrong content type is 4xx, not 5xx', async () => {
    const res = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/xml' }, body: '<x/>' });
    expect(res.status).toBe(415);
    expect(openAIError(await res.json()).type).toBe('invalid_request_error');
    // text/plain is what a page on another origin may send without asking first: refused before
    // it is read, like no content type at all.
    const plain = await fetch(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: JSON.stringify(CHAT) });
    expect(plain.status).toBe(415);
    expect(openAIError(await plain.json()).message).toMatch(/needs content-type: application\/json, got "text\/plain"/);
  });

  it('an unknown route is 404 with the OpenAI error body', async () => {
    const res = await fetch(`${s.url}/v1/completions`, { method: 'POST', body: '{}' });
    expect(res.status).toBe(404);
    expect(openAIError(await res.json()).code).toBe('REEF_ERR_NOT_FOUND');
  });

  it('a body over 64 MiB is 413', async () => {
    const big = Buffer.alloc(64 * 1024 * 1024 + 1024, 0x20);
    const res = await request(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: big }).catch((err: Error) => err);
    // The server may answer before it has read the whole body and close the socket; undici then
    // reports the write error instead of the response, which is also a refusal, but we want the 413.
    if (res instanceof Error) throw res;
    expect(res.statusCode).toBe(413);
    expect(openAIError(await res.body.json()).code).toBe('REEF_ERR_TOO_LARGE');
  });

  it('an upload cut off before its content-length is in costs nothing: no answer owed, nothing recorded, the next request served', async () => {
    const { port } = new URL(s.url);
    const whole = JSON.stringify(CHAT);
    await new Promise<void>((resolve, reject) => {
      const sock = connect(Number(port), '127.0.0.1', () => {
        sock.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${whole.length + 500}\r\n\r\n${whole}`);
        setTimeout(() => sock.destroy(), 50);
      });
      sock.on('close', () => resolve());
      sock.on('error', reject);
    });
    // The gateway is still there and still refuses bad input properly (the afterAll checks that
    // nothing reached the engine or the store).
    await expect400({ messages: [] }, 'messages', /at least one message/);
  });

  it('a chunked upload (no content-length) growing past 64 MiB is 413 too', async () => {
    const block = Buffer.alloc(1024 * 1024, 0x20);
    async function* blocks() {
      for (let i = 0; i < 65; i++) yield block;
    }
    const res = await request(`${s.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: blocks() }).catch((err: Error) => err);
    if (res instanceof Error) throw res;
    expect(res.statusCode).toBe(413);
    expect(openAIError(await res.body.json()).code).toBe('REEF_ERR_TOO_LARGE');
  });
});
