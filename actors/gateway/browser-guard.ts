import { isLoopback } from '../../cluster/config/schema.js';
import { ReefError } from '../runtime/errors.js';

/**
 * What a keyless listener on loopback checks so that a web page cannot drive it (security review
 * H4). Without a key, the browser is the only thing between a page and the listener:
 * - DNS rebinding: once `evil.example` resolves to 127.0.0.1, a page from `http://evil.example:8600`
 *   is same-origin with the gateway and may read its answers. Its requests still carry
 *   `Host: evil.example:8600`, which is refused (421).
 * - Cross-site requests: a page elsewhere can send simple requests (a form, `fetch` with
 *   `mode: 'no-cors'`) without reading the answer. They carry its `Origin` or
 *   `Sec-Fetch-Site: cross-site`, which are refused (403).
 * A request without Host or Origin comes from no browser (an SDK, curl, HTTP/1.0) and passes.
 */

export interface BrowserGuardOptions {
  /** The address the listener binds (`reef.host`): a client may name it in Host. */
  bindHost: string;
  /** More names a client may send in Host (`reef.allowed_hosts`). @default [] */
  allowedHosts?: readonly string[];
  /** Origins allowed besides the listener's own, compared as written (`reef.allowed_origins`). @default [] */
  allowedOrigins?: readonly string[];
  /** How the refusals tell an operator to allow a name and an origin. @default { hosts: 'reef.allowed_hosts', origins: 'reef.allowed_origins' } */
  settings?: { hosts: string; origins: string };
}

/** The headers the guard reads, as node gives them. */
export type GuardHeaders = Record<string, string | string[] | undefined>;

const first = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);

/** A Host header split into its lower-case name (IPv6 without brackets) and port; null when it is neither. */
export function parseHost(value: string): { name: string; port: number | null } | null {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^\s/?#@[\]:]+))(?::(\d{1,5}))?$/.exec(value.trim());
  if (!m) return null;
  const port = m[3] === undefined ? null : Number(m[3]);
  if (port !== null && port > 65535) return null;
  return { name: (m[1] ?? m[2]!).toLowerCase(), port };
}

/** Strips IPv6 brackets and case, as Host and Origin names are compared. */
const bare = (host: string): string => host.replace(/^\[(.*)\]$/, '$1').toLowerCase();

export class BrowserGuard {
  private readonly names: ReadonlySet<string>;
  private readonly origins: ReadonlySet<string>;
  private readonly settings: { hosts: string; origins: string };

  constructor(opts: BrowserGuardOptions) {
    this.names = new Set([bare(opts.bindHost), ...(opts.allowedHosts ?? []).map(bare)]);
    this.origins = new Set(opts.allowedOrigins ?? []);
    this.settings = opts.settings ?? { hosts: 'reef.allowed_hosts', origins: 'reef.allowed_origins' };
  }

  /**
   * Whether a client may address the listener by `name`: localhost, a 127.0.0.0/8 or ::1 literal,
   * the bind address, or a configured name. An IP literal of loopback is safe to allow, since no
   * attacker's DNS name can make a browser send one.
   */
  nameAllowed(name: string): boolean {
    const h = bare(name);
    return this.names.has(h) || isLoopback(h);
  }

  /**
   * Why the request is refused, or null. `localPort` is the port the request arrived on; without
   * one (fastify's inject has no socket) the port it addressed in Host stands for it.
   */
  check(headers: GuardHeaders, localPort: number | null): ReefError | null {
    const hostValue = first(headers.host);
    const host = hostValue === undefined ? null : parseHost(hostValue);
    if (hostValue !== undefined && (host === null || !this.nameAllowed(host.name))) {
      return new ReefError('REEF_ERR_HOST_NOT_ALLOWED', { host: JSON.stringify(hostValue), setting: this.settings.hosts });
    }
    const origin = first(headers.origin);
    const listed = origin !== undefined && origin !== 'null' && this.origins.has(origin);
    if (origin !== undefined && !listed) {
      const why = origin === 'null'
        ? 'Origin null (a sandboxed page, a file, or a redirect across origins) is never allowed'
        : this.ownOrigin(origin, localPort ?? host?.port ?? null) ? null : `Origin ${origin} is not this listener's own origin`;
      if (why !== null) return new ReefError('REEF_ERR_ORIGIN_NOT_ALLOWED', { why, setting: this.settings.origins });
    }
    // A cross-site request that sends no Origin (a top-level navigation, an <img>, a <script>) still says so here.
    if (first(headers['sec-fetch-site']) === 'cross-site' && !listed) {
      return new ReefError('REEF_ERR_ORIGIN_NOT_ALLOWED', { why: `a cross-site request (Sec-Fetch-Site: cross-site${origin === undefined ? '' : `, Origin ${origin}`}) is not allowed`, setting: this.settings.origins });
    }
    return null;
  }

  /** An http(s) origin whose name is allowed and whose port is the one the request came in on. */
  private ownOrigin(origin: string, port: number | null): boolean {
    let url: URL;
    try {
      url = new URL(origin);
    } catch {
      return false;
    }
    if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.origin !== origin) return false;
    const originPort = url.port === '' ? (url.protocol === 'https:' ? 443 : 80) : Number(url.port);
    return this.nameAllowed(url.hostname) && originPort === (port ?? 80);
  }
}

/** The content types a state-changing request may carry: JSON, with parameters (`; charset=utf-8`). */
export function isJsonContentType(value: string | undefined): boolean {
  return value !== undefined && /^\s*application\/json\s*(;|$)/i.test(value);
}

/**
 * Methods that must carry a JSON body, keyed or not. A page on another origin can send a request
 * without asking first only with a form's content types or none at all (a body-less rollback was
 * one, security review H4); with application/json it must ask first (a CORS preflight), and no
 * Reef listener ever agrees to one.
 */
export const STATE_CHANGING = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
