import { tokenize as lexTemplate } from '@huggingface/jinja';
import type { AddedTokenSpec } from './model-files.js';
import { isPySpace } from './py-str.js';

/**
 * Special-token injection guard, the same scheme as transformers 5
 * `apply_chat_template(..., sanitize_control_tokens=True)` so both languages give the same ids:
 * control-token strings inside user-supplied strings (messages, tools, extra template variables)
 * are wrapped in two private-use markers before rendering; after rendering, the text is split at
 * the markers and each marked token is encoded as plain text, while the template's own control
 * tokens (unmarked) stay tokens.
 */
export const MARK_START = '\u{F0000}';
export const MARK_END = '\u{F0001}';

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** Alternation of the given literals, longest first so a token wins over the tokens it contains. */
export function literalAlternation(tokens: readonly string[]): string {
  const sorted = [...tokens].sort((a, b) => b.length - a.length);
  return sorted.length > 0 ? sorted.map(escapeRegExp).join('|') : '(?!)';
}

/**
 * The literal text of a template: its raw text blocks and string constants, joined with NUL so a
 * search cannot match across two of them (as transformers' `_get_template_literal_text`).
 */
export function templateLiteralText(template: string): string {
  const literals = new Set<string>();
  for (const tok of lexTemplate(template, { lstrip_blocks: true, trim_blocks: true })) {
    if (tok.type === 'Text' || tok.type === 'StringLiteral') literals.add(tok.value);
  }
  return [...literals].join('\0');
}

/**
 * The tokens that may not come from user strings: every special added token, plus the added tokens
 * the template itself writes (`<think>`, `<tool_call>`), or the tokenizer config's explicit
 * `chat_control_tokens` list when it has one.
 */
export function controlTokens(added: readonly AddedTokenSpec[], template: string, explicit: readonly string[] | null): string[] {
  if (explicit) {
    const set = new Set(explicit);
    return added.filter((t) => t.special || set.has(t.content)).map((t) => t.content);
  }
  const literal = templateLiteralText(template);
  return added.filter((t) => t.special || (literal.includes(t.content) && !isPySpaceOnly(t.content))).map((t) => t.content);
}

/**
 * Python's `str.isspace()`, which transformers leaves whitespace tokens (Gemma's "\n") out with;
 * JS's `trim` disagrees at U+001C–U+001F, U+0085 and U+FEFF.
 */
function isPySpaceOnly(s: string): boolean {
  if (s === '') return false;
  for (let i = 0; i < s.length; i++) if (!isPySpace(s.charCodeAt(i))) return false;
  return true;
}

/** Wraps control tokens in user strings; reusable for every render of one model. */
export class ControlTokenMarker {
  private readonly tokenRe: RegExp;
  /** Marked token, or a lone marker (a template's `split()` can separate a marker from its token). */
  private readonly markersRe: RegExp;

  constructor(control: readonly string[], allAdded: readonly string[]) {
    this.tokenRe = new RegExp(literalAlternation(control), 'gu');
    this.markersRe = new RegExp(`${MARK_START}(${literalAlternation(allAdded)})${MARK_END}|[${MARK_START}${MARK_END}]`, 'gu');
  }

  /** Marks every string value, recursively; object keys are left alone (as in Python). */
  mark<T>(value: T): T {
    return this.markValue(value) as T;
  }

  private markValue(value: unknown): unknown {
    if (typeof value === 'string') {
      // Markers already present are dropped first, so a client cannot forge a marked token.
      const clean = value.includes(MARK_START) || value.includes(MARK_END) ? value.replaceAll(MARK_START, '').replaceAll(MARK_END, '') : value;
      this.tokenRe.lastIndex = 0;
      return this.tokenRe.test(clean) ? clean.replace(this.tokenRe, `${MARK_START}$&${MARK_END}`) : clean;
    }
    if (Array.isArray(value)) return value.map((v) => this.markValue(v));
    if (value && typeof value === 'object') {
      const out: Record<string, unknown> = {};
      // Keys too: a template prints tool parameter names and object arguments (`tojson`, `items`),
      // and a key is as much the client's text as a value. Keys without control tokens stay as
      // they are, so the template's own lookups (role, content, ...) find them.
      for (const [k, v] of Object.entries(value)) out[this.markValue(k) as string] = this.markValue(v);
      return out;
    }
    return value;
  }

  /**
   * Splits a rendered chat into pieces: `asText` pieces are marked tokens (encode as plain text),
   * the others are template text (encode normally). Lone markers vanish but still break the text.
   * Mirrors Python's `re.split` with one capture group: [text, token|None, text, token|None, ..., text].
   */
  /** Whether a render has markers in it, i.e. `split` gives more than the one piece. */
  hasMarkers(rendered: string): boolean {
    return rendered.includes(MARK_START) || rendered.includes(MARK_END);
  }

  split(rendered: string): { text: string; asText: boolean; first: boolean }[] {
    if (!this.hasMarkers(rendered)) return [{ text: rendered, asText: false, first: true }];
    const pieces: { text: string; asText: boolean; first: boolean }[] = [];
    let last = 0;
    let first = true;
    this.markersRe.lastIndex = 0;
    for (const m of rendered.matchAll(this.markersRe)) {
      const before = rendered.slice(last, m.index);
      if (first || before) pieces.push({ text: before, asText: false, first });
      first = false;
      if (m[1]) pieces.push({ text: m[1], asText: true, first: false });
      last = m.index + m[0].length;
    }
    const tail = rendered.slice(last);
    if (tail) pieces.push({ text: tail, asText: false, first: false });
    return pieces;
  }
}
