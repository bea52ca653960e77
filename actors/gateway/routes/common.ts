import type { FastifyReply, FastifyRequest, preParsingHookHandler } from 'fastify';
import { ReefError } from '../../runtime/errors.js';
import { EngineRequestError } from '../../../cluster/engine-client.js';
import { releaseBody } from '../../../cluster/generate-body.js';
import { completeOnce, type ChatDeps, type Prepared } from '../chat.js';
import { streamCompletion, type SseSink } from '../chat-stream.js';
import { sendError, sendReefError } from '../http-errors.js';
import { canSee, type Principal } from '../auth.js';
import { SCENARIO_RE } from '../store/rows.js';
import { sessionHeaders } from '../session-headers.js';
import { rateLimitMessage, type DiskGuard, type ScenarioCap } from '../limits.js';
import type { ResponseStore } from '../store/responses.js';

/**
 * What the generating routes (chat completions, responses, messages) share: admission before the body,
 * the token charge, error answers and the event stream.
 */

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
  /** Where `/v1/responses` keeps stored responses; null: the Responses API is not served. @default null */
  responses?: ResponseStore | null;
}

/** What the chat route's preParsing admitted, for its handler; null when it refused. */
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

/** What `admit` let through for this request, marked handled: from here on the handler gives the slot back. */
export function takeAdmitted(request: FastifyRequest): Admitted {
  const admitted = (request as WithAdmitted)[ADMITTED]!;
  admitted.handled = true;
  return admitted;
}

/**
 * Admits a request in a preParsing hook (`admit`), keeping what it admitted for the handler.
 * `generates` false (token counting): nothing is generated or stored, so a full disk or a spent
 * token budget does not refuse it; the scenario, the key's rate and its concurrency slot still apply.
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
 * Everything a generation (a chat completion, a response) can be refused for without its body, checked before the body is
 * read: a refused request never costs the gateway its upload, and `max_concurrency` bounds bodies
 * being received as well as generations. Answers and returns null, or returns what was admitted.
 */
export function admit(request: FastifyRequest, reply: FastifyReply, deps: ChatDeps, opts: OpenAIRouteOptions, generates = true): Admitted | null {
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
  // A response's session may come from its chain (routes/responses.ts), which the body names.
  const read = sessionHeaders(request.headers, request.routeOptions.url === '/v1/responses');
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


/**
 * Charges a key's token budget for a prepared request, whole before generating, as OpenAI counts
 * max_tokens: a key cannot pass its budget by keeping long generations in flight, and what it is
 * charged is known up front. Answers the refusal, or null when the request may go on.
 */
export function chargeTokens(principal: Principal, p: Prepared, reply: FastifyReply, budgetParam = 'max_tokens'): FastifyReply | null {
  if (principal.tokens === null) return null;
  const cost = p.promptIds.length + p.maxNewTokens;
  if (cost > principal.tokens.perMinute) {
    return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `this request needs ${cost} tokens (${p.promptIds.length} in the prompt, ${p.maxNewTokens} of completion budget), more than ${principal.setting}tokens_per_minute (${principal.tokens.perMinute}) allows in a minute: lower ${budgetParam} or shorten the ${budgetParam === 'max_tokens' ? 'messages' : 'input'}`, { param: budgetParam });
  }
  const wait = principal.tokens.take(cost);
  if (wait > 0) return sendError(reply, 'REEF_ERR_RATE_LIMIT', rateLimitMessage(principal.tokens.perMinute, 'tokens', `${principal.setting}tokens_per_minute`, `, and this request needs ${cost}`, wait), { retryAfterS: wait });
  return null;
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


/** A server-sent event stream on a reply: its headers go out with the first write. */
export interface EventStream {
  /** Writes text; resolves once the socket took it (backpressure), or at once when the client is gone. */
  write(text: string): Promise<void>;
  /** Writes the last text and ends the response. */
  end(text: string): void;
  /** Aborted when the client goes away. */
  readonly signal: AbortSignal;
  /** Whether anything was written (the headers went out). */
  readonly started: boolean;
  /** Ends the client watch; ends the response if it was started and is still open. */
  close(): void;
}

export function openEventStream(reply: FastifyReply): EventStream {
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
  return {
    write: (s) =>
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
      }),
    end: (s) => {
      if (writable()) res.end(s);
    },
    signal: gone.signal,
    get started() {
      return started;
    },
    close: () => {
      gone.stop();
      if (started && !res.destroyed && !res.writableEnded) res.end();
    },
  };
}

/**
 * A body a route made (a translated request) as the chat route's own bodies arrive: JSON bytes in
 * shared memory, which cross to a tokenizer worker without a copy.
 */
export function sharedJson(value: unknown): Uint8Array {
  const text = JSON.stringify(value);
  const out = Buffer.from(new SharedArrayBuffer(Buffer.byteLength(text)));
  out.write(text);
  return out;
}

/**
 * The key the tokenizer's body memory knows a session's requests by: a session tag is a client's
 * word, so another key's request with the same tag is another session, as the judge keys them.
 */
export function sessionCacheKey(scenario: string, keyId: string, session: string | null | undefined): string | null {
  return session ? `${scenario}\u0000${keyId}\u0000${session}` : null;
}

/**
 * The frame of a generating route's handler: counts the request in flight, answers whatever `fn`
 * throws as an error, and at the end gives back the body memory of the request `hold` was given
 * (the session's next body may reuse it once its engine request has ended) and the key's slot.
 */
export async function generating(deps: ChatDeps, request: FastifyRequest, reply: FastifyReply, fn: (admitted: Admitted, hold: (p: Prepared) => void) => Promise<FastifyReply>): Promise<FastifyReply> {
  const admitted = takeAdmitted(request);
  deps.metrics.inflightCount++;
  let lease: Int32Array | null = null;
  try {
    return await fn(admitted, (p) => {
      lease = p.bodyLease;
    });
  } catch (err) {
    return replyWithError(reply, err);
  } finally {
    releaseBody(lease);
    deps.metrics.inflightCount--;
    admitted.release();
  }
}

/**
 * A completion not streamed, cut off (and recorded `aborted`) when the client leaves before its
 * answer; `shape` turns the chat-completions answer into the route's own (and may store it first).
 */
export async function answerOnce(deps: ChatDeps, p: Prepared, reply: FastifyReply, shape: (body: unknown) => unknown = (body) => body): Promise<FastifyReply> {
  const gone = watchClient(reply.raw);
  try {
    const done = await completeOnce(deps, p, gone.signal);
    if (done === null) {
      reply.hijack(); // nobody to answer
      return reply;
    }
    const answer = await shape(done.body);
    return reply.header('x-reef-agent-record-id', done.recordId).send(answer);
  } finally {
    gone.stop();
  }
}

/** A streamed completion: the pipeline's events go to the sink `sinkOf` makes on the reply's event stream. */
export async function streamTo(deps: ChatDeps, p: Prepared, reply: FastifyReply, sinkOf: (sse: EventStream) => SseSink): Promise<FastifyReply> {
  const sse = openEventStream(reply);
  try {
    await streamCompletion(deps, p, sinkOf(sse));
  } catch (err) {
    // A client that left before the first event needs no answer.
    if (!sse.started && sse.signal.aborted) {
      reply.hijack();
      return reply;
    }
    throw err;
  } finally {
    sse.close();
  }
  return reply;
}
