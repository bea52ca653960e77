/** Reproducible random choices for generated test corpora, without a dependency. */

export type Rand = () => number;

/** xorshift32 in [0, 1). */
export function seeded(seed: number): Rand {
  let x = seed >>> 0 || 0x9e3779b9;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 4294967296;
  };
}

export const pick = <T,>(r: Rand, xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
