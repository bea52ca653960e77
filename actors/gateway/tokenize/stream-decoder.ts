/** Anything that turns ids into text (a ChatTokenizer, for one). */
export interface IdDecoder {
  decode(ids: ArrayLike<number>, opts?: { skipSpecialTokens?: boolean }): string;
}

/**
 * Incremental detokenization for streaming (the prefix/read-offset scheme of TGI and vLLM).
 *
 * Byte-level tokens can end in the middle of a UTF-8 character, and decoding such a prefix gives
 * U+FFFD at its end; some decoders also change a token's text depending on the token before it.
 * So each push decodes a small window — the previous emitted token(s) as left context plus the new
 * ids — and emits only the text beyond the context once it no longer ends in U+FFFD. Each push costs
 * O(window), not O(output).
 */
export class StreamDecoder {
  private readonly ids: number[] = [];
  /** Start of the left context. */
  private prefixOffset = 0;
  /** End of what has been emitted. */
  private readOffset = 0;
  private emitted = '';

  constructor(private readonly decoder: IdDecoder, private readonly opts: { skipSpecialTokens?: boolean } = {}) {}

  /** Add ids; returns the new text they complete ('' while a character is still split). */
  push(ids: ArrayLike<number>): string {
    for (let i = 0; i < ids.length; i++) this.ids.push(ids[i]!);
    return this.step(false);
  }

  /** Whatever is still held back (an incomplete character at the very end); call once at the end. */
  flush(): string {
    return this.step(true);
  }

  /** All text emitted so far. */
  text(): string {
    return this.emitted;
  }

  private step(final: boolean): string {
    if (this.readOffset === this.ids.length) return '';
    const prefixText = this.decoder.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.opts);
    const newText = this.decoder.decode(this.ids.slice(this.prefixOffset), this.opts);
    if (newText.length <= prefixText.length || (!final && newText.endsWith('\uFFFD'))) return '';
    const delta = newText.slice(prefixText.length);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    this.emitted += delta;
    return delta;
  }
}
