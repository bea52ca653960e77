import { statfsSync } from 'node:fs';
import type { ReefConfig } from '../../cluster/config/index.js';
import { ReefError } from '../runtime/errors.js';
import type { PrincipalLimits } from './auth.js';

/** The HTTP listener's bounds (`reef.limits`), in the units the server takes. */
export interface GatewayLimits {
  /** Time to receive one whole request, headers and body (not its response). @default 120_000 */
  requestTimeoutMs: number;
  /** Time to receive a request's headers, from the connection's first byte or the last request's end. @default 30_000 */
  headersTimeoutMs: number;
  /** Longest pause between two pieces of a body that is being read. @default 30_000 */
  bodyIdleTimeoutMs: number;
  /** How long a kept-alive connection waits for its next request. @default 75_000 */
  keepAliveTimeoutMs: number;
  /** Open connections; one more is closed as it is accepted. @default 1024 */
  maxConnections: number;
  /** Largest chat completion body. @default 64 MiB */
  bodyBytes: number;
  /** Largest /reef/* body. @default 4 MiB */
  reefBodyBytes: number;
  /** Free space the data dir's filesystem must keep for a generation to start; 0 = never checked. @default 256 MiB */
  minFreeDiskBytes: number;
  /** Failed authentications per client address per minute before its requests are refused; null = no bound. @default 30 */
  authFailuresPerMinute: number | null;
  /** Client addresses whose failures are tracked at once. @default 10_000 */
  authFailureAddresses: number;
  principals: PrincipalLimits;
}

export const DEFAULT_LIMITS: GatewayLimits = {
  requestTimeoutMs: 120_000,
  headersTimeoutMs: 30_000,
  bodyIdleTimeoutMs: 30_000,
  keepAliveTimeoutMs: 75_000,
  maxConnections: 1024,
  bodyBytes: 64 * 1024 * 1024,
  reefBodyBytes: 4 * 1024 * 1024,
  minFreeDiskBytes: 256 * 1024 * 1024,
  authFailuresPerMinute: 30,
  authFailureAddresses: 10_000,
  principals: {},
};

export function limitsFromConfig(cfg: ReefConfig): GatewayLimits {
  const l = cfg.reef.limits;
  return {
    requestTimeoutMs: l.request_timeout_s * 1000,
    headersTimeoutMs: l.headers_timeout_s * 1000,
    bodyIdleTimeoutMs: l.body_idle_timeout_s * 1000,
    keepAliveTimeoutMs: l.keep_alive_timeout_s * 1000,
    maxConnections: l.max_connections,
    bodyBytes: l.body_bytes,
    reefBodyBytes: l.reef_body_bytes,
    minFreeDiskBytes: l.min_free_disk_mb * 1024 * 1024,
    authFailuresPerMinute: l.auth_failures_per_minute,
    authFailureAddresses: l.auth_failure_addresses,
    principals: {
      reefConcurrency: l.reef_concurrency,
      openConcurrency: l.keyless_max_concurrency,
      openRequestsPerMinute: l.keyless_requests_per_minute,
      openTokensPerMinute: l.keyless_tokens_per_minute,
    },
  };
}

/**
 * Refuses generation while the data dir's filesystem is nearly full: the engine would generate,
 * the record's commit would then fail, and the client would get a 500 for a reply it waited for.
 * statfs costs a system call, so one answer serves every request for `maxAgeMs`.
 */
export class DiskGuard {
  private checkedAt = Number.NEGATIVE_INFINITY;
  private free = Number.POSITIVE_INFINITY;
  constructor(
    private readonly dir: string,
    private readonly minFreeBytes: number,
    private readonly maxAgeMs = 1000,
  ) {}

  /** Bytes free to an unprivileged writer (bavail, not bfree: root's reserve is not ours). */
  freeBytes(): number {
    const now = performance.now();
    if (now - this.checkedAt >= this.maxAgeMs) {
      this.checkedAt = now;
      try {
        const s = statfsSync(this.dir);
        this.free = s.bavail * s.bsize;
      } catch {
        // A data dir that cannot be measured is left to the commit to report.
        this.free = Number.POSITIVE_INFINITY;
      }
    }
    return this.free;
  }

  /** The 503 to answer with, or null when there is room. */
  check(): ReefError | null {
    if (this.minFreeBytes <= 0) return null;
    const free = this.freeBytes();
    if (free >= this.minFreeBytes) return null;
    return new ReefError('REEF_ERR_DISK_FULL', { path: this.dir, freeMb: Math.floor(free / 2 ** 20), minMb: Math.round(this.minFreeBytes / 2 ** 20), setting: 'reef.limits.min_free_disk_mb' });
  }
}

/**
 * Bounds how many scenarios exist. Every new `x-reef-scenario` makes a row that is never deleted
 * and metric series kept for the process's life, so an unscoped key could otherwise add them
 * without end. Names are counted when first admitted, before their record commits: a request that
 * then fails still used its place, which errs toward refusing, never toward passing the cap.
 */
export class ScenarioCap {
  private readonly known: Set<string>;
  constructor(
    existing: Iterable<string>,
    readonly limit: number,
  ) {
    this.known = new Set(existing);
  }

  /** Admits the name (counting it if new), or returns the 403 that names the cap. */
  admit(name: string): ReefError | null {
    if (this.known.has(name)) return null;
    if (this.known.size >= this.limit) return new ReefError('REEF_ERR_SCENARIO_LIMIT', { scenario: name, count: this.known.size, limit: this.limit, setting: 'reef.limits.max_scenarios' });
    this.known.add(name);
    return null;
  }
}

/** The 429 text of a spent token bucket. */
export function rateLimitMessage(limit: number, unit: string, setting: string, detail: string, retryAfterS: number): string {
  return new ReefError('REEF_ERR_RATE_LIMIT', { limit, unit, setting, detail, retryAfterS }).message;
}
