/**
 * The body of a `<tool_call>` block: `{"name": ..., "arguments": {...}}`. Returns null when it is
 * not a valid call, so the caller leaves the block in the content instead of failing the request.
 * `arguments` given as a string is kept verbatim when it is the JSON text of an object; an object
 * is serialised. Anything else is no call: clients `JSON.parse` the arguments into the tool's
 * parameters object, and would fail on `x=1` or get an array.
 */
export function parseToolCallBody(body: string): { name: string; arguments: string } | null {
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return null;
  }
  if (!value || typeof value !== 'object' || Array.isArray(value)) return null;
  const { name, arguments: args, parameters } = value as { name?: unknown; arguments?: unknown; parameters?: unknown };
  if (typeof name !== 'string' || name.length === 0) return null;
  // Some fine-tunes write `parameters` instead of `arguments`.
  const a = args !== undefined ? args : parameters;
  if (a === undefined || a === null) return { name, arguments: '{}' };
  if (typeof a === 'string') return isJsonObject(a) ? { name, arguments: a } : null;
  if (typeof a !== 'object' || Array.isArray(a)) return null;
  return { name, arguments: JSON.stringify(a) };
}

function isJsonObject(text: string): boolean {
  try {
    const v: unknown = JSON.parse(text);
    return v !== null && typeof v === 'object' && !Array.isArray(v);
  } catch {
    return false;
  }
}

/** The longest suffix of `text` that is a proper prefix of `tag`: text that may still become the tag. */
export function partialTagSuffix(text: string, tag: string): number {
  const max = Math.min(text.length, tag.length - 1);
  for (let n = max; n > 0; n--) if (tag.startsWith(text.slice(text.length - n))) return n;
  return 0;
}

/**
 * Whether `text`, read as the start of a JSON object, ends inside a string literal. Text that does
 * not start (after whitespace) with `{` is no JSON call and never is.
 */
export function endsInsideJsonString(text: string): boolean {
  const start = text.search(/\S/);
  if (start === -1 || text[start] !== '{') return false;
  let inString = false;
  for (let i = start + 1; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (!inString) inString = c === 0x22; // "
    else if (c === 0x5c) i++; // a backslash escapes the next character
    else if (c === 0x22) inString = false;
  }
  return inString;
}
