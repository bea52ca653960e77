import { move, transferableSymbol, valueSymbol, workerData } from 'piscina';
import { ReefError } from '../../runtime/errors.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import { prepareChat, type PrepareParams } from './prepare.js';

/** One task of the tokenizer worker; the tokenizer and its piece cache live for the worker's life. */
export type WorkerTask =
  | { op: 'decode'; ids: number[] | Int32Array; skipSpecialTokens: boolean }
  | ({ op: 'prepare'; body: Uint8Array } & PrepareParams)
  | { op: 'stats' };

const { modelDir, cacheMaxIds } = workerData as { modelDir: string; cacheMaxIds: number };
const tokenizer = ChatTokenizer.load(modelDir, { cacheMaxIds });

const MOVE_BYTES = 64 * 1024;

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
    case 'prepare': {
      const { op: _op, body, ...params } = task;
      const out = prepareChat(tokenizer, body, params);
      if (!out.ok) return out;
      // The arrays were made for this answer alone, so they can move to the event loop uncopied.
      // Moving has a fixed cost (~25 µs per buffer) that only pays off past a copy of that cost.
      const buffers = [out.promptIds.buffer, out.engineBody.buffer];
      if (buffers.reduce((n, b) => n + b.byteLength, 0) < MOVE_BYTES) return out;
      return move({ [transferableSymbol]: buffers, [valueSymbol]: out } as never);
    }
    case 'decode':
      return tokenizer.decode(task.ids, { skipSpecialTokens: task.skipSpecialTokens });
    case 'stats':
      return { ...tokenizer.stats(), contextLength: tokenizer.contextLength };
  }
}
