import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { freezeValue, type FrozenValue } from './jinja-compat.js';
import * as hfTokenizers from '@huggingface/tokenizers';
import { Tokenizer } from '@huggingface/tokenizers';
import { ReefError } from '../../runtime/errors.js';
import { AddedTokenSplitter } from './added-tokens.js';
import { bpeDropsUnknownAsCrate } from './bpe-as-crate.js';
import { ControlTokenMarker, controlTokens, literalAlternation } from './control-tokens.js';
import { loadModelFiles, type AddedTokenSpec, type ModelFiles } from './model-files.js';
import { isDeepFrozen, perFrozen } from './frozen.js';
import { templateViewOf, type TemplateMessage } from './normalize.js';
import { PieceCache, type PieceCacheStats } from './piece-cache.js';
import { compileTemplate, type CompiledTemplate } from './template-compiler.js';

export interface RenderOptions {
  /** Append the assistant header so the model answers. @default true */
  addGenerationPrompt?: boolean;
  /** Extra template variables (`enable_thinking`, ...); they override the special-token variables. */
  extra?: Record<string, unknown> | null;
  /** Encode control tokens found in user strings as plain text. @default true */
  guard?: boolean;
  /** Put the ids in a SharedArrayBuffer (they cross to another thread without a copy). @default false */
  shared?: boolean;
  /**
   * An earlier render (`RenderResult.encoded`), usually of the same conversation one turn shorter:
   * the ids of the text the two renders share are taken from it instead of encoded again. The
   * result is the same either way. @default null
   */
  prior?: EncodedPrompt | null;
}

export interface RenderResult {
  ids: Int32Array;
  /** The rendered prompt, what `ids` decode to. */
  text: string;
  /**
   * What a later render may reuse (`RenderOptions.prior`). Null when this render cannot serve:
   * control tokens in user strings (the text was split at their markers), or a tokenizer whose
   * added tokens have flags (`lstrip`, `rstrip`, `single_word`, `normalized`).
   */
  encoded: EncodedPrompt | null;
}

/**
 * A rendered prompt, its ids, and where in it the encoding started afresh: after each added token
 * (`cuts` holds pairs of character offset and the number of ids before it). Its ids must not be
 * changed while it may still be reused.
 */
export interface EncodedPrompt {
  readonly text: string;
  readonly ids: Int32Array;
  readonly cuts: Int32Array;
}

export interface ChatTokenizerStats {
  renders: number;
  /** Renders that took ids from a prior render (`RenderOptions.prior`), and how many ids in all. */
  reuse: { renders: number; ids: number };
  cache: PieceCacheStats;
  template: TemplateRenderStats;
}

/** How the chat template was rendered (template-compiler.ts). */
export interface TemplateRenderStats {
  /** Why every render goes to the interpreter (refused at compile time, switched off, or by option); null while the compiled renderer is in use. */
  interpreterOnly: string | null;
  /** Renders the compiled renderer produced. */
  compiled: number;
  /** Renders it handed to the interpreter (a construct or value it does not reproduce exactly, or a template error). */
  fallbacks: number;
  /** Compiled renders that the interpreter also rendered, for comparison. */
  checked: number;
  /** Comparisons that differed (the first switches the compiled renderer off). */
  mismatches: number;
}

export interface ChatTokenizerOptions {
  /** Bound of the piece cache in token ids. @default 4_000_000 */
  cacheMaxIds?: number;
  /** Render with the compiled template where it is exact; false: always the interpreter. @default true */
  compiledTemplate?: boolean;
}

/** Compiled renders checked against the interpreter: the first ones, then one in CHECK_EVERY. */
const CHECK_FIRST = 16;
const CHECK_EVERY = 256;

/**
 * Renders a model's chat template and tokenizes the result exactly as transformers 5
 * `apply_chat_template(..., tokenize=True)` does (with `sanitize_control_tokens=True` when guarded).
 *
 * Encoding is done piece by piece between added tokens, because added tokens split the text before
 * pre-tokenization: the concatenation equals encoding the whole text, and each piece's ids are
 * cached, so an unchanged transcript prefix costs a hash instead of a BPE pass on the next turn.
 */
