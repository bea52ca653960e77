import { createHash, timingSafeEqual } from 'node:crypto';
import { ReefError } from '../runtime/errors.js';

/** One configured API key, already resolved from `key` or `key_env`. */
export interface ApiKeySpec {
  key: string;
  /** Scenarios this key may use and see; null = all. */
  scenarios: readonly string[] | null;
  /** Concurrent requests allowed for this key before 429. */
  maxConcurrency: number;
  /** Requests per minute, every route but /healthz; null = unlimited. @default null */
  requestsPerMinute?: number | null;
  /** Prompt plus completion budget tokens per minute of chat completions; null = unlimited. @default null */
  tokensPerMinute?: number | null;
}

/** What every key shares, and what the keyless principal gets. */
export interface PrincipalLimits {
  /** /reef/* requests in flight per key (they do not take a chat completion's slot). @default 8 */
  reefConcurrency?: number;
  /** The keyless principal's chat completions in flight. @default 256 */
  openConcurrency?: number;
  openRequestsPerMinute?: number | null;
  openTokensPerMinute?: number | null;
}

export interface Principal {
  /** A short, non-secret id for logs and metrics (hash prefix of the key). */
  id: string;
  scenarios: ReadonlySet<string> | null;
  limiter: ConcurrencyLimiter;
  /** The /reef/* routes' own slots, so that reports and listings neither wait for nor crowd out generations. */
  reefLimiter: ConcurrencyLimiter;
  requests: TokenBucket | null;
  tokens: TokenBucket | null;
  /** Where this principal's limits are configured: its keys are this prefix plus the limit's name. */
  setting: string;
}

/**
 * A token bucket refilled continuously at `perMinute / 60` a second up to `perMinute`: a client
 * may spend a whole minute's worth at once and then as fast as it refills, as OpenAI's limits
 * behave. Time comes from a monotonic clock so that a wall-clock step neither frees nor freezes it.
 */
export class TokenBucket {
  private level: number;
  private at: number;
  constructor(
    readonly perMinute: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.level = perMinute;
    this.at = now();
  }
  private refill(): void {
    const t = this.now();
    this.level = Math.min(this.perMinute, this.level + ((t - this.at) * this.perMinute) / 60_000);
    this.at = t;
  }
  /** Takes `n` and returns 0, or takes nothing and returns the whole seconds until `n` are there. */
  take(n: number): number {
    this.refill();
    if (this.level >= n) {
      this.level -= n;
      return 0;
    }
    return Math.max(1, Math.ceil(((n - this.level) * 60) / this.perMinute));
  }
  /** Seconds until anything at all can be taken (0 now): checked before a body is read. */
  emptyFor(): number {
    this.refill();
    return this.level >= 1 ? 0 : Math.max(1, Math.ceil(((1 - this.level) * 60) / this.perMinute));
  }
}

export class ConcurrencyLimiter {
  private active = 0;
  constructor(readonly limit: number) {}
  tryAcquire(): boolean {
    if (this.active >= this.limit) return false;
    this.active++;
    return true;
  }
  release(): void {
    if (this.active > 0) this.active--;
  }
  get inUse(): number {
    return this.active;
  }
}

const bucket = (n: number | null | undefined) => (n === null || n === undefined ? null : new TokenBucket(n));

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** The id of the principal of a keyless gateway. */
export const OPEN_KEY_ID = 'open';

/**
 * A key's id: the first 8 hex digits of its SHA-256. Stored on every record the key makes and
 * shown to whoever reads those records: a digest cannot be turned back into a long random key,
 * though, as any digest, it confirms a guess of a short one offline.
 */
export function keyIdOf(key: string): string {
  return digest(key).toString('hex').slice(0, 8);
}

/** Why a request's credentials were refused, as its 401 says. */
export const MISSING_OR_INVALID_KEY = 'missing or invalid API key: send Authorization: Bearer KEY or x-api-key: KEY';
export const INVALID_BEARER_BESIDE_X_API_KEY = 'invalid API key in Authorization: Bearer, which is used rather than the x-api-key also sent';

/**
 * Resolves a request's credentials (`Authorization: Bearer K` or `x-api-key: K`) to a principal.
 * With no keys configured (allowed only on loopback, enforced by config validation) every request
 * gets the open principal.
 */
export class Authenticator {
  private keys: Array<{ digest: Buffer; spec: ApiKeySpec; principal: Principal }>;
  private readonly open: Principal | null;
  private readonly reefConcurrency: number;

  constructor(specs: readonly ApiKeySpec[], limits: PrincipalLimits = {}) {
    this.reefConcurrency = limits.reefConcurrency ?? 8;
    this.keys = this.table(specs, []);
    this.open =
      specs.length === 0
        ? {
            id: OPEN_KEY_ID,
            scenarios: null,
            limiter: new ConcurrencyLimiter(limits.openConcurrency ?? 256),
            reefLimiter: new ConcurrencyLimiter(this.reefConcurrency),
            requests: bucket(limits.openRequestsPerMinute),
            tokens: bucket(limits.openTokensPerMinute),
            setting: 'reef.limits.keyless_',
          }
        : null;
  }

