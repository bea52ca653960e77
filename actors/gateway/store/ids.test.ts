import { describe, expect, it } from 'vitest';
import { IdGenerator, ID_LENGTH, idTime, isId, newId } from './ids.js';

describe('ids', () => {
  it('are unique and sort in creation order (10k from one generator)', () => {
    const ids = Array.from({ length: 10_000 }, () => newId());
    expect(new Set(ids).size).toBe(ids.length);
    expect([...ids].sort()).toEqual(ids);
    for (const id of ids.slice(0, 100)) {
      expect(id).toHaveLength(ID_LENGTH);
      expect(isId(id)).toBe(true);
    }
  });

  it('stay monotonic within one millisecond and when the clock steps back', () => {
    let now = 1_700_000_000_000;
    const gen = new IdGenerator(() => now);
    const a = gen.next();
    const b = gen.next();
    now -= 5_000; // wall clock stepped back
    const c = gen.next();
    expect(a < b && b < c).toBe(true);
    expect(idTime(a)).toBe(1_700_000_000_000);
    expect(idTime(c)).toBe(1_700_000_000_000);
  });

  it('encode the millisecond time first so ids of later ms sort later', () => {
    let now = 1_000;
    const gen = new IdGenerator(() => now);
    const early = gen.next();
    now = 1_001;
    const late = gen.next();
    expect(early < late).toBe(true);
    expect(idTime(late)).toBe(1_001);
  });

  it('draw fresh randomness for every millisecond, past the 256 ids one batch of random bytes serves', () => {
    let now = 5_000;
    const gen = new IdGenerator(() => now++);
    const randomParts = Array.from({ length: 1_000 }, () => gen.next().slice(10));
    expect(new Set(randomParts).size).toBe(randomParts.length);
  });

  it('rejects malformed ids', () => {
    expect(isId('0'.repeat(26))).toBe(true);
    expect(isId('8' + '0'.repeat(25))).toBe(false); // beyond 48 bits of time
    expect(isId('0'.repeat(25) + 'I')).toBe(false); // not Crockford
    expect(isId('0'.repeat(25))).toBe(false);
    expect(isId(42)).toBe(false);
  });
});
