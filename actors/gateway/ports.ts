import type { ChatMessage, Tool } from './openai-schema.js';

/**
 * What the chat pipeline needs from its collaborators. The production wiring (index.ts) plugs in
 * the piscina tokenizer pool, the model family's output parser and the SQLite record store.
 */

export interface PromptTokenizer {
  /** Renders the chat template (add_generation_prompt) and tokenizes, off the event loop. */
  render(messages: readonly ChatMessage[], tools: readonly Tool[] | null, sessionKey: string | null): Promise<Int32Array>;
  readonly contextLength: number;
}

export interface ParsedOutput {
  content: string | null;
  reasoning_content: string | null;
  tool_calls: Array<{ id: string; type: 'function'; function: { name: string; arguments: string } }> | null;
}

export interface StreamDelta {
  content?: string;
  reasoning_content?: string;
  tool_calls?: Array<{ index: number; id?: string; type?: 'function'; function: { name?: string; arguments?: string } }>;
}

export interface OutputParser {
  parse(text: string, opts: { parseTools: boolean }): ParsedOutput;
  stream(opts: { parseTools: boolean }): { push(text: string): StreamDelta[]; finish(): StreamDelta[] };
}

export type { NewRecord } from './store/types.js';
import type { NewRecord } from './store/types.js';

export interface RecordSink {
  newId(): string;
  /** Resolves only once the record is durably committed: that is what a receipt promises. */
  append(record: NewRecord): Promise<{ id: string; offset: number }>;
}
