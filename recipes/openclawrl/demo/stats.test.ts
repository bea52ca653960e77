import { describe, expect, it } from 'vitest';
import { distinctN, normalCdf, spread, twoProportionP, wilson } from './stats.js';

describe('wilson', () => {
  it('matches published intervals', () => {
    // 95% Wilson intervals from the worked examples in Newcombe (1998), Table I.
    const [lo1, hi1] = wilson(81, 263);
    expect(lo1).toBeCloseTo(0.2553, 4);
    expect(hi1).toBeCloseTo(0.3662, 4);
    const [lo2, hi2] = wilson(15, 148);
    expect(lo2).toBeCloseTo(0.0624, 4);
    expect(hi2).toBeCloseTo(0.1605, 4);
  });

  it('is not of zero width at 0 or n successes, and stays in [0, 1]', () => {
    const [lo0, hi0] = wilson(0, 100);
    expect(lo0).toBe(0);
    expect(hi0).toBeGreaterThan(0.03);
    const [loN, hiN] = wilson(100, 100);
    expect(hiN).toBe(1);
    expect(loN).toBeLessThan(0.97);
    expect(wilson(0, 0)).toEqual([0, 1]);
  });
});

describe('two-proportion test', () => {
  it('gives the textbook values', () => {
    expect(normalCdf(1.959963984540054)).toBeCloseTo(0.975, 6);
    expect(normalCdf(0)).toBeCloseTo(0.5, 7);
    // 30/100 vs 15/100: pooled p = 0.225, z = 2.546, two-sided p = 0.0109.
    expect(twoProportionP(30, 100, 15, 100)).toBeCloseTo(0.0109, 3);
    expect(twoProportionP(20, 100, 20, 100)).toBeCloseTo(1, 6);
    expect(twoProportionP(0, 100, 0, 100)).toBe(1);
  });
});

describe('spread and distinct-n', () => {
  it('means over seeds, leaving out runs without a figure', () => {
    expect(spread([1, 2, 3])).toEqual({ mean: 2, sd: 1, min: 1, max: 3, n: 3 });
    expect(spread([4, null])).toEqual({ mean: 4, sd: 0, min: 4, max: 4, n: 1 });
    expect(spread([null])).toBeNull();
  });

  it('counts unique n-grams within replies', () => {
    expect(distinctN(['a b a b', 'a b'], 1)).toBeCloseTo(2 / 6);
    expect(distinctN(['a b a b', 'a b'], 2)).toBeCloseTo(2 / 4);
    expect(distinctN(['The cat.', 'the CAT'], 2)).toBe(0.5);
    expect(distinctN([], 2)).toBe(0);
  });
});
