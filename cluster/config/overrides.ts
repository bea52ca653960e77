/**
 * Command-line overrides: `--path.to.key=value`, applied to the YAML tree before validation, so an
 * override is checked exactly like the file (an unknown path is an unknown key).
 */
import YAML from 'yaml';
import type { ConfigIssue } from './errors.js';
import { canonicalKey, foldKeys, isPlainObject, type PathSegment, renderPath, setOwn } from './keys.js';

const OVERRIDE = /^--([A-Za-z_][\w-]*(?:\[\d+\])*(?:\.[\w-]+(?:\[\d+\])*)+)(?:=([\s\S]*))?$/;

/**
 * Splits argv into overrides (any `--a.b...` flag; `--a.b=v` or `--a.b v`) and everything else.
 * Overrides come back as `--a.b=v`.
 */
export function parseOverrides(argv: readonly string[]): { overrides: string[]; rest: string[] } {
  const overrides: string[] = [];
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = OVERRIDE.exec(arg);
    if (m === null) {
      rest.push(arg);
    } else if (m[2] !== undefined) {
      overrides.push(arg);
    } else {
      const next = argv[i + 1];
      if (next !== undefined && !next.startsWith('--')) {
        overrides.push(`${arg}=${next}`);
        i++;
      } else {
        // Left for applyOverrides to report, with the override named.
        overrides.push(arg);
      }
    }
  }
  return { overrides, rest };
}

/** Overrides as `--a.b=v` strings, or a map of dotted path → value (the `REEF_ACTOR` shape). */
export type Overrides = readonly string[] | Readonly<Record<string, unknown>>;

/**
 * The map form as strings. A string value is the command-line text (`'9000'` is read as YAML,
 * exactly as `--reef.port=9000` would be); any other value is written as JSON, which YAML reads
 * back unchanged.
 */
export function overrideStrings(overrides: Overrides): readonly string[] {
  if (Array.isArray(overrides)) return overrides as readonly string[];
  return Object.entries(overrides).map(([path, value]) => `--${path}=${typeof value === 'string' ? value : JSON.stringify(value ?? null)}`);
}

/** `a.b[0].c` / `a.b.0.c` → ['a', 'b', 0, 'c'] with keys in underscore spelling. */
function splitPath(text: string): PathSegment[] {
  const out: PathSegment[] = [];
  for (const part of text.split('.')) {
    const m = /^([^[\]]*)((?:\[\d+\])*)$/.exec(part)!;
    if (m[1] !== '') out.push(/^\d+$/.test(m[1]!) ? Number(m[1]) : canonicalKey(m[1]!));
    for (const idx of m[2]!.matchAll(/\[(\d+)\]/g)) out.push(Number(idx[1]));
  }
  return out;
}

/**
 * A YAML scalar or flow value (`3`, `true`, `null`, `[a, b]`); text YAML cannot read stays text, and
 * so does text YAML would partly read as a comment or a document marker: `--x.key=#a1` became null
 * and `--x.key=abc #1` became `abc`, with nothing said.
 */
export function parseOverrideValue(text: string): unknown {
  if (text === '') return '';
  if (/^(---|\.\.\.)(\s|$)/.test(text)) return text;
  try {
    const doc = YAML.parseDocument(text);
    if (doc.errors.length > 0 || hasComment(doc) || hasComment(doc.contents)) return text;
    return doc.toJS();
  } catch {
    return text;
  }
}

function hasComment(node: unknown): boolean {
  if (typeof node !== 'object' || node === null) return false;
  const n = node as { comment?: string | null; commentBefore?: string | null; items?: unknown[]; key?: unknown; value?: unknown };
  if (n.comment || n.commentBefore) return true;
  return (n.items ?? []).some(hasComment) || hasComment(n.key) || hasComment(n.value);
}

const FORBIDDEN = new Set(['__proto__', 'constructor', 'prototype']);

