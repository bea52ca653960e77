import type { ChatMessage, Tool } from './openai-schema.js';

/**
 * What the chat pipeline needs from its collaborators. The production wiring (index.ts) plugs in
 * the piscina tokenizer pool, the model family's output parser and the SQLite record store.
 */

export interface PromptTokenizer {
  /**
   * Renders the chat template (add_generation_prompt) and tokenizes, off the event loop.
   * `startsInThinking`: the prompt ends inside an open thinking block, so output starts as reasoning.
   */
  render(messages: readonly ChatMessage[], tools: readonly Tool[] | null, sessionKey: string | null): Promise<{ ids: Int32Array; startsInThinking: boolean }>;
  readonly contextLength: number;
}

export type { OutputParser, ParsedOutput, StreamDelta } from './parsers/index.js';

export type { NewRecord } from './store/types.js';
import type { NewRecord } from './store/types.js';

export interface RecordSink {
  newId(): string;
  /** Resolves only once the record is durably committed: that is what a receipt promises. */
  append(record: NewRecord): Promise<{ id: string; offset: number }>;
}
