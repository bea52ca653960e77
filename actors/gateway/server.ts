import { isUtf8 } from 'node:buffer';
import { maxHeaderSize, STATUS_CODES } from 'node:http';
import Fastify, { type FastifyInstance, type FastifyRequest } from 'fastify';
import { Authenticator, canSee, type Principal } from './auth.js';
import { AuthFailureThrottle } from './auth-throttle.js';
import { BrowserGuard, isJsonContentType, STATE_CHANGING, type BrowserGuardOptions } from './browser-guard.js';
import type { ChatDeps } from './chat.js';
import { ReefError } from '../runtime/errors.js';
import { errorBody, sendError, sendReefError } from './http-errors.js';
import { parsedBodyProblem } from './body-checks.js';
import { registerOpenAIRoutes } from './routes/openai.js';
import { PUBLIC_UI_ROUTES, registerUiRoutes } from './routes/ui.js';
import type { ResponseStore } from './store/responses.js';
import { registerAnthropicRoutes } from './routes/anthropic.js';
import { NotUtf8Error } from './tokenize/utf8.js';
import { DEFAULT_LIMITS, rateLimitMessage, type DiskGuard, type GatewayLimits, type ScenarioCap } from './limits.js';

/** 64 MiB: OpenClaw resends whole transcripts with large tool outputs every turn. */
export const BODY_LIMIT = DEFAULT_LIMITS.bodyBytes;

export interface GatewayServerOptions {
  chat: ChatDeps;
  auth: Authenticator;
  defaultScenario: string;
  /** What a keyless gateway lets browsers name it by (`reef.host`, `reef.allowed_hosts`, `reef.allowed_origins`). @default { bindHost: '127.0.0.1' } */
  browser?: BrowserGuardOptions;
  /** Registers the /reef/* API (records, reports, scenarios, status, releases). */
  registerReefRoutes?: (app: FastifyInstance, principalOf: (req: FastifyRequest) => Principal) => void;
  logger?: boolean;
  /** Timeouts, connection cap and body limits (`reef.limits`). @default DEFAULT_LIMITS */
  limits?: GatewayLimits;
  /** Refuses generation when the data dir's disk is nearly full; null = never refused. @default null */
  disk?: DiskGuard | null;
  /** Bounds how many scenarios there are; null = unbounded. @default null */
  scenarios?: ScenarioCap | null;
  /** Where `/v1/responses` stores responses; null: the Responses API is not served. @default null */
  responses?: ResponseStore | null;
}

/**
 * How often Node looks for requests past their headers or request timeout. Its default, 30 s, would
 * let a 1 s timeout run 31 s; a quarter of the shorter timeout keeps the overrun to a quarter.
 */
export function checkingIntervalMs(limits: GatewayLimits): number {
  return Math.min(30_000, Math.max(100, Math.min(limits.headersTimeoutMs, limits.requestTimeoutMs) / 4));
}

/** Sets the socket's inactivity timeout (0: none); requests injected without a socket (tests) have none to set. */
function socketTimeout(request: FastifyRequest, ms: number): void {
  const socket = request.raw.socket as { setTimeout?: unknown } | undefined;
  if (typeof socket?.setTimeout === 'function') request.raw.socket.setTimeout(ms);
}

/** Whether the request has body bytes that have not been read yet. */
function bodyUnread(request: FastifyRequest): boolean {
  return !request.raw.complete && (request.headers['transfer-encoding'] !== undefined || Number(request.headers['content-length'] ?? 0) > 0);
}

/**
 * The OpenAI SDKs delete a stored response with no body and no content type. DELETE is never a
 * request a page may send without a preflight, whatever its content type, so this one route
 * takes it as they send it.
 */
function bodylessDelete(request: FastifyRequest): boolean {
  return request.method === 'DELETE' && request.routeOptions.url === '/v1/responses/:id' && request.headers['content-type'] === undefined && !bodyUnread(request) && request.headers['transfer-encoding'] === undefined;
}

const PRINCIPAL = Symbol('reef.principal');
type WithPrincipal = FastifyRequest & { [PRINCIPAL]?: Principal };

