import { createServer, type RequestListener, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { waitFor } from '../test/helpers/wait.js';
import { EngineClient, type EngineClientOptions, generateBody } from './engine-client.js';
import { releaseBody } from './generate-body.js';

const parse = (body: Uint8Array) => JSON.parse(Buffer.from(body).toString('utf8')) as unknown;

/** `run` against a client of a loopback server answering with `handler`; both closed after. */
async function withServer(handler: RequestListener, run: (client: EngineClient) => Promise<void>, opts: EngineClientOptions = {}): Promise<void> {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const client = new EngineClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, opts);
  try {
    await run(client);
  } finally {
    await client.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

describe('generateBody', () => {
  let seed = 7;
  // The high bits: this generator's low bits repeat with short periods.
  const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), Math.floor((seed / 2 ** 31) * n));

  it('writes typed and plain id arrays as the same JSON as JSON.stringify', () => {
    const req = { sampling_params: { max_new_tokens: 4, stop: ['é'] }, return_logprob: true, rid: 'r' };
    // Every digit count, both sides of each power of ten, and the largest int32.
    const ids = [0, 7, 9, 10, 99, 100, 999, 1000, 2041, 151_643, 999_999, 1_000_000, 99_999_999, 100_000_000, 999_999_999, 1_000_000_000, 2_147_483_647];
    const expected = { ...req, stream: true, input_ids: ids };
    expect(parse(generateBody({ ...req, input_ids: Int32Array.from(ids) }, true))).toEqual(expected);
    expect(parse(generateBody({ ...req, input_ids: ids }, true))).toEqual(expected);
    // Byte for byte: the ids first (so a later body can keep them in place), then the rest.
    expect(Buffer.from(generateBody({ ...req, input_ids: ids }, true)).toString()).toBe(JSON.stringify({ input_ids: ids, ...req, stream: true }));
    expect(parse(generateBody({ ...req, input_ids: [] }, false))).toEqual({ ...req, stream: false, input_ids: [] });
  });

  it('leaves input_ids out when absent and refuses what is not a token id', () => {
    expect(parse(generateBody({ text: 'hi', sampling_params: {} }, false))).toEqual({ text: 'hi', sampling_params: {}, stream: false });
    expect(() => generateBody({ input_ids: [1, 2.5], sampling_params: {} }, false)).toThrow(/input_ids\[1\] is not an integer/);
    expect(() => generateBody({ input_ids: [1, -1], sampling_params: {} }, false)).toThrow(/input_ids\[1\] is not a token id/);
    expect(() => generateBody({ input_ids: [2 ** 31], sampling_params: {} }, false)).toThrow(/input_ids\[0\] is not a token id/);
  });

  it('owns its memory, so the body can be moved to another thread', () => {
    const body = generateBody({ input_ids: [1, 2, 3], sampling_params: {} }, false);
    expect(body.byteOffset).toBe(0);
    const { port1, port2 } = new MessageChannel();
    port1.postMessage(body, [body.buffer as ArrayBuffer]);
    expect(body.byteLength).toBe(0); // detached here: it moved rather than copied
    port1.close();
    port2.close();
  });

  it('with an earlier body to reuse, writes exactly the bytes it writes without one', () => {
    let seed = 7;
    const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
    const req = (ids: Int32Array) => ({ input_ids: ids, sampling_params: { max_new_tokens: 4 }, rid: 'r' });
    const randomIds = (n: number) => Int32Array.from({ length: n }, () => (rand(3) === 0 ? rand(10) : rand(200_000)));
    // Thousands of ids, so that shared prefixes and changed ids fall in and across the 2,048-id blocks compared natively.
    let prev = generateBody(req(randomIds(6000)), true, { keep: true });
    for (let round = 0; round < 60; round++) {
      const last = prev.idText!.ids;
      // Grow the last prompt, cut it, change one id in it, or start afresh; lengths cross mark boundaries.
      const kind = rand(4);
      const keep = kind === 3 ? 0 : Math.min(last.length, rand(last.length + 1) + (kind === 0 ? last.length : 0));
      const next = Int32Array.from([...last.subarray(0, keep), ...randomIds(rand(2500))]);
      if (kind === 2 && next.length > 0) next[rand(next.length)] = rand(99);
      const reused = generateBody(req(next), round % 2 === 0, { reuse: prev.idText, keep: true });
      const fresh = generateBody(req(next), round % 2 === 0);
      expect(Buffer.from(reused.body).equals(Buffer.from(fresh))).toBe(true);
      prev = reused;
    }
  });

  it('in place: writes into the last body\'s arena only once its lease ended, and every body is exactly its own', () => {
    const req = (ids: Int32Array) => ({ input_ids: ids, sampling_params: { max_new_tokens: 4 }, rid: 'r' });
    const randomIds = (n: number) => Int32Array.from({ length: n }, () => rand(200_000));
    let prev = generateBody(req(randomIds(3000)), true, { keep: true });
    let inPlace = 0;
    let fresh = 0;
    for (let round = 0; round < 80; round++) {
      const last = prev.idText!.ids;
      // A growing transcript mostly; sometimes an edit, a cut, a jump past the arena's room.
      const kind = rand(6);
      const keepN = kind === 4 ? rand(last.length) : last.length - (kind === 3 ? rand(300) : 0);
      const next = Int32Array.from([...last.subarray(0, keepN), ...randomIds(kind === 5 ? 4000 : rand(400))]);
      const released = rand(4) !== 0;
      if (released) releaseBody(prev.lease);
      const snapshot = Buffer.from(prev.body);
      const got = generateBody(req(next), round % 2 === 0, { reuse: prev.idText, keep: true, inPlace: true });
      const want = generateBody(req(next), round % 2 === 0);
      expect(Buffer.from(got.body).equals(Buffer.from(want)), `round ${round}`).toBe(true);
      expect(JSON.parse(Buffer.from(got.body).toString('utf8')).input_ids).toEqual(Array.from(next));
      if (got.body.buffer === prev.body.buffer) {
        inPlace++;
        // Only a released body is written over.
        expect(released).toBe(true);
      } else {
        fresh++;
        // An unreleased body is left exactly as it was handed out.
        if (!released) expect(Buffer.from(prev.body).equals(snapshot)).toBe(true);
      }
      expect(Atomics.load(got.lease!, 0)).toBe(1);
      prev = got;
    }
    expect(inPlace).toBeGreaterThan(20);
    expect(fresh).toBeGreaterThan(10);
  });

  it('notices a changed id at every position around the blocks its prefix comparison skips', () => {
    const req = (ids: Int32Array) => ({ input_ids: ids, sampling_params: { max_new_tokens: 4 }, rid: 'r' });
    const base = Int32Array.from({ length: 5000 }, (_, i) => (i * 7919) % 151_000);
    const prev = generateBody(req(base), false, { keep: true });
    for (const at of [0, 1, 255, 256, 2046, 2047, 2048, 2049, 4095, 4096, 4999]) {
      const next = base.slice();
      next[at] = next[at]! + 1;
      const reused = generateBody(req(next), false, { reuse: prev.idText, keep: true });
      expect(Buffer.from(reused.body).equals(Buffer.from(generateBody(req(next), false))), `id ${at} changed`).toBe(true);
    }
  });
});

