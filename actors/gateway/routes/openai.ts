import { errorCodes, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import { ReefError } from '../../runtime/errors.js';
import { prepare, type ChatDeps, type Prepared } from '../chat.js';
import type { RefusedChat } from '../tokenize/prepare.js';
import { sendError, sendReefError } from '../http-errors.js';
import { admitHook, answerOnce, chargeTokens, generating, sessionCacheKey, streamTo, type OpenAIRouteOptions } from './common.js';
import { registerResponsesCreate, registerResponsesStore } from './responses.js';

export { scenarioOf, replyWithError, watchClient, type OpenAIRouteOptions } from './common.js';

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
      serveChat(deps, request, reply, request.body, (p) => (p.stream ? stream(deps, p, reply) : answerOnce(deps, p, reply))),
    );
    if (opts.responses) registerResponsesCreate(scope, deps, opts.responses);
  });
  if (opts.responses) registerResponsesStore(app, opts, opts.responses);
}

/**
 * A generating route's handler around the chat pipeline: `body` (a chat-completions body, raw
 * bytes) is prepared, charged to the key's token budget, then `run`; whatever fails answers as an
 * error, and the key's slot is given back at the end. `refused` may restate a refusal in the
 * route's own terms (the Messages API's field names).
 */
export function serveChat(deps: ChatDeps, request: FastifyRequest, reply: FastifyReply, body: unknown, run: (p: Prepared) => Promise<FastifyReply>, refused: (r: RefusedChat) => RefusedChat = (r) => r): Promise<FastifyReply> {
  return generating(deps, request, reply, async ({ principal, scenario, tags }, hold) => {
    // text/plain arrives as a string (fastify's text parser): not a request object.
    if (!(body instanceof Uint8Array)) return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', 'body: request body must be a JSON object');
    const ctx = { scenario, keyId: principal.id, tags, sessionKey: sessionCacheKey(scenario, principal.id, tags['session']), startedAt: Date.now() };
    const p = await prepare(deps, body, ctx);
    if (!('id' in p)) {
      const r = refused(p);
      return sendError(reply, r.code, r.message, { param: r.param });
    }
    hold(p);
    const charged = chargeTokens(principal, p, reply);
    if (charged !== null) return charged;
    return run(p);
  });
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

/** How a stream's events are written: OpenAI's `data:` lines ending in `[DONE]`, or another API's. */
export interface SseFraming {
  /** The text of one event the pipeline sends (an OpenAI chunk, or an error body); '' sends nothing. */
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

export function stream(deps: ChatDeps, p: Prepared, reply: FastifyReply, framing: SseFraming = OPENAI_FRAMING): Promise<FastifyReply> {
  return streamTo(deps, p, reply, (sse) => ({
    send: (data) => {
      const text = framing.event(data);
      return text ? sse.write(text) : Promise.resolve();
    },
    // Ended here rather than once the handler has unwound: the last write then goes out at once,
    // not after the promise chain back up to this route (~0.1 ms measured on an OpenClaw turn).
    sendDone: async (events = []) => sse.end(framing.end(events)),
    signal: sse.signal,
  }));
}
