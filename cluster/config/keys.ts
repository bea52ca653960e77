/** Key spelling and path helpers: hyphen/underscore folding, path rendering, "did you mean". */
import type { ConfigIssue } from './errors.js';

export type PathSegment = string | number;

/** `['reef', 'api_keys', 0, 'key']` → `reef.api_keys[0].key`. */
export function renderPath(path: readonly PathSegment[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else out += out === '' ? seg : `.${seg}`;
  }
  return out;
}

export function canonicalKey(key: string): string {
  return key.replace(/-/g, '_');
}

export function isPlainObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Sets an own property even for names like `__proto__`, which plain assignment would not. */
export function setOwn(obj: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(obj, key, { value, enumerable: true, writable: true, configurable: true });
}

/**
 * A deep copy with every mapping key in its underscore spelling. A mapping that holds both
 * spellings of one key is ambiguous: it is reported, and the underscore spelling is kept.
 */
export function foldKeys(value: unknown, path: PathSegment[], issues: ConfigIssue[]): unknown {
  if (Array.isArray(value)) return value.map((item, i) => foldKeys(item, [...path, i], issues));
  if (!isPlainObject(value)) return value;
  const out: Record<string, unknown> = {};
  const seen = new Map<string, string>();
  for (const [key, child] of Object.entries(value)) {
    const canon = canonicalKey(key);
    const prior = seen.get(canon);
    if (prior !== undefined) {
      issues.push({ path: renderPath([...path, canon]), message: `both "${prior}" and "${key}" are set; use one spelling` });
      continue;
    }
    seen.set(canon, key);
    setOwn(out, canon, foldKeys(child, [...path, canon], issues));
  }
  return out;
}

/** The value at `path` in a plain tree, or undefined. */
export function valueAt(root: unknown, path: readonly PathSegment[]): unknown {
  let cur: unknown = root;
  for (const seg of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    if (!Object.hasOwn(cur, seg)) return undefined;
    cur = (cur as Record<PathSegment, unknown>)[seg];
  }
  return cur;
}

/** Optimal-string-alignment distance: Levenshtein plus adjacent transpositions. */
export function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)));
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      const row = d[i]!;
      const prev = d[i - 1]!;
      row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) row[j] = Math.min(row[j]!, d[i - 2]![j - 2]! + 1);
    }
  }
  return d[a.length]![b.length]!;
}

/** The closest candidate within edit distance 2, or null. */
export function closest(word: string, candidates: Iterable<string>): string | null {
  let best: string | null = null;
  let bestD = 3;
  for (const c of candidates) {
    const dist = editDistance(word, c);
    if (dist < bestD) [best, bestD] = [c, dist];
  }
  return best;
}
