import { randomInt } from 'node:crypto';

/** An OpenAI chat-completion tool call. `arguments` is a JSON string. */
export interface ToolCall {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/** A model's reply split into the OpenAI message fields. */
export interface ParsedOutput {
  reasoning_content: string | null;
  content: string | null;
  tool_calls: ToolCall[];
}

/** One OpenAI-style streaming delta: exactly one of the fields is set. */
export type StreamDelta =
  | { reasoning_content: string }
  | { content: string }
  | { tool_calls: [{ index: number; id: string; type: 'function'; function: { name: string; arguments: string } }] };

export interface ParseOptions {
  /** The prompt ended inside a thinking block (it opened `<think>`): output starts as reasoning. @default false */
  startsInThinking?: boolean;
  /**
   * Tool calls are extracted: the request offered tools and did not say `tool_choice: "none"`.
   * Otherwise tool-call markup the model writes stays in the content, as OpenAI-compatible servers
   * leave it, since a client that offered no tools has nothing to run it with. @default true
   */
  tools?: boolean;
  /** Tool-call id source. @default callId */
  newId?: () => string;
}

export interface StreamParser {
  /** Consume the next text delta; returns the deltas it completes (possibly none). */
  push(text: string): StreamDelta[];
  /** End of output: releases held-back text. */
  finish(): StreamDelta[];
}

export interface OutputParser {
  readonly name: string;
  parse(text: string, opts?: ParseOptions): ParsedOutput;
  stream(opts?: ParseOptions): StreamParser;
}

const ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

/** `call_` + 24 random alphanumerics, the shape OpenAI clients expect. */
export function callId(): string {
  let s = 'call_';
  for (let i = 0; i < 24; i++) s += ALPHABET[randomInt(ALPHABET.length)];
  return s;
}