describe('EngineClient.generateStream', () => {
  const event = (text: string) => `data: ${JSON.stringify({ text, output_ids: [text.length], meta_info: { id: 'r', finish_reason: null, prompt_tokens: 1, completion_tokens: text.length, weight_version: null } })}\n\n`;

  /** An engine double whose /generate answers are written by `answer`. */
  async function engine(answer: (res: ServerResponse, path: string) => void, opts: { prefix?: string; connections?: number } = {}): Promise<{ client: EngineClient; close: () => Promise<void> }> {
    const server = createServer((req, res) => {
      req.resume();
      req.on('end', () => answer(res, req.url ?? ''));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = new EngineClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}${opts.prefix ?? ''}`, { connections: opts.connections ?? 64 });
    return {
      client,
      close: async () => {
        await client.close();
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      },
    };
  }

  /** Runs `run` against an engine double (`engine`), which is closed afterwards whatever happens. */
  async function withEngine(answer: (res: ServerResponse, path: string) => void, run: (client: EngineClient) => Promise<void>, opts: { prefix?: string; connections?: number } = {}): Promise<void> {
    const e = await engine(answer, opts);
    try {
      await run(e.client);
    } finally {
      await e.close();
    }
  }

  const texts = async (client: EngineClient) => {
    const out: string[] = [];
    for await (const r of client.generateStream({ input_ids: [1], sampling_params: {} })) out.push(r.text);
    return out;
  };

  it('yields the newest of the events that arrive together, stops at [DONE] and ignores what follows it', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(event('a') + event('ab') + event('abc') + 'data: [DONE]\n\n' + event('ignored'));
      },
      async (client) => {
        expect(await texts(client)).toEqual(['abc']);
        expect(await texts(client)).toEqual(['abc']);
      },
    );
  });

  it('yields the newest event last when events arrive apart', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(event('a'));
        setTimeout(() => res.end(event('ab') + 'data: [DONE]\n\n'), 50);
      },
      async (client) => {
        const out = await texts(client);
        // Two reads unless the machine stalled for the whole pause; either way the newest comes last.
        expect(out.at(-1)).toBe('ab');
        expect(['a,ab', 'ab']).toContain(out.join(','));
      },
    );
  });

  it('an error event is thrown even when newer events arrive with it', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(event('a') + 'data: {"error": {"message": "out of memory"}}\n\n' + event('ab') + 'data: [DONE]\n\n');
      },
      async (client) => {
        await expect(texts(client)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('out of memory') });
      },
    );
  });

  it('a reader slower than the engine gets the newest event, not a backlog', async () => {
    let rest = () => {};
    const sentAll = new Promise<void>((resolve) => {
      rest = resolve;
    });
    let release = () => {};
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(event('a'));
        release = () => {
          for (const t of ['ab', 'abc', 'abcd']) res.write(event(t));
          res.end('data: [DONE]\n\n', rest);
        };
      },
      async (client) => {
        const out: string[] = [];
        for await (const r of client.generateStream({ input_ids: [1], sampling_params: {} })) {
          out.push(r.text);
          if (out.length > 1) continue;
          // The reader is busy until the engine has sent everything, and a while after.
          release();
          await sentAll;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        expect(out).toEqual(['a', 'abcd']);
      },
    );
  });

  it('a connection that breaks after [DONE], before the response\'s end, takes nothing from a reader that had not read it yet (regression: thrown as a failure)', async () => {
    let cut = () => {};
    const wasCut = new Promise<void>((resolve) => {
      cut = resolve;
    });
    let release = () => {};
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(event('a'));
        release = () => {
          // The last event and [DONE], then the socket closes without the body's last chunk.
          res.write(event('ab') + 'data: [DONE]\n\n', () => setTimeout(() => res.socket!.destroy(), 20));
          res.socket!.once('close', () => cut());
        };
      },
      async (client) => {
        const out: string[] = [];
        for await (const r of client.generateStream({ input_ids: [1], sampling_params: {} })) {
          out.push(r.text);
          if (out.length > 1) continue;
          // The reader is busy until the engine's connection is gone.
          release();
          await wasCut;
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        expect(out).toEqual(['a', 'ab']);
      },
    );
  });

  it.each([404, 405, 401, 429])('an engine answering %i is down (the setup or its load), not the request at fault', async (status) => {
    await withEngine(
      (res) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end('{"detail": "Not Found"}');
      },
      async (client) => {
        await expect(texts(client)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining(`answered ${status}`) });
      },
    );
  });

  it('refusals: a 400, 413 or 422 is the request\'s fault with the engine\'s words, a 5xx or no engine at all is the engine being down', async () => {
    await withEngine(
      (res, path) => {
        res.writeHead(path.endsWith('/generate') ? 400 : 404, { 'content-type': 'application/json' });
        res.end('{"error": "prompt too long"}');
      },
      async (client) => {
        await expect(texts(client)).rejects.toMatchObject({ name: 'EngineRequestError', statusCode: 400, body: '{"error": "prompt too long"}' });
      },
      { prefix: '/sglang' },
    );
    let downUrl = '';
    await withEngine(
      (res) => {
        res.writeHead(503);
        res.end('overloaded');
      },
      async (client) => {
        downUrl = client.baseUrl;
        await expect(texts(client)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('503: overloaded') });
      },
    );
    const gone = new EngineClient(downUrl);
    await expect(texts(gone)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN' });
    await gone.close();
  });

  it('an abort, or a reader that leaves early, closes the engine\'s connection; an abort also reaches a request still queued', async () => {
    const closed: string[] = [];
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(event('a'));
        res.on('close', () => closed.push(res.writableFinished ? 'finished' : 'cut'));
      },
      async (client) => {
        const left = client.generateStream({ input_ids: [1], sampling_params: {} });
        expect((await left.next()).value?.text).toBe('a');
        await left.return(undefined);
        await waitFor(() => closed.length === 1, { what: 'the engine to see the left stream\'s connection close' });

        const abort = new AbortController();
        const holding = client.generateStream({ input_ids: [1], sampling_params: {} }, abort.signal);
        expect((await holding.next()).value?.text).toBe('a');
        // One connection, held: this one waits in undici's queue.
        const queued = new AbortController();
        const waiting = client.generateStream({ input_ids: [2], sampling_params: {} }, queued.signal).next();
        queued.abort(new Error('client disconnected'));
        await expect(waiting).rejects.toThrow('client disconnected');
        abort.abort(new Error('client disconnected'));
        await expect(holding.next()).rejects.toThrow('client disconnected');
        await waitFor(() => closed.length === 2, { what: 'the engine to see the aborted stream\'s connection close' });
        expect(closed).toEqual(['cut', 'cut']);
      },
      { connections: 1 },
    );
  });

  it('reads a character split between two reads of the socket whole (regression: each read was decoded alone)', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const bytes = Buffer.from(event('prix: 9 €, 気温 🌡') + 'data: [DONE]\n\n');
        const cut = bytes.indexOf(Buffer.from('€')) + 1;
        res.write(bytes.subarray(0, cut));
        // Apart, so that they arrive in two reads.
        setTimeout(() => res.end(bytes.subarray(cut)), 50);
      },
      async (client) => {
        expect(await texts(client)).toEqual(['prix: 9 €, 気温 🌡']);
      },
    );
  });

  it('reads events whose lines end in \\r\\n (split between reads) and whose data spans several lines (regression: no event ever ended)', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const [first, second] = [event('a'), event('ab')].map((e) => e.replace(/\n/g, '\r\n'));
        // The second event's data in two lines, which SSE joins with a line end (JSON reads it as space).
        const split = second!.replace('"text":', '"text":\r\ndata: ');
        const bytes = Buffer.from(`${first}${split}data: [DONE]\r\n\r\n`);
        const cut = bytes.indexOf('\r\n\r\n') + 1;
        res.write(bytes.subarray(0, cut));
        // Apart, so that the \r and its \n arrive in two reads.
        setTimeout(() => res.end(bytes.subarray(cut)), 50);
      },
      async (client) => {
        expect((await texts(client)).at(-1)).toBe('ab');
      },
    );
  });

  it('a stream answered with a plain JSON error, or an event that is not JSON, fails with the engine\'s words (regression: "without [DONE]", a SyntaxError)', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"error": {"message": "model is reloading"}}');
      },
      async (client) => {
        await expect(texts(client)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('model is reloading') });
      },
    );
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(event('a') + 'data: <html>502 Bad Gateway</html>\n\n' + 'data: [DONE]\n\n');
      },
      async (client) => {
        await expect(texts(client)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('502 Bad Gateway') });
      },
    );
  });

  it('a body that ends without [DONE] is an engine failure', async () => {
    await withEngine(
      (res) => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(event('a'));
      },
      async (client) => {
        await expect(texts(client)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('without [DONE]') });
      },
    );
  });
});

describe('EngineClient.generate', () => {
  async function answering(status: number, body: string, run: (client: EngineClient) => Promise<void>): Promise<void> {
    await withServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(body);
      });
    }, run);
  }
  const req = { input_ids: [1], sampling_params: {} };

  it('a 200 carrying an error, no output, or what is not JSON is the engine failing with its words (regression: resolved without meta_info, or a SyntaxError)', async () => {
    await answering(200, '{"error": {"message": "out of memory"}}', async (client) => {
      await expect(client.generate(req)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('out of memory') });
    });
    await answering(200, '{}', async (client) => {
      await expect(client.generate(req)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('without output') });
    });
    await answering(200, 'upstream connect error', async (client) => {
      await expect(client.generate(req)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('upstream connect error') });
    });
    const reply = { text: 'hi', output_ids: [5], meta_info: { id: 'r', finish_reason: { type: 'stop', matched: null }, prompt_tokens: 1, completion_tokens: 1, weight_version: 'v3' } };
    await answering(200, JSON.stringify(reply), async (client) => {
      expect(await client.generate(req)).toEqual(reply);
    });
  });

  it('an abort lets go of a request still queued for a connection at once, as does a signal that fired before the call (regression: held until a connection freed)', async () => {
    let arrived!: () => void;
    const firstArrived = new Promise<void>((resolve) => (arrived = resolve));
    let answerFirst = () => {};
    const server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        answerFirst = () => {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ text: '', output_ids: [], meta_info: { id: 'r', finish_reason: null, prompt_tokens: 1, completion_tokens: 0, weight_version: null } }));
        };
        arrived();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = new EngineClient(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { connections: 1 });
    try {
      const first = client.generate(req);
      await firstArrived;
      // One connection, held by the first: this one waits in undici's queue.
      const gone = new AbortController();
      const queued = client.generate(req, gone.signal);
      gone.abort(new Error('client disconnected'));
      await expect(queued).rejects.toThrow('client disconnected');
      // A signal that fired before the call (a client gone while its request was prepared), streamed or not.
      const left = new AbortController();
      left.abort(new Error('client left earlier'));
      await expect(client.generate(req, left.signal)).rejects.toThrow('client left earlier');
      await expect(client.generateStream(req, left.signal).next()).rejects.toThrow('client left earlier');
      answerFirst();
      await first;
    } finally {
      await client.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

describe('EngineClient and SGLang 0.5.23 weight_versions', () => {
  /** A fake engine whose replies' last event carries `spans` (undefined: no field, as older engines). */
  async function withSpans(spans: unknown, run: (client: EngineClient) => Promise<void>): Promise<void> {
    const meta = (finished: boolean) => ({ id: 'r', finish_reason: finished ? { type: 'length', length: 4 } : null, prompt_tokens: 1, completion_tokens: finished ? 4 : 2, weight_version: 'v4', ...(finished && spans !== undefined ? { weight_versions: spans } : {}) });
    await withServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        if ((JSON.parse(body) as { stream: boolean }).stream) {
          res.writeHead(200, { 'content-type': 'text/event-stream' });
          res.write(`data: ${JSON.stringify({ text: 'ab', output_ids: [1, 2], meta_info: meta(false) })}\n\n`);
          res.end(`data: ${JSON.stringify({ text: 'abcd', output_ids: [1, 2, 3, 4], meta_info: meta(true) })}\n\ndata: [DONE]\n\n`);
        } else {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ text: 'abcd', output_ids: [1, 2, 3, 4], meta_info: meta(true) }));
        }
      });
    }, run);
  }
  const req = { input_ids: [1], sampling_params: {} };
  const streamed = async (client: EngineClient) => {
    let last: unknown = null;
    for await (const r of client.generateStream(req)) last = r;
    return last as { meta_info: { weight_version: string | null } };
  };

  it('a reply whose tokens came from two weight versions fails, streamed or not, naming the spans (it would be recorded as v4\'s alone)', async () => {
    // As SGLang writes it when a weight update lands mid-generation (srt/utils/weight_versions.py).
    const spans = [{ version: 'v3', start: 0, end: 2 }, { version: 'v4', start: 2, end: 4 }];
    await withSpans(spans, async (client) => {
      const failure = { code: 'REEF_ERR_ENGINE_FAILED', message: expect.stringContaining('more than one weight version (v3 for tokens [0, 2), v4 for tokens [2, 4))') };
      await expect(client.generate(req)).rejects.toMatchObject(failure);
      await expect(streamed(client)).rejects.toMatchObject(failure);
    });
  });

  it('one span, or none (older engines), is read as today', async () => {
    for (const spans of [[{ version: 'v4', start: 0, end: 4 }], [], undefined]) {
      await withSpans(spans, async (client) => {
        expect((await client.generate(req)).meta_info.weight_version).toBe('v4');
        expect((await streamed(client)).meta_info.weight_version).toBe('v4');
      });
    }
  });
});

describe('EngineClient admin key', () => {
  // The key unlocks weight loads: sent to generation, it would reach whatever serves /generate.
  it('goes with the admin routes only, never with generation or the info routes', async () => {
    const seen: Array<[string, string | null]> = [];
    await withServer(
      (req, res) => {
        seen.push([req.url!, req.headers.authorization ?? null]);
        req.resume();
        res.setHeader('content-type', 'application/json');
        res.end(req.url === '/generate' ? JSON.stringify({ text: 'x', output_ids: [1], meta_info: { id: 'r', finish_reason: { type: 'stop' }, weight_version: 'v0', output_token_logprobs: [[-0.1, 1, null]] } }) : JSON.stringify({ success: true, message: 'ok', weight_version: 'v1', model_path: 'm', is_generation: true }));
      },
      async (client) => {
        await client.updateWeightsFromDisk('/ckpt/v1', 'v1');
        await client.releaseMemory();
        await client.modelInfo();
        await client.generate({ input_ids: [1], sampling_params: { max_new_tokens: 1 } }).catch(() => {});
      },
      { adminKey: 'k3y' },
    );
    expect(seen).toEqual([
      ['/update_weights_from_disk', 'Bearer k3y'],
      ['/release_memory_occupation', 'Bearer k3y'],
      ['/model_info', null],
      ['/generate', null],
    ]);
  });
});

describe('EngineClient timeout', () => {
  // A busy CPU engine answered a queued non-streamed request after the client's timeout, and the
  // gateway told the agent the engine was down (503 REEF_ERR_ENGINE_DOWN).
  it('an engine that answers nothing within the timeout is slow, not down: REEF_ERR_ENGINE_TIMEOUT naming the setting, non-streamed and streamed', async () => {
    await withServer(
      (req) => {
        req.resume();
      },
      async (client) => {
        const err = await client.generate({ input_ids: [1], sampling_params: {} }).catch((e: unknown) => e);
        expect(err).toMatchObject({ code: 'REEF_ERR_ENGINE_TIMEOUT', status: 504, message: 'engine rollout did not answer within 0.2 s (reef.limits.engine_timeout_s)' });
        const stream = async () => {
          for await (const _ of client.generateStream({ input_ids: [1], sampling_params: {} }));
        };
        await expect(stream()).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_TIMEOUT' });
      },
      { name: 'rollout', requestTimeoutMs: 200, timeoutSetting: 'reef.limits.engine_timeout_s' },
    );
  });

  it('a stream that stops sending between events times out the same way', async () => {
    const event = `data: ${JSON.stringify({ text: 'a', output_ids: [1], meta_info: { id: 'r', finish_reason: null, prompt_tokens: 1, completion_tokens: 1, weight_version: null } })}\n\n`;
    await withServer(
      (req, res) => {
        req.resume();
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(event);
      },
      async (client) => {
        const seen: string[] = [];
        const stream = async () => {
          for await (const r of client.generateStream({ input_ids: [1], sampling_params: {} })) seen.push(r.text);
        };
        await expect(stream()).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_TIMEOUT' });
        expect(seen).toEqual(['a']);
      },
      { requestTimeoutMs: 200 },
    );
  });
});
