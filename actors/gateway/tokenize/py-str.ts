/**
 * Python's str and json semantics where JS's differ, for chat templates: transformers renders them
 * with jinja2 on Python strings, and the ids must match. The compiled renderer
 * (template-compiler.ts) and the interpreter patch (jinja-compat.ts) both use these, because the
 * compiled renderer is checked against the interpreter and the two must agree.
 */

/**
 * Python's whitespace (`str.isspace`, and what `strip()`/`split()` without arguments remove): JS's
 * `trim` set without U+FEFF, plus U+001C–U+001F and U+0085. None of it is astral, so UTF-16 units
 * can be tested one at a time.
 */
export function isPySpace(c: number): boolean {
  if (c <= 0x20) return c === 0x20 || (c >= 0x09 && c <= 0x0d) || c >= 0x1c;
  if (c < 0x85) return false;
  return c === 0x85 || c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000;
}

const PY_SPACE_CLASS = '\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const PY_WORDS = new RegExp(`[^${PY_SPACE_CLASS}]+`, 'g');

/**
 * `s.strip(chars)` (both ends), `lstrip` (`right` false) or `rstrip` (`left` false); `chars` null
 * strips Python's whitespace. `chars` is a set of code points, as in Python, so a character of it
 * outside the BMP removes only its whole surrogate pair.
 */
export function pyStrip(s: string, chars: string | null, left: boolean, right: boolean): string {
  let i = 0;
  let j = s.length;
  if (chars === null) {
    if (left) while (i < j && isPySpace(s.charCodeAt(i))) i++;
    if (right) while (j > i && isPySpace(s.charCodeAt(j - 1))) j--;
    return i === 0 && j === s.length ? s : s.slice(i, j);
  }
  if (chars.length === 0) return s;
  const only = chars.charCodeAt(0);
  if (chars.length === 1 && (only < 0xd800 || only > 0xdfff)) {
    // The common case (`strip('\n')` in Qwen templates), without building a set each call.
    if (left) while (i < j && s.charCodeAt(i) === only) i++;
    if (right) while (j > i && s.charCodeAt(j - 1) === only) j--;
    return i === 0 && j === s.length ? s : s.slice(i, j);
  }
  const set = Array.from(chars, (c) => c.codePointAt(0)!);
  if (left) {
    while (i < j) {
      const cp = s.codePointAt(i)!;
      if (!set.includes(cp)) break;
      i += cp > 0xffff ? 2 : 1;
    }
  }
  if (right) {
    while (j > i) {
      let cp = s.charCodeAt(j - 1);
      let width = 1;
      if (cp >= 0xdc00 && cp <= 0xdfff && j - 2 >= i) {
        const hi = s.charCodeAt(j - 2);
        if (hi >= 0xd800 && hi <= 0xdbff) {
          cp = ((hi - 0xd800) << 10) + (cp - 0xdc00) + 0x10000;
          width = 2;
        }
      }
      if (!set.includes(cp)) break;
      j -= width;
    }
  }
  return i === 0 && j === s.length ? s : s.slice(i, j);
}

/**
 * `s.split()` / `s.split(None, maxsplit)`: runs of Python whitespace separate, none is kept at
 * either end, and past `maxsplit` splits the rest is one item, without its leading whitespace.
 */
export function pySplitWhitespace(s: string, maxsplit: number): string[] {
  const out: string[] = [];
  for (const m of s.matchAll(PY_WORDS)) {
    if (maxsplit !== -1 && out.length >= maxsplit) {
      out.push(s.slice(m.index));
      break;
    }
    out.push(m[0]);
  }
  return out;
}

/**
 * A float as Python's `repr` (and so `json.dumps`) writes it. The digits are the shortest that read
 * back to the same double in both languages; only the layout differs: Python switches to an
 * exponent below 1e-4 and from 1e16 (JS below 1e-6 and from 1e21), writes at least two exponent
 * digits with a sign (`1e-07`, `1e+16`), and gives an integral float a `.0`.
 */
export function pyFloatRepr(x: number): string {
  if (x !== x) return 'NaN';
  if (x === Infinity) return 'Infinity';
  if (x === -Infinity) return '-Infinity';
  if (x === 0) return Object.is(x, -0) ? '-0.0' : '0.0';
  const a = Math.abs(x);
  if (a >= 1e-4 && a < 1e16) {
    const s = String(x);
    return Number.isInteger(x) ? s + '.0' : s;
  }
  const e = x.toExponential();
  const digits = e.indexOf('e') + 2;
  return e.length - digits === 1 ? `${e.slice(0, digits)}0${e.slice(digits)}` : e;
}

