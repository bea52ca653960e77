export { ChatTokenizer, type ChatTokenizerOptions, type ChatTokenizerStats, type RenderOptions, type RenderResult } from './chat-tokenizer.js';
export { defaultTokenizerThreads, TokenizerPool, type TokenizerPoolOptions } from './pool.js';
export { StreamDecoder, type IdDecoder } from './stream-decoder.js';
export { normalizeMessages, checkContextLength, templateView, type TemplateMessage } from './normalize.js';
export { loadModelFiles, type ModelFiles, type AddedTokenSpec } from './model-files.js';
export { PieceCache, type PieceCacheStats } from './piece-cache.js';
export { prepareChat, type PreparedChat, type PrepareParams, type RefusedChat } from './prepare.js';
