/**
 * Logprobs as JSON, for every reader that writes records out (`reef export`, the Reef API's record
 * page). JSON has no NaN or infinities, and JSON.stringify writes all three as null, so a token the
 * engine gave no logprob for (the gateway records NaN) read the same as a masked candidate
 * (-Infinity). A masked candidate is null, as it always was; NaN and +Infinity are the strings
 * "NaN" and "Infinity".
 */
export function logprobToJson(x: number): number | string | null {
  if (Number.isFinite(x)) return x;
  return x === Number.NEGATIVE_INFINITY ? null : String(x);
}

/** The number `logprobToJson` wrote. */
export function logprobFromJson(x: unknown): number {
  if (x === null) return Number.NEGATIVE_INFINITY;
  return typeof x === 'string' ? Number(x) : (x as number);
}
