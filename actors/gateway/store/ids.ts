import { randomFillSync } from 'node:crypto';

/**
 * Sortable unique ids: 10 Crockford base32 digits of ms time then 16 of randomness (26 chars,
 * the ULID layout). Ids from one generator sort in creation order even within a millisecond
 * (the random part is incremented) and even if the wall clock steps back (time never decreases).
 */

const ALPHABET = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
const TIME_DIGITS = 10;
const RANDOM_DIGITS = 16;
const MAX_TIME = 2 ** 48 - 1;
const ID_RE = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/;

export const ID_LENGTH = TIME_DIGITS + RANDOM_DIGITS;

export function isId(value: unknown): value is string {
  return typeof value === 'string' && ID_RE.test(value);
}

/** The ms timestamp encoded in an id. */
export function idTime(id: string): number {
  let t = 0;
  for (let i = 0; i < TIME_DIGITS; i++) t = t * 32 + ALPHABET.indexOf(id.charAt(i));
  return t;
}

function encodeTime(ms: number): string {
  let out = '';
  for (let i = 0; i < TIME_DIGITS; i++) {
    out = ALPHABET.charAt(ms % 32) + out;
    ms = Math.floor(ms / 32);
  }
  return out;
}

/** Random bytes drawn 256 ids at a time: one system call per id showed in the gateway's profile. */
const RANDOM_POOL = RANDOM_DIGITS * 256;

export class IdGenerator {
  private lastTime = -1;
  /** The random part as 16 base32 digits, incremented within one millisecond. */
  private readonly digits = new Uint8Array(RANDOM_DIGITS);
  private readonly pool = new Uint8Array(RANDOM_POOL);
  private poolAt = RANDOM_POOL;

  constructor(private readonly now: () => number = Date.now) {}

  next(): string {
    let time = Math.max(this.now(), this.lastTime);
    if (time > MAX_TIME) throw new RangeError('id timestamp beyond year 10889');
    if (time === this.lastTime) {
      // Carrying out of the top digit would wrap to a smaller id; move to the next ms instead.
      if (!this.increment()) {
        time += 1;
        this.reseed();
      }
    } else {
      this.reseed();
    }
    this.lastTime = time;
    let out = encodeTime(time);
    for (const d of this.digits) out += ALPHABET.charAt(d);
    return out;
  }

  private reseed(): void {
    if (this.poolAt === RANDOM_POOL) {
      randomFillSync(this.pool);
      this.poolAt = 0;
    }
    for (let i = 0; i < RANDOM_DIGITS; i++) this.digits[i] = this.pool[this.poolAt + i]! & 31;
    this.poolAt += RANDOM_DIGITS;
  }

  /** Adds one to the random part; false when it overflowed. */
  private increment(): boolean {
    for (let i = RANDOM_DIGITS - 1; i >= 0; i--) {
      if (this.digits[i]! < 31) {
        this.digits[i]! += 1;
        return true;
      }
      this.digits[i] = 0;
    }
    return false;
  }
}

const shared = new IdGenerator();

/** A new id from the process-wide generator. */
export function newId(): string {
  return shared.next();
}