export class ChatTokenizer {
  readonly files: ModelFiles;
  readonly contextLength: number | null;
  private readonly full: Tokenizer;
  /** Same model with no added tokens: encodes any text as plain text (a piece that does not start the input). */
  private readonly plain: Tokenizer;
  /**
   * The same for a piece at the start of the input: another tokenizer only where a Metaspace
   * pre-tokenizer prepends its "▁" there alone (`prepend_scheme: "first"`), which the package
   * does at the start of every string it is given, so at every piece.
   */
  private readonly plainAtStart: Tokenizer;
  /** Both of those without the normaliser, for pieces the splitter has normalised (null: no such pieces). */
  private readonly unnormalizing: [rest: Tokenizer, atStart: Tokenizer] | null = null;
  /** Splits out added tokens whose flags `addedRe` cannot follow (null when `exactSplit`). */
  private readonly splitter: AddedTokenSplitter | null;
  private readonly template: Template;
  /** Renders requests with tools where the model has a `tool_use` template, as transformers does; else null. */
  private readonly toolUse: ChatTokenizer | null;
  /** The template compiled to closures, or null: the interpreter renders. */
  private compiled: CompiledTemplate | null = null;
  private readonly templateStats: TemplateRenderStats = { interpreterOnly: null, compiled: 0, fallbacks: 0, checked: 0, mismatches: 0 };
  private readonly marker: ControlTokenMarker;
  private readonly addedIds = new Map<string, number>();
  private readonly addedById = new Map<number, AddedTokenSpec>();
  private readonly addedRe: RegExp;
  /** Length of the longest added token: how far past a position the added-token scan looks. */
  private readonly maxAddedLength: number;
  /** Renders that took ids from a prior render, and how many. */
  private readonly reuse = { renders: 0, ids: 0 };
  /**
   * No added token relies on normalisation, stripping or word boundaries: plain matching (`addedRe`)
   * splits them out, and a render can be reused. Otherwise `splitter` does, and renders are not reused.
   */
  private readonly exactSplit: boolean;
  private readonly newlineIds: Int32Array;
  private readonly cache: PieceCache;
  /** Pieces the splitter normalised (their ids differ from those of the same text as written); in `stats().cache` with `cache`. */
  private readonly normalizedCache: PieceCache;
  private readonly cleanUpSpaces: boolean;
  /** Converted (and marked) tool lists by their JSON text: agents resend the same tools every turn. */
  private readonly toolValues = new Map<string, FrozenValue>();
  /** The same, by identity for deeply frozen lists; not `perFrozen`: the converted value must stay unfrozen (the interpreter fills caches in it). */
  private readonly markedToolValues = new WeakMap<object, FrozenValue>();
  private readonly plainToolValues = new WeakMap<object, FrozenValue>();
  /** Template views of messages, kept for deeply frozen ones (`messageView`). */
  private readonly markedView = perFrozen((m: unknown) => this.marker.mark(templateViewOf(m as TemplateMessage)));
  private readonly plainView = perFrozen((m: unknown) => templateViewOf(m as TemplateMessage));
  private renders = 0;

  private constructor(files: ModelFiles, opts: ChatTokenizerOptions) {
    this.files = files;
    this.contextLength = files.contextLength;
    const text = readFileSync(join(files.modelDir, 'tokenizer.json'), 'utf8');
    try {
      this.full = new Tokenizer(files.tokenizerJson, files.tokenizerConfig);
      // A fresh parse: the library writes added tokens into the model's vocab tables it is given.
      this.plain = this.plainTokenizer(text, { atStart: false, normalize: true });
      this.plainAtStart = prependsAtFirstOnly(files.tokenizerJson.pre_tokenizer) ? this.plainTokenizer(text, { atStart: true, normalize: true }) : this.plain;
      // jinja2's lexer turns \r\n and \r in the source into \n (newline_sequence); the JS one keeps
      // them, so a template saved with Windows line endings rendered a CR into every prompt.
      this.template = new Template(files.chatTemplate.replace(/\r\n?/g, '\n'));
      splitAtUnicodeWhitespace(this.full.pre_tokenizer);
      lowercaseAsCrate(this.full.normalizer);
      bpeDropsUnknownAsCrate(this.full, files.tokenizerJson.model);
      decodeAsCrate(this.full.decoder, (this.files.tokenizerJson.decoder ?? null) as unknown);
    } catch (err) {
      throw new ReefError('REEF_ERR_TOKENIZER', { modelDir: files.modelDir, reason: (err as Error).message }, { cause: err });
    }
    for (const t of files.addedTokens) {
      this.addedIds.set(t.content, t.id);
      this.addedById.set(t.id, t);
    }
    const allAdded = files.addedTokens.map((t) => t.content);
    this.addedRe = new RegExp(literalAlternation(allAdded), 'gu');
    this.maxAddedLength = Math.max(1, ...allAdded.map((t) => t.length));
    this.exactSplit = files.addedTokens.every((t) => !t.normalized && !t.lstrip && !t.rstrip && !t.singleWord);
    const normalizer = this.full.normalizer as ((s: string) => string) | null;
    this.splitter = this.exactSplit ? null : new AddedTokenSplitter(files.addedTokens, normalizer === null ? null : (s) => normalizer(s));
    if (normalizer !== null && files.addedTokens.some((t) => t.normalized)) {
      const rest = this.plainTokenizer(text, { atStart: false, normalize: false });
      this.unnormalizing = [rest, this.plainAtStart === this.plain ? rest : this.plainTokenizer(text, { atStart: true, normalize: false })];
    }
    const explicit = Array.isArray(files.tokenizerConfig.chat_control_tokens) ? (files.tokenizerConfig.chat_control_tokens as string[]) : null;
    this.marker = new ControlTokenMarker(controlTokens(files.addedTokens, files.chatTemplate, explicit), allAdded);
    this.cache = new PieceCache(opts.cacheMaxIds);
    this.normalizedCache = new PieceCache(opts.cacheMaxIds);
    // transformers 5 skips the clean-up for a BPE model (it strips real spaces before punctuation)
    // unless the config insists; Llama 3's config asks for it.
    const model = files.tokenizerJson.model as { type?: unknown; merges?: unknown } | undefined;
    const bpe = model?.type === 'BPE' || (model?.type === undefined && model?.merges !== undefined);
    const config = files.tokenizerConfig;
    this.cleanUpSpaces = config.clean_up_tokenization_spaces === true && (!bpe || config.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output === true);
    this.newlineIds = this.encodeText('\n');
    // A render's control tokens depend on its template (control-tokens.ts), and so does what is
    // compiled: the tool_use template gets a tokenizer of its own.
    this.toolUse = files.toolUseTemplate === null ? null : new ChatTokenizer({ ...files, chatTemplate: files.toolUseTemplate, toolUseTemplate: null }, opts);
    if (opts.compiledTemplate === false) this.templateStats.interpreterOnly = 'compiledTemplate: false';
    else {
      try {
        const result = compileTemplate(this.template.parsed);
        this.compiled = result.template;
        if (result.reason !== null) this.templateStats.interpreterOnly = `not compiled: ${result.reason}`;
      } catch (err) {
        this.templateStats.interpreterOnly = `compiler failed: ${(err as Error).message}`;
      }
    }
  }