  /**
   * Puts `specs` in place of the keys, all or nothing: on any problem it throws and the old keys
   * stay. Requests already admitted keep the principal they were given; the next request is
   * checked against the new keys, so a removed key gets its 401 at once. A key kept with the same
   * limits keeps its slots and buckets: a reload must not hand it a second set of concurrent
   * requests, nor a fresh minute of tokens.
   */
  replace(specs: readonly ApiKeySpec[]): void {
    // Whether the gateway needs keys at all decides, at start, whether it guards against browsers
    // (server.ts) and throttles failed keys: a reload cannot change that.
    if ((specs.length === 0) !== (this.open !== null)) {
      throw new ReefError('REEF_ERR_CONFIG_INVALID', {
        details: `reef.api_keys: the gateway started ${this.open ? 'without keys' : 'with keys'}, and a reload cannot turn keys ${this.open ? 'on' : 'off'}: restart the stack (reef down, reef up) for that`,
      });
    }
    this.keys = this.table(specs, this.keys);
  }

  /** How many keys are in force (0 on a keyless gateway). */
  get size(): number {
    return this.keys.length;
  }

  private table(specs: readonly ApiKeySpec[], previous: ReadonlyArray<{ digest: Buffer; spec: ApiKeySpec; principal: Principal }>): Array<{ digest: Buffer; spec: ApiKeySpec; principal: Principal }> {
    // The first entry with a key would win and the others' scenarios and limit be ignored: a key
    // limited to scenarios in one entry would still be served as another entry says.
    const first = new Map<string, number>();
    specs.forEach((s, i) => {
      const j = first.get(s.key);
      if (j !== undefined) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.api_keys[${i}] has the same key as reef.api_keys[${j}]: give each key one entry` });
      first.set(s.key, i);
    });
    const before = new Map(previous.map((k) => [k.digest.toString('hex'), k]));
    const table = specs.map((s, i) => {
      const d = digest(s.key);
      const old = before.get(d.toString('hex'));
      const same = old !== undefined && old.spec.maxConcurrency === s.maxConcurrency && (old.spec.requestsPerMinute ?? null) === (s.requestsPerMinute ?? null) && (old.spec.tokensPerMinute ?? null) === (s.tokensPerMinute ?? null);
      return {
        digest: d,
        spec: s,
        principal: {
          id: keyIdOf(s.key),
          scenarios: s.scenarios ? new Set(s.scenarios) : null,
          limiter: same ? old.principal.limiter : new ConcurrencyLimiter(s.maxConcurrency),
          reefLimiter: old?.principal.reefLimiter ?? new ConcurrencyLimiter(this.reefConcurrency),
          requests: same ? old.principal.requests : bucket(s.requestsPerMinute),
          tokens: same ? old.principal.tokens : bucket(s.tokensPerMinute),
          setting: `reef.api_keys[${i}].`,
        },
      };
    });
    // The id is what records, and the judge's sessions, tell keys apart by: two keys of one id
    // (a 1 in 2^32 chance per pair) would share each other's sessions.
    const ids = new Map<string, number>();
    table.forEach((k, i) => {
      const j = ids.get(k.principal.id);
      if (j !== undefined) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.api_keys[${i}] and reef.api_keys[${j}] have keys whose ids (the first 8 hex digits of their SHA-256) are the same: change one of the keys` });
      ids.set(k.principal.id, i);
    });
    return table;
  }

  get required(): boolean {
    return this.open === null;
  }

  /** Returns the principal, or why the credentials were refused (as the 401 says it). */
  authenticate(headers: Record<string, string | string[] | undefined>): Principal | string {
    if (this.open) return this.open;
    const { key, both } = extractKey(headers);
    if (key === null) return MISSING_OR_INVALID_KEY;
    const d = digest(key);
    // Compare digests in constant time so a wrong key reveals nothing about the right ones.
    for (const k of this.keys) if (timingSafeEqual(k.digest, d)) return k.principal;
    // Said, since a client that also sent a right x-api-key would otherwise look for the fault there.
    return both ? INVALID_BEARER_BESIDE_X_API_KEY : MISSING_OR_INVALID_KEY;
  }
}

/**
 * The key a request presents, trimmed: `Authorization: Bearer K` (the scheme in any case), else
 * `x-api-key: K`; `both` when the request carried the two. Bearer goes first when both are sent,
 * as the header shim in front of an agent (recipes/openclawrl/harness/header-shim.ts) puts its key
 * there and passes the agent's other headers on. An Authorization of another scheme (a proxy's
 * Basic) leaves it to x-api-key.
 */
export function extractKey(headers: Record<string, string | string[] | undefined>): { key: string | null; both: boolean } {
  const auth = headers['authorization'];
  const a = Array.isArray(auth) ? auth[0] : auth;
  const m = a ? /^Bearer\s+(.+)$/i.exec(a.trim()) : null;
  const bearer = m ? m[1]!.trim() : null;
  const x = headers['x-api-key'];
  const v = Array.isArray(x) ? x[0] : x;
  const apiKey = v ? v.trim() || null : null;
  return { key: bearer ?? apiKey, both: bearer !== null && apiKey !== null };
}

export function canSee(p: Principal, scenario: string): boolean {
  return p.scenarios === null || p.scenarios.has(scenario);
}
