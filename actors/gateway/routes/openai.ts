import { errorCodes, type FastifyInstance, type preParsingHookHandler, type FastifyReply, type FastifyRequest } from 'fastify';
import { ReefError } from '../../runtime/errors.js';
import { EngineRequestError } from '../../../cluster/engine-client.js';
import { releaseBody } from '../../../cluster/generate-body.js';
import { completeOnce, prepare, type ChatDeps, type Prepared } from '../chat.js';
import type { RefusedChat } from '../tokenize/prepare.js';
import { streamCompletion, type SseSink } from '../chat-stream.js';
import { sendError, sendReefError } from '../http-errors.js';
import { canSee, type Principal } from '../auth.js';
import { SCENARIO_RE } from '../store/rows.js';
import { sessionHeaders } from '../session-headers.js';
import { rateLimitMessage, type DiskGuard, type ScenarioCap } from '../limits.js';

export function scenarioOf(req: FastifyRequest, fallback: string): string {
  const h = req.headers['x-reef-scenario'];
  const s = (Array.isArray(h) ? h[0] : h)?.trim();
  return s ? s : fallback;
}


export interface OpenAIRouteOptions {
  defaultScenario: string;
  principalOf: (req: FastifyRequest) => Principal;
  disk?: DiskGuard | null;
  scenarios?: ScenarioCap | null;
}

/** What a generating route's preParsing admitted, for its handler; null when it refused. */
export interface Admitted {
  principal: Principal;
  scenario: string;
  /** The record's tags, from `x-reef-tag-*` and the OpenClaw headers (session-headers.ts). */
  tags: Record<string, string>;
  /** Gives the key's slot back, once; called by the handler, or by the response's close if none ran. */
  release(): void;
  handled: boolean;
}
const ADMITTED = Symbol('reef.admitted');
type WithAdmitted = FastifyRequest & { [ADMITTED]?: Admitted };

/** What `admit` let through for this request (set by `admitHook`); the handler marks it handled. */
export function admittedOf(request: FastifyRequest): Admitted {
  const admitted = (request as WithAdmitted)[ADMITTED]!;
  admitted.handled = true;
  return admitted;
}

/**
 * The preParsing hook of a route that takes its body as raw bytes after `admit`. `generates`
 * false (token counting): nothing is generated or stored, so a full disk or a spent token budget
 * does not refuse it; the scenario, the key's rate and its concurrency slot still apply.
 */
export function admitHook(deps: ChatDeps, opts: OpenAIRouteOptions, generates = true): preParsingHookHandler {
  return (request, reply, payload, done) => {
    const admitted = admit(request, reply, deps, opts, generates);
    if (admitted === null) return;
    (request as WithAdmitted)[ADMITTED] = admitted;
    done(null, payload);
  };
}

/**
 * Everything a chat completion can be refused for without its body, checked before the body is
 * read: a refused request never costs the gateway its upload, and `max_concurrency` bounds bodies
 * being received as well as generations. Answers and returns null, or returns what was admitted.
 */
function admit(request: FastifyRequest, reply: FastifyReply, deps: ChatDeps, opts: OpenAIRouteOptions, generates: boolean): Admitted | null {
  const principal = opts.principalOf(request);
  const scenario = scenarioOf(request, opts.defaultScenario);
  if (!SCENARIO_RE.test(scenario)) {
    sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `x-reef-scenario ${JSON.stringify(scenario)} is not a valid scenario name ([a-z0-9][a-z0-9._-]{0,63})`, { param: 'x-reef-scenario' });
    return null;
  }
  if (!canSee(principal, scenario)) {
    sendReefError(reply, new ReefError('REEF_ERR_FORBIDDEN', { scenario }));
    return null;
  }
  const read = sessionHeaders(request.headers);
  if ('error' in read) {
    sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', read.error, { param: read.param });
    return null;
  }
  // Before the engine generates: at a full disk the record's commit would fail after it.
  const full = generates ? (opts.disk?.check() ?? null) : null;
  if (full !== null) {
    sendError(reply, full.code, full.message, { retryAfterS: 30 });
    return null;
  }
  // A spent token budget is known before the body: the request's own cost is charged once it is
  // tokenized (the handler).
  const spent = generates ? (principal.tokens?.emptyFor() ?? 0) : 0;
  if (spent > 0) {
    sendError(reply, 'REEF_ERR_RATE_LIMIT', rateLimitMessage(principal.tokens!.perMinute, 'tokens', `${principal.setting}tokens_per_minute`, '', spent), { retryAfterS: spent });
    return null;
  }
  if (!principal.limiter.tryAcquire()) {
    sendError(reply, 'REEF_ERR_RATE_LIMITED', new ReefError('REEF_ERR_RATE_LIMITED', { limit: principal.limiter.limit }).message, { retryAfterS: 1 });
    return null;
  }
  // Last, after every refusal that does not count a scenario: a refused request must not use up
  // a place under the cap.
  const capped = opts.scenarios?.admit(scenario) ?? null;
  if (capped !== null) {
    principal.limiter.release();
    sendReefError(reply, capped, 'x-reef-scenario');
    return null;
  }
  let released = false;
  const admitted: Admitted = {
    principal,
    scenario,
    tags: read.tags,
    handled: false,
    release: () => {
      if (released) return;
      released = true;
      principal.limiter.release();
    },
  };
  // A body that never arrives whole (timeout, reset, too large) runs no handler to give the slot back.
  reply.raw.once('close', () => {
    if (!admitted.handled) admitted.release();
  });
  return admitted;
}