  /**
   * The model without added tokens. A fresh parse each: the package writes added tokens into the
   * vocab tables it is given. Not `atStart`: a Metaspace "first" prepends nothing (the crate
   * prepends only at offset 0 of the input, and a piece after an added token is not there).
   */
  private plainTokenizer(json: string, opts: { atStart: boolean; normalize: boolean }): Tokenizer {
    const spec: Record<string, unknown> = { ...(JSON.parse(json) as Record<string, unknown>), added_tokens: [] };
    spec.pre_tokenizer = metaspaceAsCrate(spec.pre_tokenizer, opts.atStart);
    if (!opts.normalize) spec.normalizer = null;
    const t = new Tokenizer(spec, { ...this.files.tokenizerConfig, additional_special_tokens: [] });
    splitAtUnicodeWhitespace(t.pre_tokenizer);
    lowercaseAsCrate(t.normalizer);
    bpeDropsUnknownAsCrate(t, spec.model);
    return t;
  }

  static load(modelDir: string, opts: ChatTokenizerOptions = {}): ChatTokenizer {
    return new ChatTokenizer(loadModelFiles(modelDir), opts);
  }

  /** Render the template for these (already normalised) messages and tokenize. */
  render(messages: readonly TemplateMessage[], tools: readonly unknown[] | null, opts: RenderOptions = {}): RenderResult {
    if (tools !== null && this.toolUse !== null) return this.toolUse.render(messages, tools, opts);
    const guard = opts.guard ?? true;
    const rendered = this.renderText(messages, tools, opts);
    // JSON's "\ud800" parses to half a character, which the package encoded as U+FFFD: the ids
    // would then not be the request the record keeps (Python's tokenizers refuses such a string).
    if (!(rendered as unknown as { isWellFormed(): boolean }).isWellFormed()) {
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'the chat has a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its other half), which is not text' });
    }
    this.renders++;
    const out = new IdBuilder(opts.shared === true);
    // Without markers a guarded render splits into one piece, encoded exactly as an unguarded one.
    if (guard && this.marker.hasMarkers(rendered)) return this.encodeMarked(rendered, out);
    if (!this.exactSplit) {
      this.encodeTextInto(rendered, out);
      return { ids: out.finish(), text: rendered, encoded: null };
    }
    const prior = opts.prior ?? null;
    const k = prior ? this.reusable(prior, rendered) : 0;
    // The prior's cuts up to the k-th one hold for this text too; the encoding resumes there.
    const cuts: number[] = prior && k > 0 ? Array.from(prior.cuts.subarray(0, 2 * k + 2)) : [0, 0];
    const [from, reused] = [cuts[2 * k]!, cuts[2 * k + 1]!];
    if (reused > 0) {
      out.push(prior!.ids.subarray(0, reused));
      this.reuse.renders++;
      this.reuse.ids += reused;
    }
    this.encodeTextInto(rendered, out, from, cuts);
    const ids = out.finish();
    return { ids, text: rendered, encoded: { text: rendered, ids, cuts: Int32Array.from(cuts) } };
  }

  /**
   * The index of the last cut of `prior` up to which `text` encodes to the same ids, or 0 (the
   * start). Cuts follow an added
   * token, where the scan for added tokens starts afresh. Every match the scan tried before a cut
   * looked at most `maxAddedLength` characters ahead (the alternation's longest token), so when the
   * two texts agree up to the cut plus that length, the scan found the same tokens and the same
   * pieces between them up to the cut, and the ids up to it are the prior's.
   */
  private reusable(prior: EncodedPrompt, text: string): number {
    const cuts = prior.cuts;
    const agree = (c: number): boolean => {
      const end = c + this.maxAddedLength;
      // Equal slices compare with memcmp (~1 µs for 40k characters); startsWith goes a character at a time.
      return end <= prior.text.length && end <= text.length && text.slice(0, end) === prior.text.slice(0, end);
    };
    // Cuts ascend and agreement only gets harder further on: the last one is tried first (a grown
    // transcript agrees nearly to the prior's end), then a binary search for the last that agrees.
    let hi = cuts.length / 2 - 1;
    while (hi > 0 && cuts[2 * hi]! + this.maxAddedLength > prior.text.length) hi--;
    if (hi <= 0) return 0;
    if (agree(cuts[2 * hi]!)) return hi;
    let lo = 0;
    hi--;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (agree(cuts[2 * mid]!)) lo = mid;
      else hi = mid - 1;
    }
    return lo;
  }

  /** The chat template's output for these messages, before tokenization (what `render` tokenizes). */
  renderText(messages: readonly TemplateMessage[], tools: readonly unknown[] | null, opts: RenderOptions = {}): string {
    if (tools !== null && this.toolUse !== null) return this.toolUse.renderText(messages, tools, opts);
    const guard = opts.guard ?? true;
    const view = messages.map((m) => this.messageView(m, guard));
    let extra: Record<string, unknown> = opts.extra ?? {};
    if (guard) extra = this.marker.mark(extra);
    const toolValue = tools === null ? null : this.toolValue(tools, guard);
    const vars: TemplateVars = { view, tools: toolValue, addGenerationPrompt: opts.addGenerationPrompt ?? true, extra };
    const compiled = this.compiled;
    if (compiled === null) return this.interpret(vars);
    let text: string;
    try {
      text = compiled.render(this.context(vars, toolValue === null ? null : toolValue.plain));
    } catch {
      // `Unsupported`, or an error the template raised: either way the interpreter decides.
      this.templateStats.fallbacks++;
      return this.interpret(vars);
    }
    const n = ++this.templateStats.compiled;
    return n <= CHECK_FIRST || n % CHECK_EVERY === 0 ? this.checked(text, vars) : text;
  }

  /**
   * A message as the template sees it (`templateView`, with control tokens in its strings marked
   * when guarded). Computed once for a deeply frozen message: a session's earlier messages are
   * the same frozen objects every turn (body-memo.ts), and marking scans all their text.
   */
  private messageView(m: TemplateMessage, guard: boolean): TemplateMessage {
    return guard ? this.markedView(m) : this.plainView(m);
  }

  private context(vars: TemplateVars, tools: unknown): Record<string, unknown> {
    return { messages: vars.view, tools, documents: null, add_generation_prompt: vars.addGenerationPrompt, ...this.files.specialTokens, ...vars.extra };
  }

  private interpret(vars: TemplateVars): string {
    try {
      return this.template.render(this.context(vars, vars.tools));
    } catch (err) {
      throw new ReefError('REEF_ERR_CHAT_TEMPLATE', { reason: (err as Error).message }, { cause: err });
    }
  }

  /**
   * The safety net under the compiled renderer, whose output becomes training data: a sample of
   * its renders is compared with the interpreter's, and one difference retires it for good.
   */
  private checked(text: string, vars: TemplateVars): string {
    this.templateStats.checked++;
    let expected: string;
    try {
      expected = this.interpret(vars);
    } catch (err) {
      this.retireCompiled('the interpreter raised an error where it rendered');
      throw err;
    }
    if (expected === text) return text;
    let at = 0;
    while (at < text.length && text.charCodeAt(at) === expected.charCodeAt(at)) at++;
    this.retireCompiled(`first difference at offset ${at}`);
    return expected;
  }

  private retireCompiled(why: string): void {
    this.templateStats.mismatches++;
    this.compiled = null;
    this.templateStats.interpreterOnly = `switched off: ${why}`;
    process.stderr.write(`reef: chat template of ${this.files.modelDir}: the compiled renderer differs from the interpreter (${why}); using the interpreter from now on\n`);
  }

  /** The tool list as the template sees it, converted once per distinct list (LRU of 64). */
  private toolValue(tools: readonly unknown[], guard: boolean): FrozenValue {
    // A deeply frozen list (the one a session's requests share) is its own key.
    const byRef = guard ? this.markedToolValues : this.plainToolValues;
    const frozen = isDeepFrozen(tools);
    const known = frozen ? byRef.get(tools) : undefined;
    if (known !== undefined) return known;
    const key = (guard ? 'g' : 'r') + JSON.stringify(tools);
    let value = this.toolValues.get(key);
    if (value) this.toolValues.delete(key);
    else value = freezeValue(guard ? this.marker.mark(tools) : tools);
    this.toolValues.set(key, value);
    if (this.toolValues.size > 64) this.toolValues.delete(this.toolValues.keys().next().value as string);
    if (frozen) byRef.set(tools, value);
    return value;
  }

  /** Encode template text: added tokens become their ids, the text between them goes through the cache. */
  encodeText(text: string): Int32Array {
    const out = new IdBuilder(false);
    this.encodeTextInto(text, out);
    return out.finish();
  }

  /**
   * Encodes `text` from `from` (0, or a cut of an earlier render, `reusable`) into `out`; with
   * `cuts`, notes the offset and id count after each added token.
   */
  private encodeTextInto(text: string, out: IdBuilder, from = 0, cuts: number[] | null = null): void {
    if (this.splitter !== null) {
      for (const piece of this.splitter.split(text)) {
        if (piece.id !== null) out.pushOne(piece.id);
        else if (piece.text === '') continue;
        else if (piece.normalized) out.push(this.encodeNormalized(piece.text, piece.atStart));
        else out.push(this.encodePlain(piece.text, piece.atStart));
      }
      return;
    }
    let last = from;
    this.addedRe.lastIndex = from;
    for (const m of text.matchAll(this.addedRe)) {
      if (m.index > last) out.push(this.encodePlain(text.slice(last, m.index), last === 0));
      out.pushOne(this.addedIds.get(m[0])!);
      last = m.index + m[0].length;
      cuts?.push(last, out.length);
    }
    if (last < text.length) out.push(this.encodePlain(text.slice(last), last === 0));
  }

  /**
   * Encode as plain text (added-token matching off), through the piece cache. `atStart`: the piece
   * starts the input, which only a Metaspace "first" tokenizer encodes differently (and that one
   * piece per render is not cached).
   */
  encodePlain(piece: string, atStart = false): Int32Array {
    if (atStart && this.plainAtStart !== this.plain) return Int32Array.from(this.plainAtStart.encode(piece, { add_special_tokens: false }).ids);
    return this.cache.getOrEncode(piece, (p) => Int32Array.from(this.plain.encode(p, { add_special_tokens: false }).ids));
  }

  /** Encode text the splitter has normalised already (only models with `normalized` added tokens get here). */
  private encodeNormalized(piece: string, atStart: boolean): Int32Array {
    const [rest, first] = this.unnormalizing!;
    if (atStart && first !== rest) return Int32Array.from(first.encode(piece, { add_special_tokens: false }).ids);
    return this.normalizedCache.getOrEncode(piece, (p) => Int32Array.from(rest.encode(p, { add_special_tokens: false }).ids));
  }

  /** A render split at the markers of control tokens found in user strings (never reused). */
  private encodeMarked(rendered: string, out: IdBuilder): RenderResult {
    let text = '';
    for (const piece of this.marker.split(rendered)) {
      text += piece.text;
      if (piece.first) {
        this.encodeTextInto(piece.text, out);
        continue;
      }
      const ids = this.encodeMidChat(piece.text, piece.asText);
      if (piece.asText && this.addedIds.has(piece.text) && ids.includes(this.addedIds.get(piece.text)!)) {
        throw new ReefError('REEF_ERR_TOKENIZER', { modelDir: this.files.modelDir, reason: `plain text ${JSON.stringify(piece.text)} encodes to the control token itself` });
      }
      out.push(ids);
    }
    return { ids: out.finish(), text, encoded: null };
  }

  /**
   * A piece from the middle of a chat is encoded after a newline that is then removed, as Python
   * does, so tokenizers that add a prefix space at the start of a string do not add one here.
   */
  private encodeMidChat(piece: string, asText: boolean): Int32Array {
    // Python encodes each piece as a string of its own: it starts the input.
    const encode = (s: string): Int32Array => (asText ? this.encodePlain(s, true) : this.encodeText(s));
    const withNewline = encode('\n' + piece);
    const nl = this.newlineIds;
    if (withNewline.length >= nl.length && nl.every((id, i) => withNewline[i] === id)) return withNewline.subarray(nl.length);
    return encode(piece);
  }

  /**
   * The text of `ids`, as the tokenizers crate decodes them: ids outside the vocabulary are left
   * out (the package wrote its unknown token for them, or threw), and `skipSpecialTokens` leaves
   * out the added tokens marked special, not also those the config's `additional_special_tokens`
   * names.
   */
  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    const skip = opts.skipSpecialTokens ?? false;
    const tokens: string[] = [];
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i]!;
      const added = this.addedById.get(id);
      if (added !== undefined) {
        if (!skip || !added.special) tokens.push(added.content);
        continue;
      }
      const token = this.full.id_to_token(id);
      if (token !== undefined) tokens.push(token);
    }
    if (tokens.length === 0) return '';
    const decoder = this.full.decoder;
    let text = decoder ? decoder(tokens) : tokens.join(' ');
    const suffix = decoder?.end_of_word_suffix;
    if (suffix) {
      text = text.replaceAll(suffix, ' ');
      if (skip) text = text.trim();
    }
    return this.cleanUpSpaces ? cleanUpTokenizationSpaces(text) : text;
  }

  tokenToId(token: string): number | null {
    return this.addedIds.get(token) ?? this.full.token_to_id(token) ?? null;
  }

  idToToken(id: number): string | null {
    return this.full.id_to_token(id) ?? null;
  }

  /** The ids of all added tokens (special and not), e.g. to check that none came from content. */
  addedTokenIds(): ReadonlyMap<string, number> {
    return this.addedIds;
  }

  /**
   * Whether a render ends inside a block the template opened with `open` and did not close with
   * `close` (a `<think>` block: the output then starts as reasoning). Decided by the ids where both
   * are added tokens: only the template's own markup becomes them, and the same characters in a
   * message encode as plain text, so a user who writes "<think>" opens nothing. A render that can
   * be reused knows where each of its added tokens is (its cuts), so only those few ids are looked
   * at; searching the text for both tags went over an OpenClaw prompt twice (~45 µs a turn).
   * Without such added tokens the text decides.
   */
  endsInsideBlock(render: RenderResult, open: string, close: string): boolean {
    const openId = this.addedIds.get(open);
    const closeId = this.addedIds.get(close);
    const { ids, text, encoded } = render;
    if (openId === undefined || closeId === undefined) return text.lastIndexOf(open) > text.lastIndexOf(close);
    const last = (id: number | undefined): boolean | null => (id === openId ? true : id === closeId ? false : null);
    if (encoded !== null) {
      // Cut j > 0 follows an added token: the last of the ids before it.
      const cuts = encoded.cuts;
      for (let j = cuts.length / 2 - 1; j > 0; j--) {
        const found = last(ids[cuts[2 * j + 1]! - 1]);
        if (found !== null) return found;
      }
      return false;
    }
    for (let i = ids.length - 1; i >= 0; i--) {
      const found = last(ids[i]);
      if (found !== null) return found;
    }
    return false;
  }

  /** Forget all cached pieces (benchmarks measure the cold path with it). */
  clearCache(): void {
    this.cache.clear();
    this.normalizedCache.clear();
  }

  /** With a tool_use template, both templates' renders together (`template.interpreterOnly` is the default's, else the tool_use one's). */
  stats(): ChatTokenizerStats {
    const sum = <T extends object>(a: T, b: T): T => {
      const out = { ...a } as Record<string, unknown>;
      for (const [k, v] of Object.entries(b)) if (typeof v === 'number') out[k] = (out[k] as number) + v;
      return out as T;
    };
    const cache = sum(this.cache.stats(), this.normalizedCache.stats());
    const own: ChatTokenizerStats = { renders: this.renders, reuse: { ...this.reuse }, cache, template: { ...this.templateStats } };
    if (this.toolUse === null) return own;
    const t = this.toolUse.stats();
    return {
      renders: own.renders + t.renders,
      reuse: sum(own.reuse, t.reuse),
      cache: sum(own.cache, t.cache),
      template: { ...sum(own.template, t.template), interpreterOnly: own.template.interpreterOnly ?? t.template.interpreterOnly },
    };
  }
}

