import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A test double of an inference engine that speaks the engine HTTP API of docs/internals.md
 * (the SGLang native subset) and, for PRM tests, OpenAI `/v1/chat/completions`. It generates
 * scripted text, one token per piece, with deterministic logprobs and top-K, so tests and
 * benchmarks can drive the gateway and the judge without a model.
 */

export interface FakeGeneration {
  /** Output pieces; each piece is one token. */
  pieces: string[];
  finish?: 'stop' | 'length';
}

export interface FakeEngineOptions {
  /** Decides the output from the request body (`input_ids`/`text`, or OpenAI `messages`). */
  respond?: (req: { inputIds: number[] | null; text: string | null; messages: unknown[] | null; body: Record<string, unknown> }) => FakeGeneration;
  /**
   * Delay before a non-streamed reply (either API), decided per request; the wait ends early when
   * the client goes away. For tests that need a call in flight (a PRM actor killed mid-vote).
   */
  delayMs?: (req: { inputIds: number[] | null; text: string | null; messages: unknown[] | null; body: Record<string, unknown>; headers: Record<string, string | string[] | undefined> }) => number;
  /** Delay before each streamed token, ms. @default 0 */
  tokenDelayMs?: number;
  /** Fail `/generate` with this HTTP status (engine trouble) until cleared. */
  failWith?: number | null;
  /** Answer `/generate` with exactly this, streamed or not (a broken engine, or a proxy before it), until cleared. */
  answerWith?: { status: number; contentType: string; body: string } | null;
  /** Cut the stream after this many tokens without [DONE] (an engine crash mid-stream). */
  dieAfterTokens?: number | null;
  weightVersion?: string;
  contextLength?: number;
  /**
   * How many of the latest request bodies `requests` keeps. A long benchmark sends hundreds of
   * thousands of 20k-id prompts, and keeping them all ran the double out of memory in ~80 s.
   * @default Infinity (tests look at every request)
   */
  keepRequests?: number;
}

export interface FakeEngine {
  url: string;
  server: Server;
  options: FakeEngineOptions;
  /** Bodies of the /generate and /v1/chat/completions requests (the last `keepRequests`), in arrival order. */
  requests: Array<Record<string, unknown>>;
  paused: boolean;
  close(): Promise<void>;
}

const DEFAULT: FakeGeneration = { pieces: ['Hello', ' from', ' the', ' fake', ' engine', '.'] };

function tokenId(piece: string): number {
  let h = 7;
  for (const ch of piece) h = (h * 31 + ch.codePointAt(0)!) % 50_000;
  return 100 + h;
}

/**
 * Where `sampling_params.stop` ends a generation, as SGLang does: after the first piece whose text
 * holds a stop string; only the final event's text is cut before the match (the earlier events
 * carried the pieces as they came, the stop string's start included).
 */
function stopAt(g: FakeGeneration, stop: unknown): { end: number; cut: number; matched: string } | null {
  const stops = (Array.isArray(stop) ? stop : typeof stop === 'string' ? [stop] : []).filter((s): s is string => typeof s === 'string' && s !== '');
  let text = '';
  for (let t = 1; t <= g.pieces.length; t++) {
    text += g.pieces[t - 1];
    let best: { cut: number; matched: string } | null = null;
    for (const s of stops) {
      const at = text.indexOf(s);
      if (at >= 0 && (best === null || at < best.cut)) best = { cut: at, matched: s };
    }
    if (best) return { end: t, ...best };
  }
  return null;
}

function meta(g: FakeGeneration, upto: number, promptTokens: number, K: number, wv: string, rid: string, done: boolean, stopped: { cut: number; matched: string } | null = null) {
  const ids = g.pieces.slice(0, upto).map(tokenId);
  const text = g.pieces.slice(0, upto).join('');
  return {
    text: done && stopped ? text.slice(0, stopped.cut) : text,
    output_ids: ids,
    meta_info: {
      id: rid,
      finish_reason: done ? { type: g.finish ?? 'stop', matched: done && stopped ? stopped.matched : null } : null,
      prompt_tokens: promptTokens,
      completion_tokens: ids.length,
      output_token_logprobs: ids.map((id, t) => [-0.1 - t * 0.01, id, null]),
      output_top_logprobs: ids.map((id, t) => Array.from({ length: K }, (_, k) => [-0.1 - t * 0.01 - k, k === 0 ? id : id + k, null])),
      weight_version: wv,
    },
  };
}

