import { createServer, type IncomingHttpHeaders, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { pipeline } from 'node:stream/promises';
import { Agent } from 'undici';
import { BrowserGuard } from '../../../actors/gateway/browser-guard.js';
import { ERRORS, ReefError } from '../../../actors/runtime/errors.js';

/**
 * A small HTTP proxy for agents that cannot set headers (Hermes, OpenClaw): it forwards every
 * request to the Reef gateway unchanged except for the headers it adds — `x-reef-scenario`,
 * `x-reef-tag-session` and `Authorization: Bearer <key>` — and streams both bodies through as they
 * come, so SSE events reach the agent one by one.
 *
 * Session rules (`x-reef-tag-session`):
 * - `none`: no tag is added.
 * - `fixed`: one value for every request, changed at run time with `setSession()` or
 *   `PUT /_reef_shim/session` (body: the new value). A driver that runs one conversation at a time
 *   sets `{scenario}-s{index}` before each.
 * - `per-connection`: `{prefix}-c{n}`, a new n for each TCP connection: for agents that hold one
 *   keep-alive connection per conversation.
 * - `path`: the agent's base URL carries the tag, `http://shim/t/<tag>/v1`; the `/t/<tag>` prefix is
 *   removed before forwarding. Works for any agent whose base URL is configurable.
 * A request that already carries `x-reef-tag-session` or `x-reef-scenario` keeps its own value.
 *
 * Whoever reaches the shim gets the key it adds, so it serves only what an agent needs: `/v1/*`
 * (and its own session route); the Reef API (records, reports, rollback) is the gateway's, with
 * the gateway's key. It also refuses browsers as a keyless gateway does (actors/gateway/
 * browser-guard.ts): a DNS-rebinding page or a page on another origin would otherwise use the key.
 */

export type SessionRule = { mode: 'none' } | { mode: 'fixed'; value: string } | { mode: 'per-connection'; prefix: string } | { mode: 'path' };

export interface HeaderShimOptions {
  /** The gateway's base URL (`http://127.0.0.1:8600`). */
  upstream: string;
  /** @default '127.0.0.1' */
  host?: string;
  /** @default 0 (a free port) */
  port?: number;
  /** Scenario to add; null adds none (the gateway's default applies). @default null */
  scenario?: string | null;
  /** @default { mode: 'none' } */
  session?: SessionRule;
  /** Bearer key to add when the client sends no Authorization. @default null */
  apiKey?: string | null;
  /** Replace the client's own Authorization with `apiKey` too. @default false */
  replaceAuthorization?: boolean;
  /** Names a client may send in Host besides localhost, loopback literals and `host`. @default [] */
  allowedHosts?: readonly string[];
  /** Origins a browser may call the shim from besides its own. @default [] */
  allowedOrigins?: readonly string[];
}

export interface HeaderShim {
  url: string;
  /** The current value of the `fixed` rule. */
  setSession(value: string): void;
  close(): Promise<void>;
}

const CONTROL = '/_reef_shim/session';
// Hop-by-hop headers belong to one connection and are never forwarded (RFC 9110 §7.6.1).
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host']);

/** Whether `tag` can go out as an `x-reef-tag-session` value: printable ASCII, not blank. */
const headerValue = (tag: string): boolean => /^[\x20-\x7e]+$/.test(tag) && tag.trim() !== '';

export function parseSessionRule(spec: string): SessionRule {
  if (spec === 'none') return { mode: 'none' };
  if (spec === 'path') return { mode: 'path' };
  // The value and the prefix go out in a header: checked here, not by every request failing later.
  if ((spec === 'per-connection' || spec.startsWith('per-connection:')) && headerValue(`${spec}-c1`)) return { mode: 'per-connection', prefix: spec.slice('per-connection:'.length) || 'conn' };
  if (spec.startsWith('fixed:') && headerValue(spec.slice('fixed:'.length))) return { mode: 'fixed', value: spec.slice('fixed:'.length) };
  throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--session ${JSON.stringify(spec)}: expected none, path, per-connection[:PREFIX] or fixed:VALUE` });
}

/** The `/t/<tag>` segment decoded, or null when it is no valid header value (bad %-escape, CR/LF, non-ASCII). */
function pathTag(segment: string): string | null {
  let tag: string;
  try {
    tag = decodeURIComponent(segment);
  } catch {
    return null;
  }
  return headerValue(tag) ? tag : null;
}

/** Whether the shim forwards `path`: under /v1, and written as it resolves (no `..`, `%2e`, `//`). */
export function forwards(path: string): boolean {
  const raw = path.split('?', 1)[0]!;
  let resolved: string;
  try {
    resolved = new URL(raw, 'http://shim').pathname;
  } catch {
    return false;
  }
  return resolved === raw && /^\/v1(\/|$)/.test(raw);
}

function forwardHeaders(h: IncomingHttpHeaders): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(h)) if (v !== undefined && !HOP.has(k)) out[k] = v;
  return out;
}

