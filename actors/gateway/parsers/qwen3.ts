import { endsInsideJsonString, parseToolCallBody, partialTagSuffix } from './tool-json.js';
import { callId, type OutputParser, type ParsedOutput, type ParseOptions, type StreamDelta, type StreamParser, type ToolCall } from './types.js';

const THINK_OPEN = '<think>';
const THINK_CLOSE = '</think>';
const CALL_OPEN = '<tool_call>';
const CALL_CLOSE = '</tool_call>';

/**
 * Qwen3 / Hermes output format: an optional leading `<think>…</think>` block (reasoning), then text
 * (content) with `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks anywhere in it.
 * Reasoning and content are trimmed of whitespace at both ends (the model writes newlines around
 * its tags); the whitespace inside is kept. A block that is not a valid call, or is cut off, stays
 * in the content verbatim.
 */
export const qwen3Parser: OutputParser = {
  name: 'qwen3',
  parse(text: string, opts: ParseOptions = {}): ParsedOutput {
    const newId = opts.newId ?? callId;
    let reasoning: string | null = null;
    let rest = text;
    const inThinking = opts.startsInThinking === true || text.startsWith(THINK_OPEN);
    if (inThinking) {
      const body = opts.startsInThinking ? text : text.slice(THINK_OPEN.length);
      const end = body.indexOf(THINK_CLOSE);
      reasoning = end === -1 ? body : body.slice(0, end);
      rest = end === -1 ? '' : body.slice(end + THINK_CLOSE.length);
    }
    let content = '';
    const toolCalls: ToolCall[] = [];
    while (opts.tools !== false) {
      const open = rest.indexOf(CALL_OPEN);
      if (open === -1) break;
      const close = callClose(rest, open);
      if (close === -1) break;
      content += rest.slice(0, open);
      const call = parseToolCallBody(rest.slice(open + CALL_OPEN.length, close).trim());
      if (call) toolCalls.push({ id: newId(), type: 'function', function: call });
      else content += rest.slice(open, close + CALL_CLOSE.length);
      rest = rest.slice(close + CALL_CLOSE.length);
    }
    content += rest;
    return { reasoning_content: orNull(reasoning?.trim() ?? ''), content: orNull(content.trim()), tool_calls: toolCalls };
  },
  stream(opts: ParseOptions = {}): StreamParser {
    return new Qwen3StreamParser(opts);
  },
};

/**
 * Where the `<tool_call>` block opened at `open` closes, or -1: the first `</tool_call>` that is not
 * inside a JSON string of the call, so that arguments quoting the tag (a file being written, a
 * shell command) do not cut the call short and leave it, broken, in the content.
 */
function callClose(text: string, open: number): number {
  const from = open + CALL_OPEN.length;
  let close = text.indexOf(CALL_CLOSE, from);
  while (close !== -1 && endsInsideJsonString(text.slice(from, close))) close = text.indexOf(CALL_CLOSE, close + 1);
  return close;
}

function orNull(s: string): string | null {
  return s.length > 0 ? s : null;
}

/**
 * Emits whitespace-trimmed text incrementally: leading whitespace is dropped, a whitespace run is
 * held back until something non-blank follows it, and whatever is held at the end is dropped.
 */
class Trimmer {
  private started = false;
  private held = '';
  constructor(private readonly emit: (text: string) => void) {}

  push(text: string): void {
    if (!this.started) {
      text = text.replace(/^\s+/u, '');
      if (!text) return;
      this.started = true;
    }
    // Only the new text is scanned, from its end: `held` is whitespace already. A regex for the
    // trailing run (/\s+$/u) retries from every start inside it, so 40k spaces a degenerate model
    // emits unaided blocked the event loop for seconds (quadratic), rescanned at every push.
    const cut = trailingSpaceStart(text);
    if (cut === 0) {
      this.held += text;
      return;
    }
    this.emit(this.held + text.slice(0, cut));
    this.held = text.slice(cut);
  }
}

/** Where the run of whitespace (`\s`, as the regex means it) that ends `text` starts; `text.length` if none. */
export function trailingSpaceStart(text: string): number {
  let i = text.length;
  // Every \s character is in the BMP, so code units suffice: a surrogate is never whitespace.
  while (i > 0 && WHITESPACE.has(text.charCodeAt(i - 1))) i--;
  return i;
}

const WHITESPACE = new Set(Array.from({ length: 0x10000 }, (_, c) => c).filter((c) => /\s/u.test(String.fromCharCode(c))));

type State = 'start' | 'reasoning' | 'content' | 'call';

class Qwen3StreamParser implements StreamParser {
  private state: State;
  private pending = '';
  private out: StreamDelta[] = [];
  private toolIndex = 0;
  private readonly newId: () => string;
  private readonly tools: boolean;
  private readonly reasoning = new Trimmer((t) => this.out.push({ reasoning_content: t }));
  private readonly content = new Trimmer((t) => this.out.push({ content: t }));

  constructor(opts: ParseOptions) {
    this.state = opts.startsInThinking ? 'reasoning' : 'start';
    this.newId = opts.newId ?? callId;
    this.tools = opts.tools !== false;
  }

  push(text: string): StreamDelta[] {
    this.pending += text;
    this.drain(false);
    return this.take();
  }

  finish(): StreamDelta[] {
    this.drain(true);
    // Whatever is left cannot become a tag any more: it is text of the current section.
    if (this.state === 'reasoning') this.reasoning.push(this.pending);
    else this.content.push(this.pending);
    this.pending = '';
    return this.take();
  }

  private take(): StreamDelta[] {
    const out = this.out;
    this.out = [];
    return out;
  }

  private drain(final: boolean): void {
    for (;;) {
      const p = this.pending;
      if (this.state === 'start') {
        if (p.startsWith(THINK_OPEN)) {
          this.pending = p.slice(THINK_OPEN.length);
          this.state = 'reasoning';
        } else if (!final && THINK_OPEN.startsWith(p)) {
          return; // could still be the opening tag
        } else {
          this.state = 'content';
        }
      } else if (this.state === 'reasoning') {
        const end = p.indexOf(THINK_CLOSE);
        if (end === -1) {
          const keep = final ? 0 : partialTagSuffix(p, THINK_CLOSE);
          this.reasoning.push(p.slice(0, p.length - keep));
          this.pending = p.slice(p.length - keep);
          return;
        }
        this.reasoning.push(p.slice(0, end));
        this.pending = p.slice(end + THINK_CLOSE.length);
        this.state = 'content';
      } else if (this.state === 'content') {
        const open = this.tools ? p.indexOf(CALL_OPEN) : -1;
        if (open === -1) {
          const keep = final || !this.tools ? 0 : partialTagSuffix(p, CALL_OPEN);
          this.content.push(p.slice(0, p.length - keep));
          this.pending = p.slice(p.length - keep);
          return;
        }
        this.content.push(p.slice(0, open));
        this.pending = p.slice(open);
        this.state = 'call';
      } else {
        const close = callClose(p, 0);
        if (close === -1) {
          if (final) this.state = 'content'; // cut off: finish() releases it as content
          return;
        }
        const block = p.slice(0, close + CALL_CLOSE.length);
        const call = parseToolCallBody(p.slice(CALL_OPEN.length, close).trim());
        if (call) {
          this.out.push({ tool_calls: [{ index: this.toolIndex++, id: this.newId(), type: 'function', function: call }] });
        } else {
          this.content.push(block);
        }
        this.pending = p.slice(block.length);
        this.state = 'content';
      }
    }
  }
}