/** Title case of the four Unicode digraphs, whose upper case differs from it (ǆ: Ǆ, but title ǅ). */
const DIGRAPH_TITLE: Record<string, string> = { Ǆ: 'ǅ', ǅ: 'ǅ', ǆ: 'ǅ', Ǉ: 'ǈ', ǈ: 'ǈ', ǉ: 'ǈ', Ǌ: 'ǋ', ǋ: 'ǋ', ǌ: 'ǋ', Ǳ: 'ǲ', ǲ: 'ǲ', ǳ: 'ǲ' };

/**
 * `s.capitalize()` (and jinja2's `capitalize` filter): the first character in title case, the rest
 * in lower case. JS templates upper-cased the first and left the rest as it was.
 */
export function pyCapitalize(s: string): string {
  if (s.length === 0) return s;
  const first = String.fromCodePoint(s.codePointAt(0)!);
  return titleChar(first) + s.slice(first.length).toLowerCase();
}

/** One character in title case: its upper case with all but the first character lowered (ß: SS, title Ss). */
function titleChar(ch: string): string {
  const digraph = DIGRAPH_TITLE[ch];
  if (digraph !== undefined) return digraph;
  const upper = ch.toUpperCase();
  const lead = String.fromCodePoint(upper.codePointAt(0)!);
  return lead + upper.slice(lead.length).toLowerCase();
}

const CASED = /\p{Cased}/u;

/** `s.title()`: a cased character after an uncased one is title-cased, every other one lowered ("they'Re", "Temp_C"). */
export function pyTitle(s: string): string {
  let out = '';
  let prevCased = false;
  for (const ch of s) {
    out += prevCased ? ch.toLowerCase() : titleChar(ch);
    prevCased = CASED.test(ch);
  }
  return out;
}

const WORD_BEGINNING = new RegExp(`([-${PY_SPACE_CLASS}({\\[<]+)`, 'u');

/** jinja2's `title` filter (not str.title): each word after a dash, space or opening bracket gets an upper-case first character and the rest lowered. */
export function jinjaTitle(s: string): string {
  let out = '';
  for (const item of s.split(WORD_BEGINNING)) {
    if (item.length === 0) continue;
    const first = String.fromCodePoint(item.codePointAt(0)!);
    out += first.toUpperCase() + item.slice(first.length).toLowerCase();
  }
  return out;
}

/** `s.islower()` / `s.isupper()` (jinja2's `lower` and `upper` tests): at least one cased character, and none of the other case. */
export function pyIsLower(s: string): boolean {
  // By property, not by mapping: 𝔘 (Lu) has no lower case, and is still not lower.
  return !UPPER_OR_TITLE.test(s) && LOWER.test(s);
}

export function pyIsUpper(s: string): boolean {
  return !LOWER_OR_TITLE.test(s) && UPPER.test(s);
}

const LOWER = /\p{Lowercase}/u;
const UPPER = /\p{Uppercase}/u;
const UPPER_OR_TITLE = /[\p{Uppercase}\p{Lt}]/u;
const LOWER_OR_TITLE = /[\p{Lowercase}\p{Lt}]/u;

/**
 * Python's order of two strings (code point by code point), as `sorted` and `json.dumps(...,
 * sort_keys=True)` use; JS's `<` compares UTF-16 units, which differs only past U+FFFF.
 */
export function pyCompare(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x === y) continue;
    // A surrogate (an astral code point) sorts after every BMP character in code point order.
    const sx = x >= 0xd800 && x <= 0xdfff;
    const sy = y >= 0xd800 && y <= 0xdfff;
    if (sx !== sy) return sx ? 1 : -1;
    return x < y ? -1 : 1;
  }
  return a.length - b.length;
}

/** Characters Python's `str.isprintable` rejects (but the space), which `repr` escapes. */
const NON_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

/** `repr(s)`: how Python prints a string inside a printed list or dict. */
export function pyStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const c = ch.codePointAt(0)!;
    if (ch === quote || ch === '\\') out += '\\' + ch;
    else if (ch === '\t') out += '\\t';
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (c >= 0x20 && c < 0x7f) out += ch;
    else if (c < 0x7f || c === 0x7f || (c > 0x7f && c !== 0x20 && NON_PRINTABLE.test(ch))) {
      out += c < 0x100 ? '\\x' + c.toString(16).padStart(2, '0') : c < 0x10000 ? '\\u' + c.toString(16).padStart(4, '0') : '\\U' + c.toString(16).padStart(8, '0');
    } else out += ch;
  }
  return out + quote;
}

/** `len(s)`: code points, where JS's `length` counts UTF-16 units (an emoji is 1, not 2). */
export function pyLen(s: string): number {
  let n = s.length;
  for (let i = 0; i < s.length - 1; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n--;
        i++;
      }
    }
  }
  return n;
}

/** `s[i]`: the i-th code point (negative from the end), or undefined past either end. */
export function pyCharAt(s: string, i: number): string | undefined {
  return pyLen(s) === s.length ? s.at(i) : Array.from(s).at(i);
}