async function readBody(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  const raw = Buffer.concat(chunks).toString('utf8');
  return raw ? (JSON.parse(raw) as Record<string, unknown>) : {};
}

export async function startFakeEngine(options: FakeEngineOptions = {}): Promise<FakeEngine> {
  const state: FakeEngine = { url: '', server: null as unknown as Server, options, requests: [], paused: false, close: async () => {} };
  let rid = 0;
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const json = (code: number, body: unknown) => {
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    const wv = options.weightVersion ?? 'v0';
    if (req.method === 'GET' && req.url === '/health') return json(200, {});
    if (req.method === 'GET' && req.url === '/model_info') return json(200, { model_path: 'fake', is_generation: true, weight_version: wv, max_context_length: options.contextLength ?? 32768 });
    if (req.method === 'POST' && req.url === '/pause_generation') return (state.paused = true), json(200, {});
    if (req.method === 'POST' && req.url === '/continue_generation') return (state.paused = false), json(200, {});
    if (req.method === 'POST' && req.url === '/flush_cache') return json(200, {});
    if (req.method === 'POST' && req.url === '/update_weights_from_disk') {
      const body = await readBody(req);
      options.weightVersion = String(body.weight_version ?? 'v?');
      return json(200, { success: true, message: 'ok', weight_version: options.weightVersion });
    }
    const isOpenAI = req.method === 'POST' && req.url === '/v1/chat/completions';
    if (!(req.method === 'POST' && (req.url === '/generate' || isOpenAI))) return json(404, { error: 'not found' });
    const body = await readBody(req);
    state.requests.push(body);
    if (state.requests.length > (options.keepRequests ?? Number.POSITIVE_INFINITY)) state.requests.shift();
    if (options.failWith) return json(options.failWith, { error: { message: 'fake engine failure' } });
    if (options.answerWith) {
      res.writeHead(options.answerWith.status, { 'content-type': options.answerWith.contentType });
      return res.end(options.answerWith.body);
    }
    const inputIds = Array.isArray(body.input_ids) ? (body.input_ids as number[]) : null;
    const g = (options.respond ?? (() => DEFAULT))({ inputIds, text: typeof body.text === 'string' ? body.text : null, messages: Array.isArray(body.messages) ? (body.messages as unknown[]) : null, body });
    const wait = options.delayMs?.({ inputIds, text: typeof body.text === 'string' ? body.text : null, messages: Array.isArray(body.messages) ? (body.messages as unknown[]) : null, body, headers: req.headers }) ?? 0;
    if (wait > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, wait);
        res.once('close', () => {
          clearTimeout(timer);
          resolve();
        });
      });
      if (res.destroyed || res.writableEnded) return;
    }
    const id = `fake-${++rid}`;
    const promptTokens = inputIds?.length ?? 0;
    if (isOpenAI) {
      const text = g.pieces.join('');
      return json(200, { id, object: 'chat.completion', created: 0, model: String(body.model ?? 'fake'), choices: [{ index: 0, message: { role: 'assistant', content: text }, finish_reason: g.finish ?? 'stop' }], usage: { prompt_tokens: 0, completion_tokens: g.pieces.length, total_tokens: g.pieces.length } });
    }
    const K = Number(body.top_logprobs_num ?? 0);
    const stopped = stopAt(g, (body.sampling_params as Record<string, unknown> | undefined)?.stop);
    const end = stopped?.end ?? g.pieces.length;
    if (!body.stream) return json(200, meta(g, end, promptTokens, K, wv, id, true, stopped));
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (let t = 1; t <= end; t++) {
      if (options.tokenDelayMs) await new Promise((r) => setTimeout(r, options.tokenDelayMs));
      if (res.destroyed) return;
      if (options.dieAfterTokens != null && t > options.dieAfterTokens) return res.destroy();
      res.write(`data: ${JSON.stringify(meta(g, t, promptTokens, K, wv, id, t === end, stopped))}\n\n`);
    }
    res.end('data: [DONE]\n\n');
  };
  const server = createServer((req, res) => {
    handle(req, res).catch((err) => {
      if (!res.headersSent) res.writeHead(500);
      res.end(String(err));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  state.server = server;
  state.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  state.close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return state;
}