export async function startHeaderShim(opts: HeaderShimOptions): Promise<HeaderShim> {
  if (opts.scenario && !headerValue(opts.scenario)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `scenario ${JSON.stringify(opts.scenario)}: expected printable ASCII` });
  // The key itself is never shown.
  if (opts.apiKey && !headerValue(opts.apiKey)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'the API key is not printable ASCII (a trailing newline?)' });
  const upstream = new URL(opts.upstream);
  const basePath = upstream.pathname.replace(/\/+$/, '');
  const rule = opts.session ?? { mode: 'none' };
  let fixed = rule.mode === 'fixed' ? rule.value : null;
  const connTags = new WeakMap<Socket, string>();
  let connections = 0;
  // No timeouts of its own: a thinking model may take many minutes; the client decides when to give up.
  const dispatcher = new Agent({ headersTimeout: 0, bodyTimeout: 0 });
  const browsers = new BrowserGuard({
    bindHost: opts.host ?? '127.0.0.1',
    allowedHosts: opts.allowedHosts ?? [],
    allowedOrigins: opts.allowedOrigins ?? [],
    settings: { hosts: '--allow-host', origins: '--allow-origin' },
  });

  const sessionTag = (req: IncomingMessage, tagFromPath: string | null): string | null => {
    switch (rule.mode) {
      case 'fixed':
        return fixed;
      case 'path':
        return tagFromPath;
      case 'per-connection': {
        let tag = connTags.get(req.socket);
        if (tag === undefined) connTags.set(req.socket, (tag = `${rule.prefix}-c${++connections}`));
        return tag;
      }
      default:
        return null;
    }
  };

  const fail = (res: ServerResponse, err: ReefError) => {
    if (res.headersSent) return void res.destroy(err);
    res.writeHead(err.status ?? 502, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { message: err.message, type: ERRORS[err.code].type, param: null, code: err.code } }));
  };

  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    let path = req.url ?? '/';
    const refused = browsers.check(req.headers, req.socket.localPort ?? null);
    if (refused !== null) return fail(res, refused);
    if (path === CONTROL && req.method === 'PUT' && rule.mode === 'fixed') {
      let body = '';
      for await (const c of req) body += String(c);
      const value = body.trim();
      // Taken as is, a value with CR/LF failed every later request as the gateway being down (503).
      if (!headerValue(value)) return fail(res, new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `session tag ${JSON.stringify(value)}: expected printable ASCII; the tag stays ${JSON.stringify(fixed)}` }));
      fixed = value;
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify({ session: fixed }));
    }
    let tagFromPath: string | null = null;
    const m = rule.mode === 'path' ? /^\/t\/([^/?]+)(\/.*)?$/.exec(path) : null;
    if (m) {
      tagFromPath = pathTag(m[1]!);
      // The agent's own base URL is wrong: a 400 it reports, not a down gateway (503) it retries.
      if (tagFromPath === null) return fail(res, new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `session tag ${JSON.stringify(m[1])} in /t/<tag>/: expected printable ASCII, percent-encoded where needed` }));
      path = m[2] ?? '/';
    }
    if (!forwards(path)) {
      return fail(res, new ReefError('REEF_ERR_NOT_FOUND', {}, { message: `the header shim forwards only /v1/* (with its key), not ${JSON.stringify(path.split('?', 1)[0])}: call the gateway itself for the Reef API` }));
    }
    const headers = forwardHeaders(req.headers);
    const tag = sessionTag(req, tagFromPath);
    if (tag !== null && headers['x-reef-tag-session'] === undefined) headers['x-reef-tag-session'] = tag;
    if (opts.scenario && headers['x-reef-scenario'] === undefined) headers['x-reef-scenario'] = opts.scenario;
    if (opts.apiKey && (headers.authorization === undefined || opts.replaceAuthorization)) headers.authorization = `Bearer ${opts.apiKey}`;
    const abort = new AbortController();
    res.on('close', () => {
      if (!res.writableFinished) abort.abort();
    });
    let up: Awaited<ReturnType<Agent['request']>>;
    try {
      const hasBody = req.method !== 'GET' && req.method !== 'HEAD';
      up = await dispatcher.request({ origin: upstream.origin, path: basePath + path, method: req.method as 'POST', headers, body: hasBody ? req : null, signal: abort.signal });
    } catch (err) {
      if (abort.signal.aborted) return;
      return fail(res, new ReefError('REEF_ERR_ENGINE_DOWN', { engine: `gateway ${upstream.origin}`, reason: (err as Error).message }, { cause: err }));
    }
    const outHeaders: Record<string, string | string[]> = {};
    for (const [k, v] of Object.entries(up.headers)) if (v !== undefined && !HOP.has(k)) outHeaders[k] = v;
    res.writeHead(up.statusCode, outHeaders);
    // Send the head at once: an SSE client must see the response start before the first event.
    res.flushHeaders();
    try {
      await pipeline(up.body, res);
    } catch {
      // The client went away or the upstream cut the stream; both sides are closed by now.
    }
  };

  const server: Server = createServer({ noDelay: true }, (req, res) => {
    handle(req, res).catch((err) => fail(res, new ReefError('REEF_ERR_HANDLER', { messageType: 'proxy', reason: (err as Error).message })));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 0, opts.host ?? '127.0.0.1', () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const host = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  let closing: Promise<void> | null = null;
  return {
    url: `http://${host}:${addr.port}`,
    setSession(value: string) {
      if (!headerValue(value)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `session tag ${JSON.stringify(value)}: expected printable ASCII` });
      fixed = value;
    },
    close: () =>
      (closing ??= (async () => {
        await new Promise<void>((resolve) => {
          server.close(() => resolve());
          server.closeIdleConnections();
        });
        await dispatcher.close();
      })()),
  };
}
