import { literalAlternation } from './control-tokens.js';
import type { AddedTokenSpec } from './model-files.js';

/** A stretch of text between added tokens, or one added token (`id`). */
export interface AddedSplit {
  /** The piece's text: as written, or normalised where `normalized` says so. */
  text: string;
  /** The added token's id; null for text to encode. */
  id: number | null;
  /** The text has been through the normaliser already (the model must not normalise it again). */
  normalized: boolean;
  /** The piece starts the input (Metaspace's `prepend_scheme: "first"` prepends only there). */
  atStart: boolean;
}

/** The tokenizers crate's `\w` and `\s` (Rust regex, Unicode): what `single_word`, `lstrip` and `rstrip` look at. */
const WORD_AT_START = /^[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]/u;
const WORD_AT_END = /[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]$/u;
/** White_Space is all in the BMP, so one UTF-16 unit decides. */
const SPACE = /^\p{White_Space}$/u;
const isSpace = (text: string, i: number): boolean => SPACE.test(text[i]!);

/**
 * Finds added tokens in text as the tokenizers crate does (`AddedVocabulary::extract_and_normalize`),
 * for tokens whose flags @huggingface/tokenizers does not follow: it ignores `single_word`, strips
 * JS's whitespace for `lstrip`/`rstrip` (U+FEFF, not U+0085), and after normalising a piece takes
 * the whole piece for an added token when it equals one (a Lowercase model turned a user's
 * "<|IM_START|>" into the control token).
 *
 * First the tokens with `normalized: false` are matched in the text as written, leftmost-longest;
 * then each piece between them is normalised and the `normalized: true` tokens (their normalised
 * form) are matched in it.
 */
export class AddedTokenSplitter {
  private readonly raw: TokenSet;
  private readonly norm: TokenSet;

  constructor(tokens: readonly AddedTokenSpec[], private readonly normalize: ((text: string) => string) | null) {
    this.raw = new TokenSet(tokens.filter((t) => !t.normalized), (s) => s);
    this.norm = new TokenSet(tokens.filter((t) => t.normalized), (s) => (normalize ? normalize(s) : s));
  }

  split(text: string): AddedSplit[] {
    const out: AddedSplit[] = [];
    for (const [start, end, id] of this.raw.find(text)) {
      if (id !== null) {
        out.push({ text: text.slice(start, end), id, normalized: false, atStart: start === 0 });
        continue;
      }
      const piece = text.slice(start, end);
      if (this.norm.empty) {
        out.push({ text: piece, id: null, normalized: false, atStart: start === 0 });
        continue;
      }
      const normal = this.normalize ? this.normalize(piece) : piece;
      for (const [s, e, nid] of this.norm.find(normal)) {
        out.push({ text: normal.slice(s, e), id: nid, normalized: this.normalize !== null, atStart: start === 0 && s === 0 });
      }
    }
    return out;
  }
}

/** One matching set of the crate's added vocabulary (its `find_matches`). */
class TokenSet {
  private readonly re: RegExp;
  private readonly byPattern = new Map<string, AddedTokenSpec>();

  constructor(tokens: readonly AddedTokenSpec[], pattern: (content: string) => string) {
    for (const t of tokens) {
      const p = pattern(t.content);
      // Two tokens with one pattern: the crate's automaton reports the first added.
      if (p !== '' && !this.byPattern.has(p)) this.byPattern.set(p, t);
    }
    this.re = new RegExp(literalAlternation([...this.byPattern.keys()]), 'gu');
  }

  get empty(): boolean {
    return this.byPattern.size === 0;
  }

  /** [start, end, id or null] spans covering `text`, as the crate's `find_matches`. */
  find(text: string): [number, number, number | null][] {
    if (text === '') return [[0, 0, null]];
    const splits: [number, number, number | null][] = [];
    let offset = 0;
    for (const m of text.matchAll(this.re)) {
      let start = m.index;
      let stop = start + m[0].length;
      const t = this.byPattern.get(m[0])!;
      // A code point is at most two UTF-16 units.
      if (t.singleWord && (WORD_AT_END.test(text.slice(Math.max(0, start - 2), start)) || WORD_AT_START.test(text.slice(stop, stop + 2)))) continue;
      if (t.lstrip) {
        let s = start;
        while (s > 0 && isSpace(text, s - 1)) s--;
        // Spaces an earlier match already took stay with it.
        start = Math.max(s, offset);
      }
      if (t.rstrip) while (stop < text.length && isSpace(text, stop)) stop++;
      if (offset < start) splits.push([offset, start, null]);
      splits.push([start, stop, t.id]);
      offset = stop;
    }
    if (offset !== text.length) splits.push([offset, text.length, null]);
    return splits;
  }
}
