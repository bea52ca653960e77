import { NotUtf8Error, utf8Text } from './tokenize/utf8.js';

/** Deeper than any real request (tool schemas nest a few levels); well below the stack's limit. */
export const MAX_JSON_DEPTH = 128;

/**
 * Why a parsed JSON body is refused before any handler sees it, or null. One iterative walk (so
 * that measuring a hostile body cannot itself overflow the stack) checks two things:
 * - nesting past MAX_JSON_DEPTH: JSON.parse takes any depth, but JSON.stringify (storing the
 *   request) and structured clone recurse, and would fail with a 5xx instead of a 4xx;
 * - the prototype keys fastify's JSON parser refuses (`__proto__`, `constructor.prototype`), for the
 *   chat route, which parses its raw body itself. `JSON.parse` makes such keys plain own
 *   properties, but code that later copies the object by assignment would set a prototype instead.
 *   Checking the parsed value catches every spelling of the key, unicode escapes included.
 * `depth` is the value's own depth in the body (1 for the body itself).
 */
export function parsedBodyProblem(value: unknown, depth = 1): string | null {
  if (value === null || typeof value !== 'object') return null;
  const stack: Array<[object, number]> = [[value, depth]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (depth > MAX_JSON_DEPTH) return `request body is nested more than ${MAX_JSON_DEPTH} levels deep`;
    if (!Array.isArray(v)) {
      const ctor = (v as { constructor?: unknown }).constructor;
      if (Object.hasOwn(v, '__proto__') || (Object.hasOwn(v, 'constructor') && ctor !== null && typeof ctor === 'object' && Object.hasOwn(ctor, 'prototype'))) {
        return 'request body is not valid JSON: Object contains forbidden prototype property';
      }
    }
    for (const child of Object.values(v)) {
      if (child !== null && typeof child === 'object') stack.push([child as object, depth + 1]);
    }
  }
  return null;
}

/**
 * A raw request body (UTF-8 bytes) as JSON, with the checks above: what the chat route's worker
 * does with a body it has not seen before (tokenize/prepare.ts), and what the routes that
 * translate a body on the event loop (Messages, Responses) do first. `problem` is the 400's
 * message (REEF_ERR_BODY).
 */
export function parseJsonBody(body: Uint8Array): { json: unknown } | { problem: string } {
  let json: unknown;
  try {
    json = JSON.parse(utf8Text(body));
  } catch (err) {
    return { problem: err instanceof NotUtf8Error ? err.message : `request body is not valid JSON: ${(err as Error).message}` };
  }
  const problem = parsedBodyProblem(json);
  return problem === null ? { json } : { problem };
}
