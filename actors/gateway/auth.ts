import { createHash, timingSafeEqual } from 'node:crypto';

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

/**
 * Resolves a request's credentials (`Authorization: Bearer K` or `x-api-key: K`) to a principal.
 * With no keys configured (allowed only on loopback, enforced by config validation) every request
 * gets the open principal.
 */
export class Authenticator {
  private readonly keys: Array<{ digest: Buffer; principal: Principal }>;
  private readonly open: Principal | null;

  constructor(specs: readonly ApiKeySpec[], openConcurrency = 256) {
    this.keys = specs.map((s) => ({
      digest: digest(s.key),
      principal: { id: digest(s.key).toString('hex').slice(0, 8), scenarios: s.scenarios ? new Set(s.scenarios) : null, limiter: new ConcurrencyLimiter(s.maxConcurrency) },
    }));
    this.open = specs.length === 0 ? { id: 'open', scenarios: null, limiter: new ConcurrencyLimiter(openConcurrency) } : null;
  }

  get required(): boolean {
    return this.open === null;
  }

  /** Returns the principal, or null when the credentials are missing or wrong. */
  authenticate(headers: Record<string, string | string[] | undefined>): Principal | null {
    if (this.open) return this.open;
    const presented = extractKey(headers);
    if (presented === null) return null;
    const d = digest(presented);
    // Compare digests in constant time so a wrong key reveals nothing about the right ones.
    for (const k of this.keys) if (timingSafeEqual(k.digest, d)) return k.principal;
    return null;
  }
}

export function extractKey(headers: Record<string, string | string[] | undefined>): string | null {
  const auth = headers['authorization'];
  const a = Array.isArray(auth) ? auth[0] : auth;
  if (a) {
    const m = /^Bearer\s+(.+)$/i.exec(a.trim());
    if (m) return m[1]!.trim();
  }
  const x = headers['x-api-key'];
  const v = Array.isArray(x) ? x[0] : x;
  return v ? v.trim() : null;
}

export function canSee(p: Principal, scenario: string): boolean {
  return p.scenarios === null || p.scenarios.has(scenario);
}
