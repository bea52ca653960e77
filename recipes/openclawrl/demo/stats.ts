/**
 * The statistics the experiment reports: rates with Wilson 95% intervals, a two-sided test of two
 * rates, mean and spread over seeds, and distinct-n. Small and exact enough to check by hand.
 */

/** The normal quantile of a two-sided 95% interval. */
const Z95 = 1.959963984540054;

/**
 * Wilson score interval for `k` successes in `n` trials (95%): unlike the normal approximation it
 * stays inside [0, 1] and is not of zero width at 0 of n, which a habit rate after training can be.
 */
export function wilson(k: number, n: number, z = Z95): [number, number] {
  if (!(n > 0)) return [0, 1];
  const p = k / n;
  const denom = 1 + (z * z) / n;
  const centre = (p + (z * z) / (2 * n)) / denom;
  const half = (z * Math.sqrt((p * (1 - p)) / n + (z * z) / (4 * n * n))) / denom;
  // At 0 or n successes the bound is exactly 0 or 1; computed, it is off by a rounding error.
  return [k === 0 ? 0 : Math.max(0, centre - half), k === n ? 1 : Math.min(1, centre + half)];
}

/** Standard normal CDF (Abramowitz–Stegun 26.2.17, |error| < 7.5e-8). */
export function normalCdf(x: number): number {
  const t = 1 / (1 + 0.2316419 * Math.abs(x));
  const d = 0.3989422804014327 * Math.exp((-x * x) / 2);
  const tail = d * t * (0.31938153 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))));
  return x >= 0 ? 1 - tail : tail;
}

/**
 * Two-sided p-value of the pooled two-proportion z-test that `k1/n1` and `k2/n2` are one rate.
 * Before/after rates of one run share no sample, so the samples are independent.
 */
export function twoProportionP(k1: number, n1: number, k2: number, n2: number): number {
  if (!(n1 > 0 && n2 > 0)) return 1;
  const pooled = (k1 + k2) / (n1 + n2);
  const se = Math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2));
  if (se === 0) return 1;
  const z = (k1 / n1 - k2 / n2) / se;
  return 2 * (1 - normalCdf(Math.abs(z)));
}

export interface Spread {
  mean: number;
  /** Sample standard deviation (n − 1); 0 for a single value. */
  sd: number;
  min: number;
  max: number;
  n: number;
}

/** Mean and spread of finite values (nulls, a run that did not reach a figure, are left out). */
export function spread(values: ReadonlyArray<number | null>): Spread | null {
  const xs = values.filter((v): v is number => v !== null && Number.isFinite(v));
  if (xs.length === 0) return null;
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  const sd = xs.length > 1 ? Math.sqrt(xs.reduce((a, b) => a + (b - mean) ** 2, 0) / (xs.length - 1)) : 0;
  return { mean, sd, min: Math.min(...xs), max: Math.max(...xs), n: xs.length };
}

/** Lower-cased word tokens (letters and digits), the unit of distinct-n. */
export function words(text: string): string[] {
  return text.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? [];
}

/**
 * distinct-n over a set of replies: unique n-grams / all n-grams, n-grams taken within each reply.
 * A model that collapses onto one phrasing drives it toward 0 even when each reply looks fine.
 */
export function distinctN(texts: readonly string[], n: number): number {
  const seen = new Set<string>();
  let total = 0;
  for (const t of texts) {
    const w = words(t);
    for (let i = 0; i + n <= w.length; i++) {
      seen.add(w.slice(i, i + n).join(' '));
      total++;
    }
  }
  return total === 0 ? 0 : seen.size / total;
}
