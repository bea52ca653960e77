import * as hfTokenizers from '@huggingface/tokenizers';
import type { Tokenizer } from '@huggingface/tokenizers';

/** The parts of the package's BPE model this patch touches (its type declarations do not resolve under NodeNext). */
interface PackageBpe {
  bpe: (token: string) => string[];
}

/**
 * Makes the package's BPE model in `t` leave out, as the tokenizers crate does, the characters
 * of a word that are not in its vocabulary, before merging, when the model has no unk token (and
 * no byte fallback covers them). The crate's `merge_word` never puts such a character into the
 * word, so its neighbours merge across the gap; the package kept it in the word, where it blocked
 * those merges, and dropped it only afterwards. `spec` is tokenizer.json's `model`.
 *
 * A byte-level vocabulary can lack bytes it never saw in training: SmolLM2's lacks 21 of the 256
 * (0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, and lead bytes 0xc0, 0xc1, 0xf1-0xff), so `">\x1d<"` is
 * one id ("><") in transformers and was two in the package. A byte-level model whose vocabulary
 * has all 256 is left as it is: no word can hold a character outside it.
 */
export function bpeDropsUnknownAsCrate(t: Tokenizer, spec: unknown): void {
  const { BPE, ByteLevelPreTokenizer } = hfTokenizers as unknown as Record<'BPE' | 'ByteLevelPreTokenizer', abstract new (...args: never[]) => object>;
  const model = (t as unknown as { model?: unknown }).model;
  if (!(model instanceof BPE) || spec === null || typeof spec !== 'object') return;
  const s = spec as { vocab?: unknown; unk_token?: unknown; byte_fallback?: unknown; continuing_subword_prefix?: unknown; end_of_word_suffix?: unknown };
  // With an unk token both put one in the word (the package fuses them afterwards, as the crate does
  // while building the word). A prefix or suffix changes the crate's look-up key: not handled here.
  if (s.unk_token !== null && s.unk_token !== undefined) return;
  if (s.continuing_subword_prefix || s.end_of_word_suffix) return;
  if (s.vocab === null || typeof s.vocab !== 'object') return;
  const vocab = s.vocab as Record<string, unknown>;
  // The crate looks each character up on its own: only single-character entries matter.
  const known = new Set<string>();
  for (const piece of Object.keys(vocab)) if (piece.length <= 2 && [...piece].length === 1) known.add(piece);
  const byteLevel = findByteLevel(t.pre_tokenizer, ByteLevelPreTokenizer);
  if (byteLevel !== null && Object.values(byteLevel.byte_encoder).every((c) => known.has(c))) return;

  const utf8 = new TextEncoder();
  const byteFallback = s.byte_fallback === true;
  const covered = (c: string): boolean => Array.from(utf8.encode(c)).every((b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>` in vocab);
  const keep = (c: string): boolean => known.has(c) || (byteFallback && covered(c));
  const bpeModel = model as unknown as PackageBpe;
  const bpe = bpeModel.bpe.bind(model);
  bpeModel.bpe = (token: string): string[] => {
    let all = true;
    for (const c of token) {
      if (!keep(c)) {
        all = false;
        break;
      }
    }
    if (all) return bpe(token);
    let kept = '';
    for (const c of token) if (keep(c)) kept += c;
    return bpe(kept);
  };
}

/** The package's ByteLevel pre-tokenizer in `p` (alone or in a Sequence), or null. */
function findByteLevel(p: unknown, ByteLevel: abstract new (...args: never[]) => object): { byte_encoder: Record<string, string> } | null {
  if ((typeof p !== 'object' && typeof p !== 'function') || p === null) return null;
  if (p instanceof ByteLevel) return p as unknown as { byte_encoder: Record<string, string> };
  const subs = (p as { tokenizers?: unknown }).tokenizers;
  if (!Array.isArray(subs)) return null;
  for (const sub of subs) {
    const found = findByteLevel(sub, ByteLevel);
    if (found !== null) return found;
  }
  return null;
}
