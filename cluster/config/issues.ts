/** Turns zod issues into config issues: full paths, "expected X, got Y", "did you mean", misplaced keys. */
import type { z } from 'zod';
import type { ConfigIssue } from './errors.js';
import { closest, type PathSegment, renderPath, valueAt } from './keys.js';

interface Def {
  type: string;
  shape?: Record<string, z.ZodType>;
  innerType?: z.ZodType;
  out?: z.ZodType;
  element?: z.ZodType;
}
const defOf = (s: z.ZodType): Def => (s as unknown as { _zod: { def: Def } })._zod.def;

/** The schema of the object-ish node at `path` under `schema`, unwrapping defaults and pipes. */
function unwrap(schema: z.ZodType): z.ZodType {
  let cur = schema;
  for (;;) {
    const d = defOf(cur);
    if (d.type === 'pipe' && d.out) cur = d.out;
    else if (d.innerType && d.type !== 'object') cur = d.innerType;
    else return cur;
  }
}

/** Keys the schema accepts at `path` (for "did you mean"); empty when unknown. */
export function knownKeysAt(schema: z.ZodType, path: readonly PathSegment[]): string[] {
  let cur = unwrap(schema);
  for (const seg of path) {
    const d = defOf(cur);
    if (d.type === 'object' && typeof seg === 'string' && d.shape && Object.hasOwn(d.shape, seg)) cur = unwrap(d.shape[seg]!);
    else if (d.type === 'array' && typeof seg === 'number' && d.element) cur = unwrap(d.element);
    else return [];
  }
  const d = defOf(cur);
  return d.type === 'object' && d.shape ? Object.keys(d.shape) : [];
}

/** A value as an error message shows it: `-3`, `"abc"`, `a list`. */
export function show(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'a list';
  if (typeof v === 'object') return 'a mapping';
  if (typeof v === 'string') return JSON.stringify(v);
  return String(v);
}

const TYPE_NAMES: Record<string, string> = { object: 'a mapping', array: 'a list', string: 'a string', number: 'a number', int: 'an integer', boolean: 'true or false' };

/** Where each stage key belongs (`prm_url` → `pipeline.record2record.config.prm_url`). */
export type KeyHomes = ReadonlyMap<string, string>;

export interface IssueContext {
  /** Path of the validated value inside the whole config. */
  prefix: readonly PathSegment[];
  /** The schema the value was validated with. */
  schema: z.ZodType;
  /** The validated value itself (for "got ..."). */
  data: unknown;
  homes: KeyHomes;
}

export function unknownKeyIssue(full: readonly PathSegment[], key: string, known: readonly string[], homes: KeyHomes): ConfigIssue {
  const path = renderPath(full);
  const home = homes.get(key);
  if (home !== undefined && home !== path) return { path, message: `belongs at ${home}` };
  if (known.length === 0) return { path, message: `unknown key (${renderPath(full.slice(0, -1))} takes no keys)` };
  const near = closest(key, known);
  return { path, message: near === null ? 'unknown key' : `unknown key; did you mean ${near}?` };
}

export function convertIssues(issues: readonly z.core.$ZodIssue[], ctx: IssueContext): ConfigIssue[] {
  const out: ConfigIssue[] = [];
  for (const issue of issues) {
    const rel = issue.path as PathSegment[];
    const full = [...ctx.prefix, ...rel];
    if (issue.code === 'unrecognized_keys') {
      const known = knownKeysAt(ctx.schema, rel);
      for (const key of issue.keys) out.push(unknownKeyIssue([...full, key], key, known, ctx.homes));
      continue;
    }
    let message = issue.message;
    if (message.startsWith('expected ')) {
      const got = valueAt(ctx.data, rel);
      message = got === undefined ? `required (${message})` : `${message}, got ${show(got)}`;
    } else if (issue.code === 'invalid_type') {
      // Schemas built without the kit (e.g. a recipe's bare strictObject) keep zod's wording otherwise.
      const got = valueAt(ctx.data, rel);
      const what = TYPE_NAMES[issue.expected] ?? issue.expected;
      message = got === undefined ? `required (expected ${what})` : `expected ${what}, got ${show(got)}`;
    } else if (issue.code !== 'custom') {
      message = message.charAt(0).toLowerCase() + message.slice(1);
    }
    out.push({ path: renderPath(full), message });
  }
  return out;
}

/** Every key path a schema declares (`reef.api_keys[].key`), for docs and tooling. */
export function keyPaths(schema: z.ZodType, prefix: string): string[] {
  const d = defOf(unwrap(schema));
  if (d.type === 'array' && d.element) return keyPaths(d.element, `${prefix}[]`);
  if (d.type !== 'object' || !d.shape) return [];
  const out: string[] = [];
  for (const [key, child] of Object.entries(d.shape)) {
    const path = prefix === '' ? key : `${prefix}.${key}`;
    out.push(path, ...keyPaths(child, path));
  }
  return out;
}
