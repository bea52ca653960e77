import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { freezeValue, type FrozenValue } from './jinja-compat.js';
import { Tokenizer } from '@huggingface/tokenizers';
import { ReefError } from '../../runtime/errors.js';
import { ControlTokenMarker, controlTokens, literalAlternation } from './control-tokens.js';
import { loadModelFiles, type ModelFiles } from './model-files.js';
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
}

export interface RenderResult {
  ids: Int32Array;
  /** The rendered prompt, what `ids` decode to. */
  text: string;
}

export interface ChatTokenizerStats {
  renders: number;
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
  /** Same model with no added tokens: encodes any text as plain text. */
  private readonly plain: Tokenizer;
  private readonly template: Template;
  /** The template compiled to closures, or null: the interpreter renders. */
  private compiled: CompiledTemplate | null = null;
  private readonly templateStats: TemplateRenderStats = { interpreterOnly: null, compiled: 0, fallbacks: 0, checked: 0, mismatches: 0 };
  private readonly marker: ControlTokenMarker;
  private readonly addedIds = new Map<string, number>();
  private readonly addedRe: RegExp;
  /** Added tokens that rely on normalisation or stripping cannot be split out by plain matching. */
  private readonly exactSplit: boolean;
  private readonly newlineIds: Int32Array;
  private readonly cache: PieceCache;
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
      this.plain = new Tokenizer({ ...(JSON.parse(text) as object), added_tokens: [] }, { ...files.tokenizerConfig, additional_special_tokens: [] });
      this.template = new Template(files.chatTemplate);
    } catch (err) {
      throw new ReefError('REEF_ERR_TOKENIZER', { modelDir: files.modelDir, reason: (err as Error).message }, { cause: err });
    }
    for (const t of files.addedTokens) this.addedIds.set(t.content, t.id);
    const allAdded = files.addedTokens.map((t) => t.content);
    this.addedRe = new RegExp(literalAlternation(allAdded), 'gu');
    this.exactSplit = files.addedTokens.every((t) => !t.normalized && !t.lstrip && !t.rstrip && !t.singleWord);
    const explicit = Array.isArray(files.tokenizerConfig.chat_control_tokens) ? (files.tokenizerConfig.chat_control_tokens as string[]) : null;
    this.marker = new ControlTokenMarker(controlTokens(files.addedTokens, files.chatTemplate, explicit), allAdded);
    this.cache = new PieceCache(opts.cacheMaxIds);
    this.cleanUpSpaces = files.tokenizerConfig.clean_up_tokenization_spaces === true;
    this.newlineIds = this.encodeText('\n');
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

  static load(modelDir: string, opts: ChatTokenizerOptions = {}): ChatTokenizer {
    return new ChatTokenizer(loadModelFiles(modelDir), opts);
  }

  /** Render the template for these (already normalised) messages and tokenize. */
  render(messages: readonly TemplateMessage[], tools: readonly unknown[] | null, opts: RenderOptions = {}): RenderResult {
    const guard = opts.guard ?? true;
    const rendered = this.renderText(messages, tools, opts);
    this.renders++;
    const out = new IdBuilder(opts.shared === true);
    if (!guard) {
      this.encodeTextInto(rendered, out);
      return { ids: out.finish(), text: rendered };
    }
    return this.encodeMarked(rendered, out);
  }

  /** The chat template's output for these messages, before tokenization (what `render` tokenizes). */
  renderText(messages: readonly TemplateMessage[], tools: readonly unknown[] | null, opts: RenderOptions = {}): string {
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

  private encodeTextInto(text: string, out: IdBuilder): void {
    if (!this.exactSplit) {
      out.push(Int32Array.from(this.full.encode(text, { add_special_tokens: false }).ids));
      return;
    }
    let last = 0;
    this.addedRe.lastIndex = 0;
    for (const m of text.matchAll(this.addedRe)) {
      if (m.index > last) out.push(this.encodePlain(text.slice(last, m.index)));
      out.pushOne(this.addedIds.get(m[0])!);
      last = m.index + m[0].length;
    }
    if (last < text.length) out.push(this.encodePlain(text.slice(last)));
  }

  /** Encode as plain text (added-token matching off), through the piece cache. */
  encodePlain(piece: string): Int32Array {
    return this.cache.getOrEncode(piece, (p) => Int32Array.from(this.plain.encode(p, { add_special_tokens: false }).ids));
  }

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
    return { ids: out.finish(), text };
  }

  /**
   * A piece from the middle of a chat is encoded after a newline that is then removed, as Python
   * does, so tokenizers that add a prefix space at the start of a string do not add one here.
   */
  private encodeMidChat(piece: string, asText: boolean): Int32Array {
    const encode = (s: string): Int32Array => (asText ? this.encodePlain(s) : this.encodeText(s));
    const withNewline = encode('\n' + piece);
    const nl = this.newlineIds;
    if (withNewline.length >= nl.length && nl.every((id, i) => withNewline[i] === id)) return withNewline.subarray(nl.length);
    return encode(piece);
  }

  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    if (ids.length === 0) return '';
    return this.full.decode(Array.from(ids), { skip_special_tokens: opts.skipSpecialTokens ?? false, clean_up_tokenization_spaces: this.cleanUpSpaces });
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

  /** Forget all cached pieces (benchmarks measure the cold path with it). */
  clearCache(): void {
    this.cache.clear();
  }

  stats(): ChatTokenizerStats {
    return { renders: this.renders, cache: this.cache.stats(), template: { ...this.templateStats } };
  }
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
