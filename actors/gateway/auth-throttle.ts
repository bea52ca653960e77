import { isIPv6 } from 'node:net';
import { TokenBucket } from './auth.js';

/**
 * Failed authentications per client address (`reef.limits.auth_failures_per_minute`), as a token
 * bucket per address: `perMinute` wrong or missing keys may come at once, then as fast as the
 * bucket refills. An address whose bucket is empty is refused before its key is looked at, a right
 * key included: answering a right key while refusing wrong ones would tell a guesser which guess
 * was right at full speed, which is what the bound is there to stop. A success does not refill the
 * bucket either, or a tenant holding one key could interleave it with guesses at the others.
 *
 * At most `maxAddresses` are tracked, so a flood from many addresses costs bounded memory: past
 * that, the address whose last failure is oldest is forgotten (its bucket has most likely refilled).
 */
export class AuthFailureThrottle {
  /** In order of last failure, oldest first (a Map keeps insertion order; a failure re-inserts). */
  private readonly buckets = new Map<string, TokenBucket>();

  constructor(
    readonly perMinute: number,
    readonly maxAddresses: number,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Whole seconds until a request from `address` may present a key again; 0 = now. */
  refusedFor(address: string): number {
    return this.buckets.get(addressKey(address))?.emptyFor() ?? 0;
  }

  /** Counts a failed authentication from `address`. */
  fail(address: string): void {
    const key = addressKey(address);
    let bucket = this.buckets.get(key);
    if (bucket === undefined) {
      if (this.buckets.size >= this.maxAddresses) this.buckets.delete(this.buckets.keys().next().value!);
      bucket = new TokenBucket(this.perMinute, this.now);
    } else {
      this.buckets.delete(key);
    }
    this.buckets.set(key, bucket);
    bucket.take(1);
  }

  /** Addresses tracked now. */
  get size(): number {
    return this.buckets.size;
  }
}

/**
 * What one client is counted by: an IPv4 address (also written IPv4-mapped, as a dual-stack
 * listener reports it), or an IPv6 address's /64. One host commonly holds a whole /64, so counted
 * per address it would have 2^64 fresh buckets to try from, and could push everyone else out of
 * the table besides.
 */
export function addressKey(address: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped) return mapped[1]!;
  const bare = address.replace(/%.*$/, '');
  if (!isIPv6(bare)) return address;
  const groups = (part: string): string[] => (part === '' ? [] : part.split(':').flatMap((g) => (g.includes('.') ? ['0', '0'] : [g])));
  const gap = bare.indexOf('::');
  const head = groups(gap < 0 ? bare : bare.slice(0, gap));
  const tail = gap < 0 ? [] : groups(bare.slice(gap + 2));
  const full = gap < 0 ? head : [...head, ...Array<string>(8 - head.length - tail.length).fill('0'), ...tail];
  return `${full.slice(0, 4).map((g) => parseInt(g, 16).toString(16)).join(':')}::/64`;
}
