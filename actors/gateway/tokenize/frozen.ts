/**
 * Deeply frozen values, and a way to tell them apart. The chat-body memo (body-memo.ts) shares
 * parsed messages and tool lists between the requests of a session; frozen, they can also key
 * caches by identity (the tokenizer's per-message views, its converted tool lists), because an
 * object that can never change needs no comparison of its contents.
 */

const deeplyFrozen = new WeakSet<object>();

/** Freezes `value` and everything reachable from it; returns it. Parts frozen before are skipped. */
export function deepFreeze<T>(value: T): T {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (v === null || typeof v !== 'object' || deeplyFrozen.has(v)) continue;
    Object.freeze(v);
    deeplyFrozen.add(v);
    for (const child of Object.values(v)) if (child !== null && typeof child === 'object') stack.push(child);
  }
  return value;
}

/** True only for values `deepFreeze` froze (a shallow `Object.freeze` does not count). */
export function isDeepFrozen(value: unknown): value is object {
  return value !== null && typeof value === 'object' && deeplyFrozen.has(value);
}

/**
 * `compute`, with its result for each deeply frozen input kept (by identity, while the input
 * lives) and itself deeply frozen, so that what is built from it can be cached the same way.
 * Other inputs are computed every time. A throw is not kept. `compute` must depend only on its
 * first argument's contents; the others (an index for error messages) do not key the cache.
 */
export function perFrozen<A extends unknown[], R>(compute: (value: unknown, ...rest: A) => R): (value: unknown, ...rest: A) => R {
  const kept = new WeakMap<object, R>();
  return (value, ...rest) => {
    if (!isDeepFrozen(value)) return compute(value, ...rest);
    let out = kept.get(value);
    if (out === undefined) {
      out = deepFreeze(compute(value, ...rest));
      kept.set(value, out);
    }
    return out;
  };
}
