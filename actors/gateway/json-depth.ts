/** Deeper than any real request (tool schemas nest a few levels); well below the stack's limit. */
export const MAX_JSON_DEPTH = 128;

/** Iterative, so that measuring a hostile body cannot itself overflow the stack. */
export function nestedDeeperThan(value: object, limit: number): boolean {
  const stack: Array<[unknown, number]> = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (depth > limit) return true;
    for (const child of Object.values(v as object)) {
      if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
    }
  }
  return false;
}

/**
 * What the raw-body chat route checks after `JSON.parse`, in one walk: nesting past `limit`, and
 * the prototype keys fastify's own JSON parser refuses (`__proto__`, `constructor.prototype`).
 * `JSON.parse` makes such keys plain own properties, but code that later copies the object by
 * assignment would set a prototype instead. Checking the parsed value catches every spelling of
 * the key, unicode escapes included, which a text search would not.
 */
export function inspectParsedJson(value: object, limit: number): 'too-deep' | 'prototype-key' | null {
  const stack: Array<[object, number]> = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (depth > limit) return 'too-deep';
    if (!Array.isArray(v)) {
      if (Object.hasOwn(v, '__proto__')) return 'prototype-key';
      const ctor = (v as { constructor?: unknown }).constructor;
      if (Object.hasOwn(v, 'constructor') && ctor !== null && typeof ctor === 'object' && Object.hasOwn(ctor, 'prototype')) return 'prototype-key';
    }
    for (const child of Object.values(v)) {
      if (child !== null && typeof child === 'object') stack.push([child as object, depth + 1]);
    }
  }
  return null;
}
