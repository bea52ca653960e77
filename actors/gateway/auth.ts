import { createHash, timingSafeEqual } from 'node:crypto';
import { ReefError } from '../runtime/errors.js';

/** One configured API key, already resolved from `key` or `key_env`. */
export interface ApiKeySpec {
  key: string;
  /** Scenarios this key may use and see; null = all. */
  scenarios: readonly string[] | null;
  /** Concurrent requests allowed for this key before 429. */
  maxConcurrency: number;
}

export interface Principal {
  /** A short, non-secret id for logs and metrics (hash prefix of the key). */
  id: string;
  scenarios: ReadonlySet<string> | null;
  limiter: ConcurrencyLimiter;
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

function digest(s: string): Buffer {
  return createHash('sha256').update(s).digest();
}

/** Why a request's credentials were refused, as its 401 says. */
export const MISSING_OR_INVALID_KEY = 'missing or invalid API key: send Authorization: Bearer KEY or x-api-key: KEY';
export const CONFLICTING_KEYS = 'Authorization: Bearer and x-api-key name different keys: send one key';
export const TWO_KEYS = Symbol('two different keys');

/**
 * Resolves a request's credentials (`Authorization: Bearer K` or `x-api-key: K`) to a principal.
 * With no keys configured (allowed only on loopback, enforced by config validation) every request
 * gets the open principal.
 */
export class Authenticator {
  private readonly keys: Array<{ digest: Buffer; principal: Principal }>;
  private readonly open: Principal | null;

  constructor(specs: readonly ApiKeySpec[], openConcurrency = 256) {
    // The first entry with a key would win and the others' scenarios and limit be ignored: a key
    // limited to scenarios in one entry would still be served as another entry says.
    const first = new Map<string, number>();
    specs.forEach((s, i) => {
      const j = first.get(s.key);
      if (j !== undefined) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `reef.api_keys[${i}] has the same key as reef.api_keys[${j}]: give each key one entry` });
      first.set(s.key, i);
    });
    this.keys = specs.map((s) => ({
      digest: digest(s.key),
      principal: { id: digest(s.key).toString('hex').slice(0, 8), scenarios: s.scenarios ? new Set(s.scenarios) : null, limiter: new ConcurrencyLimiter(s.maxConcurrency) },
    }));
    this.open = specs.length === 0 ? { id: 'open', scenarios: null, limiter: new ConcurrencyLimiter(openConcurrency) } : null;
  }

  get required(): boolean {
    return this.open === null;
  }

  /** Returns the principal, or why the credentials were refused (missing, wrong, or two different keys). */
  authenticate(headers: Record<string, string | string[] | undefined>): Principal | string {
    if (this.open) return this.open;
    const presented = extractKey(headers);
    if (presented === TWO_KEYS) return CONFLICTING_KEYS;
    if (presented === null) return MISSING_OR_INVALID_KEY;
    const d = digest(presented);
    // Compare digests in constant time so a wrong key reveals nothing about the right ones.
    for (const k of this.keys) if (timingSafeEqual(k.digest, d)) return k.principal;
    return MISSING_OR_INVALID_KEY;
  }
}

/**
 * The key a request presents: `Authorization: Bearer K` (the scheme in any case) or `x-api-key: K`,
 * trimmed. Both naming the same key is one key; naming two different ones is TWO_KEYS:
 * picking either would serve the request with rights its client may not have meant (or refuse it
 * for a wrong key it did not know it sent). An Authorization of another scheme (Basic, for a proxy
 * in front) is left to x-api-key.
 */
export function extractKey(headers: Record<string, string | string[] | undefined>): string | typeof TWO_KEYS | null {
  const auth = headers['authorization'];
  const a = Array.isArray(auth) ? auth[0] : auth;
  const m = a ? /^Bearer\s+(.+)$/i.exec(a.trim()) : null;
  const bearer = m ? m[1]!.trim() : null;
  const x = headers['x-api-key'];
  const v = Array.isArray(x) ? x[0] : x;
  const apiKey = v ? v.trim() || null : null;
  if (bearer !== null && apiKey !== null && bearer !== apiKey) return TWO_KEYS;
  return bearer ?? apiKey;
}

export function canSee(p: Principal, scenario: string): boolean {
  return p.scenarios === null || p.scenarios.has(scenario);
}