/** Applies overrides to `tree` in place; returns the issues of overrides that cannot be applied. */
export function applyOverrides(tree: Record<string, unknown>, overrides: Overrides): ConfigIssue[] {
  const issues: ConfigIssue[] = [];
  for (const raw of overrideStrings(overrides)) {
    const arg = raw.startsWith('--') ? raw : `--${raw}`;
    const m = OVERRIDE.exec(arg);
    if (m === null || m[2] === undefined) {
      issues.push({ path: raw, message: 'expected an override --path.to.key=value' });
      continue;
    }
    const path = splitPath(m[1]!);
    const bad = path.find((s) => typeof s === 'string' && (FORBIDDEN.has(s) || s === ''));
    if (bad !== undefined) {
      issues.push({ path: renderPath(path), message: 'unknown key' });
      continue;
    }
    const value = foldKeys(parseOverrideValue(m[2]), path, issues);
    const keys = literalKeyPaths(path, value);
    if (keys.length > 0) {
      for (const at of keys) issues.push({ path: renderPath(at), message: literalKeyMessage(at[2] as number) });
      continue;
    }
    const problem = setPath(tree, path, value);
    if (problem !== null) issues.push({ path: renderPath(path.slice(0, problem.depth)), message: problem.message.replace('{flag}', arg.split('=')[0]!) });
  }
  return issues;
}

/** `reef.api_keys[N].key`, the one place a literal key is written. */
const KEY_PATH: readonly ((seg: PathSegment) => boolean)[] = [(s) => s === 'reef', (s) => s === 'api_keys', (s) => typeof s === 'number', (s) => s === 'key'];

/**
 * Where an override would write a literal API key: `--reef.api_keys[0].key=K`, and as well a flow
 * value holding one (`--reef.api_keys=[{key: K}]`, `--reef={api_keys: ...}`). An override is in some
 * process's argv, which every user of the machine can read (`ps`, /proc/<pid>/cmdline), and
 * `reef up` hands its overrides on to its detached child and to every actor. `null` writes no key,
 * so `--reef.api_keys[0].key=null` beside a `key_env` override is allowed.
 */
function literalKeyPaths(at: readonly PathSegment[], value: unknown): PathSegment[][] {
  const n = Math.min(at.length, KEY_PATH.length);
  for (let i = 0; i < n; i++) if (!KEY_PATH[i]!(at[i]!)) return [];
  if (at.length >= KEY_PATH.length) return value === null ? [] : [at.slice(0, KEY_PATH.length)];
  if (Array.isArray(value)) return value.flatMap((v, i) => literalKeyPaths([...at, i], v));
  if (isPlainObject(value)) return Object.entries(value).flatMap(([k, v]) => literalKeyPaths([...at, k], v));
  return [];
}

function literalKeyMessage(entry: number): string {
  return `an API key may not be given on the command line, where every user of this machine can read it (ps, /proc/<pid>/cmdline): write it in the config file (readable by its owner alone), or put it in an environment variable and name that in reef.api_keys[${entry}].key_env (also as an override: --reef.api_keys[${entry}].key_env=NAME)`;
}

/** Sets `value` at `path`, creating mappings on the way; reports where that is impossible. */
function setPath(tree: Record<string, unknown>, path: readonly PathSegment[], value: unknown): { depth: number; message: string } | null {
  let cur: Record<string, unknown> | unknown[] = tree;
  for (let i = 0; i < path.length; i++) {
    const seg = path[i]!;
    const isLast = i === path.length - 1;
    if (typeof seg === 'number') {
      if (!Array.isArray(cur)) return { depth: i + 1, message: 'unknown key' };
      if (seg > cur.length || (!isLast && seg === cur.length)) return { depth: i + 1, message: `no such list item (the list has ${cur.length})` };
    } else if (Array.isArray(cur)) {
      return { depth: i + 1, message: 'expected a list index' };
    }
    const container = cur as Record<string, unknown>;
    if (isLast) {
      setOwn(container, String(seg), value);
      return null;
    }
    let next: unknown = container[seg];
    if (next === undefined || next === null) {
      next = typeof path[i + 1] === 'number' ? [] : {};
      setOwn(container, String(seg), next);
    }
    if (!isPlainObject(next) && !Array.isArray(next)) return { depth: i + 1, message: `is ${JSON.stringify(next)}, not a mapping, so {flag} cannot be set` };
    cur = next;
  }
  return null;
}
