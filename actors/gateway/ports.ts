import type { PreparedChat, PrepareParams, RefusedChat } from './tokenize/prepare.js';

/**
 * What the chat pipeline needs from its collaborators. The production wiring (index.ts) plugs in
 * the piscina tokenizer pool, the model family's output parser and the SQLite record store.
 */

export interface PromptTokenizer {
  /**
   * Parses and validates a raw chat-completion body, renders the chat template
   * (add_generation_prompt) and tokenizes, off the event loop (tokenize/prepare.ts). Requests of
   * one session go to the same worker, whose piece cache holds the session's earlier turns.
   */
  prepare(body: Uint8Array, params: PrepareParams & { sessionKey: string | null }): Promise<PreparedChat | RefusedChat>;
  readonly contextLength: number;
}

export type { OutputParser, ParsedOutput, StreamDelta } from './parsers/index.js';

export type { NewRecord } from './store/types.js';
import type { NewRecord, StagedPayloads } from './store/types.js';

export interface RecordSink {
  newId(): string;
  /** Resolves only once the record is durably committed: that is what a receipt promises. */
  append(record: NewRecord): Promise<{ id: string; offset: number }>;
  /** Writes a coming record's large payloads ahead of it (`SqliteStore.stage`); optional. */
  stage?(payloads: { request: NewRecord['request']; promptIds: Int32Array }): StagedPayloads | null;
}