export function registerOpenAIRoutes(app: FastifyInstance, deps: ChatDeps, opts: OpenAIRouteOptions): void {
  const model = () => ({ id: deps.modelName, object: 'model', created: 0, owned_by: 'reef', max_model_len: deps.tokenizer.contextLength });
  app.get('/v1/models', async () => ({ object: 'list', data: [model()] }));
  // The SDKs' models.retrieve(id); some clients check the model they were configured with this way.
  app.get<{ Params: { model: string } }>('/v1/models/:model', async (request, reply) => {
    if (request.params.model === deps.modelName) return model();
    return sendReefError(reply, new ReefError('REEF_ERR_NOT_FOUND', { what: `model ${JSON.stringify(request.params.model)} (this gateway serves ${JSON.stringify(deps.modelName)})` }), 'model');
  });

  // Chat completions take their body as raw bytes: parsing, validation and serialisation happen
  // on the tokenizer worker that also renders the prompt (tokenize/prepare.ts), so an
  // OpenClaw-sized transcript never costs the event loop a parse or a structured clone. The
  // parser is scoped to this plugin; every other route keeps fastify's JSON parser.
  void app.register(async (scope) => {
    scope.removeContentTypeParser('application/json');
    scope.addContentTypeParser('application/json', (request, payload, done) => readSharedBody(request, payload, done));
    scope.addHook('preParsing', admitHook(deps, opts));
    scope.post('/v1/chat/completions', async (request, reply) =>
      serveChat(deps, request, reply, request.body, (p) => (p.stream ? stream(deps, p, reply) : once(deps, p, reply))),
    );
  });
}

/**
 * A generating route's handler around its pipeline: `body` (a chat-completions body, raw bytes) is
 * prepared, charged to the key's token budget, then `run`; whatever fails answers as an error. The
 * key's slot is given back at the end. `refused` may restate a refusal in the route's own terms.
 */
export async function serveChat(deps: ChatDeps, request: FastifyRequest, reply: FastifyReply, body: unknown, run: (p: Prepared) => Promise<FastifyReply>, refused: (r: RefusedChat) => RefusedChat = (r) => r): Promise<FastifyReply> {
  const admitted = admittedOf(request);
  const { principal, scenario, tags } = admitted;
  deps.metrics.inflightCount++;
  let lease: Int32Array | null = null;
  try {
    // text/plain arrives as a string (fastify's text parser): not a request object.
    if (!(body instanceof Uint8Array)) return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', 'body: request body must be a JSON object');
    // Keyed as the judge keys sessions: another key's request with the same tag is another session.
    const sessionKey = tags['session'] ? `${scenario}\u0000${principal.id}\u0000${tags['session']}` : null;
    const ctx = { scenario, keyId: principal.id, tags, sessionKey, startedAt: Date.now() };
    const p = await prepare(deps, body, ctx);
    if (!('id' in p)) {
      const r = refused(p);
      return sendError(reply, r.code, r.message, { param: r.param });
    }
    lease = p.bodyLease;
    // Charged whole before generating, as OpenAI counts max_tokens: a key cannot pass its
    // budget by keeping long generations in flight, and what it is charged is known up front.
    if (principal.tokens !== null) {
      const cost = p.promptIds.length + p.maxNewTokens;
      if (cost > principal.tokens.perMinute) {
        return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `this request needs ${cost} tokens (${p.promptIds.length} in the prompt, ${p.maxNewTokens} of completion budget), more than ${principal.setting}tokens_per_minute (${principal.tokens.perMinute}) allows in a minute: lower max_tokens or shorten the messages`, { param: 'max_tokens' });
      }
      const wait = principal.tokens.take(cost);
      if (wait > 0) return sendError(reply, 'REEF_ERR_RATE_LIMIT', rateLimitMessage(principal.tokens.perMinute, 'tokens', `${principal.setting}tokens_per_minute`, `, and this request needs ${cost}`, wait), { retryAfterS: wait });
    }
    return await run(p);
  } catch (err) {
    return replyWithError(reply, err);
  } finally {
    // The engine request has ended either way: the session's next body may reuse this one's memory.
    releaseBody(lease);
    deps.metrics.inflightCount--;
    admitted.release();
  }
}

