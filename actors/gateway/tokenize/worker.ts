import { workerData } from 'piscina';
import { ReefError } from '../../runtime/errors.js';
import { ChatTokenizer, type RenderOptions } from './chat-tokenizer.js';
import type { TemplateMessage } from './normalize.js';

/** One task of the tokenizer worker; the tokenizer and its piece cache live for the worker's life. */
export type WorkerTask =
  | { op: 'render'; messages: TemplateMessage[]; tools: unknown[] | null; opts: RenderOptions }
  | { op: 'decode'; ids: number[] | Int32Array; skipSpecialTokens: boolean }
  | { op: 'stats' };

const { modelDir, cacheMaxIds } = workerData as { modelDir: string; cacheMaxIds: number };
const tokenizer = ChatTokenizer.load(modelDir, { cacheMaxIds });

/** A ReefError loses its code crossing the thread boundary, so it travels as a value. */
export interface WorkerFailure { reefError: { code: string; message: string } }

export default function run(task: WorkerTask): unknown {
  try {
    return handle(task);
  } catch (err) {
    if (err instanceof ReefError) return { reefError: { code: err.code, message: err.message } } satisfies WorkerFailure;
    throw err;
  }
}

function handle(task: WorkerTask): unknown {
  switch (task.op) {
    case 'render': {
      const out = tokenizer.render(task.messages, task.tools, task.opts);
      return { ids: out.ids, text: out.text };
    }
    case 'decode':
      return tokenizer.decode(task.ids, { skipSpecialTokens: task.skipSpecialTokens });
    case 'stats':
      return { ...tokenizer.stats(), contextLength: tokenizer.contextLength };
  }
}