/** @huggingface/tokenizers' ByteLevel split: its `\s` is JS's, where U+FEFF is whitespace and U+0085 is not. */
const JS_BYTE_LEVEL_SOURCE = String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`;
/** The same split at Unicode White_Space, the tokenizers crate's `\s`: the other way round for exactly those two. */
const BYTE_LEVEL_SOURCE = String.raw`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\p{White_Space}\p{L}\p{N}]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+`;

/**
 * The package's Digits split: JS's `\d` is 0-9 only, where the crate's `char::is_numeric` takes
 * every number (\p{N}: "٣", "²", "¼", "①"), so the two split such text apart differently.
 */
const JS_DIGITS_SOURCES = new Map([String.raw`[^\d]+|\d`, String.raw`[^\d]+|\d+`].map((s) => [s, s.replaceAll(String.raw`\d`, String.raw`\p{N}`)]));

/**
 * Gives the ByteLevel pre-tokenizers in `p` (alone or in a Sequence) the tokenizers crate's
 * whitespace, and its Digits ones the crate's numbers, once per tokenizer: the same regex with
 * \p{White_Space} for \s (\p{N} for \d) costs nothing more per text. Found by shape, since the
 * package's type declarations do not resolve under NodeNext; a pattern other than the one we know
 * (a release that fixed it) is left alone.
 */
function splitAtUnicodeWhitespace(p: unknown): void {
  // The package's pre-tokenizers are callable: functions, not plain objects.
  if ((typeof p !== 'object' && typeof p !== 'function') || p === null) return;
  const q = p as { tokenizers?: unknown; pattern?: unknown };
  if (Array.isArray(q.tokenizers)) for (const t of q.tokenizers) splitAtUnicodeWhitespace(t);
  else if (q.pattern instanceof RegExp && q.pattern.source === JS_BYTE_LEVEL_SOURCE) q.pattern = new RegExp(BYTE_LEVEL_SOURCE, 'gu');
  else if (q.pattern instanceof RegExp && JS_DIGITS_SOURCES.has(q.pattern.source)) q.pattern = new RegExp(JS_DIGITS_SOURCES.get(q.pattern.source)!, 'gu');
}

/** One render's template variables; `tools` is the interpreter's form (the compiled one is `tools.plain`). */
interface TemplateVars {
  view: unknown;
  tools: FrozenValue | null;
  addGenerationPrompt: boolean;
  extra: Record<string, unknown>;
}

/**
 * Collects a prompt's ids from cached pieces and single control tokens into one fresh array (cached
 * arrays are never handed out, so callers cannot mutate the cache). Single ids are buffered into
 * runs rather than wrapped in an array each.
 */
class IdBuilder {
  private readonly parts: Int32Array[] = [];
  private run: number[] = [];
  private n = 0;

  constructor(private readonly shared: boolean) {}

  push(ids: Int32Array): void {
    this.flushRun();
    this.parts.push(ids);
    this.n += ids.length;
  }

  pushOne(id: number): void {
    this.run.push(id);
    this.n++;
  }

  get length(): number {
    return this.n;
  }

  finish(): Int32Array {
    this.flushRun();
    const out = this.shared ? new Int32Array(new SharedArrayBuffer(this.n * 4)) : new Int32Array(this.n);
    let o = 0;
    for (const p of this.parts) {
      out.set(p, o);
      o += p.length;
    }
    return out;
  }

  private flushRun(): void {
    if (this.run.length === 0) return;
    this.parts.push(Int32Array.from(this.run));
    this.run = [];
  }
}

/** Whether a Metaspace pre-tokenizer in `p` (alone or in a Sequence) prepends its "▁" at the start of the input only. */
function prependsAtFirstOnly(p: unknown): boolean {
  if (p === null || typeof p !== 'object') return false;
  const q = p as { type?: unknown; pretokenizers?: unknown; prepend_scheme?: unknown };
  if (q.type === 'Sequence' && Array.isArray(q.pretokenizers)) return q.pretokenizers.some(prependsAtFirstOnly);
  return q.type === 'Metaspace' && q.prepend_scheme === 'first';
}

/**
 * `p` with its Metaspace pre-tokenizers made to do what the crate's do in the package: a "first"
 * one prepends nothing to a piece that does not start the input (`atStart` false), and `split`
 * (the crate's default) cuts before each "▁", which the package ignores: it ran BPE over the whole
 * piece, so merges across a "▁" gave other ids.
 */
function metaspaceAsCrate(p: unknown, atStart: boolean): unknown {
  if (p === null || typeof p !== 'object') return p;
  const q = p as { type?: unknown; pretokenizers?: unknown; prepend_scheme?: unknown; split?: unknown; replacement?: unknown };
  if (q.type === 'Sequence' && Array.isArray(q.pretokenizers)) return { ...q, pretokenizers: q.pretokenizers.map((t) => metaspaceAsCrate(t, atStart)) };
  if (q.type !== 'Metaspace') return p;
  const metaspace = { ...q, split: false, prepend_scheme: !atStart && q.prepend_scheme === 'first' ? 'never' : q.prepend_scheme };
  if (q.split === false) return metaspace;
  // Each piece runs from a "▁" to the next (the crate's MergedWithNext); the package's Split keeps the matches when inverted.
  const r = (typeof q.replacement === 'string' ? q.replacement : '\u2581').replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return { type: 'Sequence', pretokenizers: [metaspace, { type: 'Split', pattern: { Regex: `${r}[^${r}]*|[^${r}]+` }, behavior: 'MergedWithNext', invert: true }] };
}

/** transformers' `clean_up_tokenization`. */
function cleanUpTokenizationSpaces(text: string): string {
  return text
    .replaceAll(' .', '.').replaceAll(' ?', '?').replaceAll(' !', '!').replaceAll(' ,', ',').replaceAll(" ' ", "'")
    .replaceAll(" n't", "n't").replaceAll(" 'm", "'m").replaceAll(" 's", "'s").replaceAll(" 've", "'ve").replaceAll(" 're", "'re");
}

/**
 * Makes the package's Lowercase normalisers in `n` (alone or in a Sequence) lower each character on
 * its own, as the crate's do: JS's `toLowerCase` writes a word-final Σ as ς, the crate as σ.
 */
function lowercaseAsCrate(n: unknown): void {
  const { LowercaseNormalizer } = hfTokenizers as unknown as Record<'LowercaseNormalizer', abstract new (...args: never[]) => object>;
  if (n === null || n === undefined) return;
  const subs = (n as { normalizers?: unknown[] }).normalizers;
  if (Array.isArray(subs)) for (const sub of subs) lowercaseAsCrate(sub);
  else if (n instanceof LowercaseNormalizer) {
    // Only Σ lowers by context in JS (to ς at the end of a word); the crate lowers each character alone.
    (n as unknown as { normalize: (text: string) => string }).normalize = (text) =>
      text.includes('\u03a3') ? Array.from(text, (c) => c.toLowerCase()).join('') : text.toLowerCase();
  }
}

/**
 * Makes the package's decoders in `d` (alone or in a Sequence, configured by `spec`) decode as the
 * crate's: ByteFallback turns a run of byte tokens that is not UTF-8 into one U+FFFD per byte and
 * keeps a leading U+FEFF (the package's TextDecoder read the valid bytes of a broken run and
 * dropped a byte-order mark); Metaspace drops every "▁" of the first token unless its
 * prepend_scheme is "never" (the package dropped the first token's leading space only, and always).
 */
function decodeAsCrate(d: unknown, spec: unknown): void {
  // Exported at runtime; the package's type declarations do not resolve them under NodeNext.
  const { ByteFallbackDecoder, MetaspaceDecoder } = hfTokenizers as unknown as Record<'ByteFallbackDecoder' | 'MetaspaceDecoder', abstract new (...args: never[]) => object>;
  if (d === null || d === undefined) return;
  const s = (spec ?? {}) as { decoders?: unknown[]; prepend_scheme?: unknown; add_prefix_space?: unknown };
  const subs = (d as { decoders?: unknown[] }).decoders;
  if (Array.isArray(subs)) {
    subs.forEach((sub, i) => decodeAsCrate(sub, Array.isArray(s.decoders) ? s.decoders[i] : null));
    return;
  }
  if (d instanceof ByteFallbackDecoder) {
    const fatal = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
    (d as unknown as { decode_chain: (tokens: string[]) => string[] }).decode_chain = (tokens) => {
      const out: string[] = [];
      let bytes: number[] = [];
      const flush = (): void => {
        if (bytes.length === 0) return;
        try {
          out.push(fatal.decode(Uint8Array.from(bytes)));
        } catch {
          for (let i = 0; i < bytes.length; i++) out.push('\uFFFD');
        }
        bytes = [];
      };
      for (const t of tokens) {
        const byte = t.length === 6 && t.startsWith('<0x') && t.endsWith('>') && /^[0-9A-Fa-f]{2}$/.test(t.slice(3, 5)) ? parseInt(t.slice(3, 5), 16) : null;
        if (byte !== null) bytes.push(byte);
        else {
          flush();
          out.push(t);
        }
      }
      flush();
      return out;
    };
  } else if (d instanceof MetaspaceDecoder) {
    const replacement = (d as unknown as { replacement: string }).replacement;
    // A tokenizer.json older than prepend_scheme has add_prefix_space instead.
    const never = s.prepend_scheme === 'never' || (s.prepend_scheme === undefined && s.add_prefix_space === false);
    (d as unknown as { decode_chain: (tokens: string[]) => string[] }).decode_chain = (tokens) =>
      tokens.map((t, i) => t.replaceAll(replacement, i === 0 && !never ? '' : ' '));
  }
}