/** What a body's reading starts with: an OpenClaw turn (~40 KB) fits, so most bodies are never copied. */
export const FIRST_BODY_BUFFER = 64 * 1024;

/**
 * Reads a request body into shared memory. The body goes to a tokenizer worker and is kept by the
 * record; in a SharedArrayBuffer it crosses to the worker without a copy on either side (a 38 KB
 * OpenClaw body: ~50 µs less per round trip). Nothing writes to it after this.
 * Memory follows the bytes received, not the content-length declared: a client that declares
 * 64 MiB and sends nothing holds at most the first buffer. The buffer doubles as bytes arrive, up
 * to the declared length, so a body costs at most twice its size while it is read, and one copy
 * per doubling (log2 of its size in 64 KiB steps).
 * Limits and errors as fastify's own reader: 413 past the body limit, 400 for a body shorter than
 * its content-length or a broken upload.
 */
export function readSharedBody(request: FastifyRequest, payload: NodeJS.ReadableStream, done: (err: Error | null, body?: unknown) => void): void {
  const limit = request.routeOptions.bodyLimit ?? Number.POSITIVE_INFINITY;
  const raw = Number(request.headers['content-length']);
  const declared = Number.isSafeInteger(raw) && raw >= 0 ? raw : null;
  if (declared !== null && declared > limit) return done(new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE());
  // Without a content-length the final size is known at the end only: one last copy then.
  let body = Buffer.from(new SharedArrayBuffer(Math.min(declared ?? FIRST_BODY_BUFFER, FIRST_BODY_BUFFER)));
  let received = 0;
  const finish = (err: Error | null, value?: unknown) => {
    payload.removeListener('data', onData);
    payload.removeListener('end', onEnd);
    payload.removeListener('error', onError);
    done(err, value);
  };
  const onData = (chunk: Buffer | string) => {
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
    const need = received + bytes.length;
    if (need > limit) return finish(new errorCodes.FST_ERR_CTP_BODY_TOO_LARGE());
    if (declared !== null && need > declared) return finish(new errorCodes.FST_ERR_CTP_INVALID_CONTENT_LENGTH());
    if (need > body.length) {
      let size = body.length * 2;
      while (size < need) size *= 2;
      const grown = Buffer.from(new SharedArrayBuffer(declared === null ? size : Math.min(size, declared)));
      grown.set(body.subarray(0, received));
      body = grown;
    }
    body.set(bytes, received);
    received = need;
  };
  const onEnd = () => {
    if (declared !== null && received !== declared) return finish(new errorCodes.FST_ERR_CTP_INVALID_CONTENT_LENGTH());
    if (received !== body.length) {
      const exact = Buffer.from(new SharedArrayBuffer(received));
      exact.set(body.subarray(0, received));
      body = exact;
    }
    finish(null, body);
  };
  const onError = (err: Error & { statusCode?: number }) => {
    if (!(typeof err.statusCode === 'number' && err.statusCode >= 400)) err.statusCode = 400;
    finish(err);
  };
  payload.on('data', onData);
  payload.on('end', onEnd);
  payload.on('error', onError);
  payload.resume();
}