export function buildGatewayServer(opts: GatewayServerOptions): FastifyInstance {
  const limits = opts.limits ?? DEFAULT_LIMITS;
  const app = Fastify({
    logger: opts.logger ?? false,
    bodyLimit: limits.bodyBytes,
    // Keep-alive clients (the SDKs) reuse sockets across turns.
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    // Node's requestTimeout runs from a request's first byte until it has been received whole; the
    // response is not timed, so a generation streamed for ten minutes is not cut. No socket
    // inactivity timeout (fastify's connectionTimeout): a non-streamed completion sends nothing
    // until it is done, which for a long generation is minutes. Bodies get their own idle bound
    // (preParsing below).
    requestTimeout: limits.requestTimeoutMs,
    http: { headersTimeout: limits.headersTimeoutMs, connectionsCheckingInterval: checkingIntervalMs(limits) },
    // Fastify's own 503 while closing has its own body and no Retry-After; onRequest answers instead.
    return503OnClosing: false,
    // Errors fastify raises before routing (a URL that is not valid percent-encoding) get the
    // OpenAI body too.
    frameworkErrors: (err, _request, reply) => {
      const status = (err as { statusCode?: number }).statusCode ?? 400;
      return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', err.message, { status: status >= 400 && status < 500 ? status : 400 });
    },
    // Requests that node's HTTP parser refuses (headers past its limit, bytes that are not HTTP)
    // never reach fastify: answered here with the OpenAI body, as fastify's default does with its own.
    clientErrorHandler: (err, socket) => {
      const code = (err as { code?: string }).code;
      if (code === 'ECONNRESET' || socket.destroyed) return;
      const [status, message] =
        code === 'HPE_HEADER_OVERFLOW' ? [431, `request headers are larger than ${maxHeaderSize} bytes`]
        : code === 'ERR_HTTP_REQUEST_TIMEOUT' ? [408, 'the request did not arrive in time']
        : [400, `malformed HTTP request: ${err.message}`];
      const body = JSON.stringify(errorBody('REEF_ERR_INVALID_ARGUMENT', message));
      if (socket.writable) {
        socket.write(`HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\ncontent-length: ${Buffer.byteLength(body)}\r\ncontent-type: application/json; charset=utf-8\r\nconnection: close\r\n\r\n${body}`);
      }
      socket.destroy(err);
    },
  });
  // Past the cap Node closes a new connection as it is accepted, so file descriptors stay bounded
  // and the engine's connection pool and the store still get theirs.
  app.server.maxConnections = limits.maxConnections;
  const { metrics } = opts.chat;
  // Only without keys: a page in a browser holds no key, so a keyed gateway already refuses it, and
  // a keyed gateway is the one put behind proxies that send whatever Host their clients used.
  const browserGuard = opts.auth.required ? null : new BrowserGuard(opts.browser ?? { bindHost: '127.0.0.1' });
  const throttle = opts.auth.required && limits.authFailuresPerMinute !== null ? new AuthFailureThrottle(limits.authFailuresPerMinute, limits.authFailureAddresses) : null;

  // JSON text is UTF-8 (RFC 8259 §8.1). Fastify's own parser decodes a body as a string first,
  // turning bad bytes into U+FFFD, so a report or scenario would be stored with text the client
  // never sent. Chat completions read their own bytes (routes/openai.ts) and refuse the same.
  const parseJson = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (request, body, done) => {
    if (!isUtf8(body as Buffer)) return done(Object.assign(new NotUtf8Error(), { statusCode: 400 }), undefined);
    parseJson(request, (body as Buffer).toString('utf8'), done);
  });

  // Set once close() starts: a keep-alive client (the SDKs) still sends on its open connection
  // while the requests in flight drain, and gets a 503 it can retry elsewhere.
  let draining = false;
  app.addHook('preClose', (done) => {
    draining = true;
    done();
  });

  // Hooks in callback form: every request runs all three, and the async form costs each one a
  // promise and a trip through the microtask queue. A hook that answers does not call `done`.
  app.addHook('onRequest', (request, reply, done) => {
    const startedNs = process.hrtime.bigint();
    // On the response's close rather than in onResponse, which runs only once a response finished:
    // a client that left before its answer (a timeout, a stopped stream) went uncounted. It counts
    // as 499, nginx's "client closed request", whatever status had been set or sent by then.
    reply.raw.once('close', () => {
      const route = request.routeOptions.url ?? 'unmatched';
      metrics.requests.inc({ route, code: reply.raw.writableFinished ? String(reply.statusCode) : '499' });
      metrics.latency.observe(Number(process.hrtime.bigint() - startedNs) / 1e9, { route });
    });
    if (draining) {
      sendReefError(reply, new ReefError('REEF_ERR_ACTOR_DRAINING', { actor: 'gateway' }));
      return;
    }
    // The matched route, not the raw URL: probes may add a query string.
    if (request.routeOptions.url === '/healthz') return done();
    const refused = browserGuard?.check(request.headers, request.socket.localPort ?? null) ?? null;
    if (refused !== null) {
      sendReefError(reply, refused);
      return;
    }
    // The live page's own files hold no data: they load without a key, so that the page can ask
    // for one. Every call they make for data is authenticated below as any other.
    if (PUBLIC_UI_ROUTES.has(request.routeOptions.url ?? '')) return done();
    // The socket's peer: behind a proxy that is the proxy, whose clients then share one bucket.
    const refusedFor = throttle?.refusedFor(request.ip) ?? 0;
    if (refusedFor > 0) {
      const detail = ', so its requests are refused whatever their key';
      sendError(reply, 'REEF_ERR_RATE_LIMIT', rateLimitMessage(throttle!.perMinute, 'failed authentications from this address', 'reef.limits.auth_failures_per_minute', detail, refusedFor), { retryAfterS: refusedFor });
      return;
    }
    const principal = opts.auth.authenticate(request.headers);
    if (typeof principal === 'string') {
      throttle?.fail(request.ip);
      // The challenge a 401 must carry (RFC 9110 §11.6.1), naming the scheme that is expected.
      reply.header('www-authenticate', 'Bearer');
      sendError(reply, 'REEF_ERR_UNAUTHORIZED', principal);
      return;
    }
    (request as WithPrincipal)[PRINCIPAL] = principal;
    // Every route a key reaches counts, the Reef API included: a loop of listings or reports costs
    // the store and the event loop as much as completions do.
    const wait = principal.requests?.take(1) ?? 0;
    if (wait > 0) {
      sendError(reply, 'REEF_ERR_RATE_LIMIT', rateLimitMessage(principal.requests!.perMinute, 'requests', `${principal.setting}requests_per_minute`, '', wait), { retryAfterS: wait });
      return;
    }
    // Before the body is read, so no handler runs: why JSON is required is at STATE_CHANGING. An
    // unknown route stays a 404.
    const contentType = request.headers['content-type'];
    if (STATE_CHANGING.has(request.method) && request.routeOptions.url !== undefined && !isJsonContentType(contentType) && !bodylessDelete(request)) {
      sendError(reply, 'REEF_ERR_BODY', `${request.method} ${request.routeOptions.url} needs content-type: application/json, got ${contentType === undefined ? 'none' : JSON.stringify(contentType)} (send {} when there is nothing to say)`, { status: 415 });
      return;
    }
    // The Reef API has its own slots per key: taking a chat completion's would let a busy agent's
    // generations block its own reports, and taking none let listings pile up without bound.
    if (request.routeOptions.url?.startsWith('/reef/')) {
      if (!principal.reefLimiter.tryAcquire()) {
        sendError(reply, 'REEF_ERR_RATE_LIMITED', `too many concurrent /reef requests for this API key (limit ${principal.reefLimiter.limit}, reef.limits.reef_concurrency)`, { retryAfterS: 1 });
        return;
      }
      reply.raw.once('close', () => principal.reefLimiter.release());
    }
    done();
  });

  // A body no one reads holds its socket for as long as the client cares to send it: a pause of
  // body_idle_timeout_s between two pieces ends the connection (Node measures the socket's reads).
  // Cleared once the body is in, so a generation's silence is not taken for a stalled upload.
  app.addHook('preParsing', (request, _reply, payload, done) => {
    if (!request.raw.complete) socketTimeout(request, limits.bodyIdleTimeoutMs);
    done(null, payload);
  });
  app.addHook('preValidation', (request, _reply, done) => {
    socketTimeout(request, 0);
    done();
  });

  // An answer sent before the body was read (401, 429, 415, 413, 503) closes the connection. Node
  // would otherwise keep reading the unread body to reach the next request, for as long as the
  // client sends it, on a socket that no limit counts any more.
  app.addHook('onSend', (request, reply, payload, done) => {
    if (bodyUnread(request)) {
      reply.header('connection', 'close');
      socketTimeout(request, 0);
    }
    done(null, payload);
  });

  // Reports, scenarios and rollbacks are small: 64 MiB of JSON parsed and walked on the event loop
  // would stall every generation for seconds.
  app.addHook('onRoute', (route) => {
    if (route.url.startsWith('/reef/') && route.bodyLimit === undefined) route.bodyLimit = limits.reefBodyBytes;
  });

  // Chat completions arrive as raw bytes; their preparation runs the same check on the parsed body.
  app.addHook('preHandler', (request, reply, done) => {
    if (Buffer.isBuffer(request.body)) return done();
    const problem = parsedBodyProblem(request.body);
    if (problem !== null) {
      sendError(reply, 'REEF_ERR_BODY', problem);
      return;
    }
    done();
  });

  // Framework-level failures (bad JSON, wrong content type, too large) still answer with the
  // OpenAI error body and a 4xx, never a 5xx.
  app.setErrorHandler((err: Error & { statusCode?: number; code?: string }, request, reply) => {
    const status = err.statusCode ?? 500;
    if (status === 413) {
      const limit = request.routeOptions.bodyLimit ?? limits.bodyBytes;
      return sendError(reply, 'REEF_ERR_TOO_LARGE', `request body is larger than ${limit} bytes (${request.routeOptions.url?.startsWith('/reef/') ? 'reef.limits.reef_body_bytes' : 'reef.limits.body_bytes'})`);
    }
    if (status >= 400 && status < 500) {
      const message = err.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || err instanceof SyntaxError ? `request body is not valid JSON: ${err.message}` : err.message;
      return sendError(reply, 'REEF_ERR_BODY', message, { status: status === 415 ? 415 : 400 });
    }
    reply.log.error({ err }, 'unhandled gateway error');
    return sendError(reply, 'REEF_ERR_HANDLER', `internal error: ${err.message}`, { status: 500 });
  });

  app.setNotFoundHandler((request, reply) => sendError(reply, 'REEF_ERR_NOT_FOUND', `no route ${request.method} ${request.url}`));

  const principalOf = (req: FastifyRequest): Principal => {
    const p = (req as WithPrincipal)[PRINCIPAL];
    if (!p) throw new Error('request passed auth without a principal');
    return p;
  };

  app.get('/healthz', async () => ({ ok: true }));
  app.get('/metrics', async (req, reply) => {
    const p = principalOf(req);
    // With the charset, as Prometheus' own clients send it: counter names from saved state may be
    // other than ASCII, and text/plain without one is Latin-1 to clients that follow HTTP/1.1's default.
    return reply.type('text/plain; version=0.0.4; charset=utf-8').send(metrics.render(p.scenarios === null ? null : (s) => canSee(p, s)));
  });
  const routeOptions = { defaultScenario: opts.defaultScenario, principalOf, disk: opts.disk ?? null, scenarios: opts.scenarios ?? null };
  registerOpenAIRoutes(app, opts.chat, { ...routeOptions, responses: opts.responses ?? null });
  registerAnthropicRoutes(app, opts.chat, routeOptions);
  if (opts.registerReefRoutes) {
    opts.registerReefRoutes(app, principalOf);
    registerUiRoutes(app);
  }
  return app;
}