export function replyWithError(reply: FastifyReply, err: unknown): FastifyReply {
  if (reply.sent || reply.raw.headersSent) {
    reply.raw.end();
    return reply;
  }
  if (err instanceof ReefError) {
    if (err.code === 'REEF_ERR_ENGINE_DOWN') return sendError(reply, err.code, err.message, { retryAfterS: 2 });
    return sendReefError(reply, err);
  }
  if (err instanceof EngineRequestError) {
    // The engine refused the request itself (e.g. too long): the client's problem, not ours.
    return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `engine rejected the request: ${err.body.slice(0, 500)}`, { status: err.statusCode < 500 ? 400 : 502 });
  }
  reply.log.error({ err }, 'chat completion failed');
  return sendError(reply, 'REEF_ERR_HANDLER', `internal error: ${(err as Error).message}`, { status: 500 });
}

/**
 * A signal that aborts when the client's connection closes before its response is finished;
 * `stop()` ends the watch.
 */
export function watchClient(res: FastifyReply['raw']): { signal: AbortSignal; stop(): void } {
  const gone = new AbortController();
  const onClose = () => {
    if (!res.writableFinished) gone.abort(new Error('client disconnected'));
  };
  // A client that left while its body was prepared closed the response before this watch began:
  // its 'close' will not come again, and the generation nobody reads held the key's slot to the end.
  if (res.destroyed) onClose();
  res.on('close', onClose);
  return { signal: gone.signal, stop: () => res.off('close', onClose) };
}

/** A non-streamed completion, cut off (and recorded `aborted`) when the client leaves before its answer. */
async function once(deps: ChatDeps, p: Prepared, reply: FastifyReply): Promise<FastifyReply> {
  const gone = watchClient(reply.raw);
  try {
    const done = await completeOnce(deps, p, gone.signal);
    if (done === null) {
      reply.hijack(); // nobody to answer
      return reply;
    }
    return reply.header('x-reef-agent-record-id', done.recordId).send(done.body);
  } finally {
    gone.stop();
  }
}

/** How a stream's events are written: OpenAI's `data:` lines ending in `[DONE]`, or another API's. */
export interface SseFraming {
  /** The text of one event the pipeline sends (an OpenAI chunk, or an error body). */
  event(data: unknown): string;
  /** The text that ends the stream: its last events, then whatever closes it. */
  end(events: readonly unknown[]): string;
}

const OPENAI_FRAMING: SseFraming = {
  event: (data) => `data: ${JSON.stringify(data)}\n\n`,
  end: (events) => {
    let text = '';
    for (const e of events) text += `data: ${JSON.stringify(e)}\n\n`;
    return `${text}data: [DONE]\n\n`;
  },
};

export async function stream(deps: ChatDeps, p: Prepared, reply: FastifyReply, framing: SseFraming = OPENAI_FRAMING): Promise<FastifyReply> {
  const res = reply.raw;
  const gone = watchClient(res);
  // Headers go out with the first event, so that a failure before it (engine down, engine refusal,
  // weight-swap wait timed out) can still answer with its own status.
  let started = false;
  /** Whether the client can still be written to; the headers go out before the first write. */
  const writable = (): boolean => {
    if (gone.signal.aborted || res.destroyed) return false;
    if (started) return true;
    started = true;
    reply.hijack();
    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    return true;
  };
  const write = (s: string) =>
    new Promise<void>((resolve) => {
      if (!writable() || res.write(s)) return resolve();
      // Backpressure: wait for the socket to drain, or for the client to leave.
      const done = () => {
        res.off('drain', done);
        res.off('close', done);
        resolve();
      };
      res.once('drain', done);
      res.once('close', done);
    });
  const sink: SseSink = {
    send: (data) => {
      const text = framing.event(data);
      return text ? write(text) : Promise.resolve();
    },
    // Ended here rather than once the handler has unwound: the last write then goes out at once,
    // not after the promise chain back up to this route (~0.1 ms measured on an OpenClaw turn).
    sendDone: async (events = []) => {
      const text = framing.end(events);
      if (writable()) res.end(text);
    },
    signal: gone.signal,
  };
  try {
    await streamCompletion(deps, p, sink);
  } catch (err) {
    // A client that left before the first event needs no answer.
    if (!started && gone.signal.aborted) {
      reply.hijack();
      return reply;
    }
    throw err;
  } finally {
    gone.stop();
    if (started && !res.destroyed && !res.writableEnded) res.end();
  }
  return reply;
}
