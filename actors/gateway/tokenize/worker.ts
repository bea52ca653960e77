import type { MessagePort } from 'node:worker_threads';
import { workerData } from 'piscina';
import { ReefError } from '../../runtime/errors.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import type { LaneReply } from './pool.js';
import { prepareChat, prepareStats, type PrepareParams } from './prepare.js';

/** A prepare request, as it travels on a worker's lane (pool.ts `PrepareLane`). */
export type PrepareTask = { id: number; body: Uint8Array } & PrepareParams;

/** One piscina task of the tokenizer worker; the tokenizer and its piece cache live for the worker's life. */
export type WorkerTask =
  | { op: 'decode'; ids: number[] | Int32Array; skipSpecialTokens: boolean }
  /** Serve prepare requests on this port from now on. */
  | { op: 'connect'; port: MessagePort }
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
    case 'connect': {
      const port = task.port;
      port.on('message', (m: PrepareTask) => {
        const after: (() => void)[] = [];
        port.postMessage(prepareReply(m, after));
        // What only later requests need, while the event loop already has its answer. A memo
        // that fails to update costs a later request its shortcut, never its answer.
        for (const task of after) {
          try {
            task();
          } catch (err) {
            process.stderr.write(`reef: tokenizer worker: a memo update failed: ${(err as Error).message}\n`);
          }
        }
      });
      return 'connected';
    }
    case 'decode':
      return tokenizer.decode(task.ids, { skipSpecialTokens: task.skipSpecialTokens });
    case 'stats':
      return { ...tokenizer.stats(), ...prepareStats(), contextLength: tokenizer.contextLength };
  }
}

/**
 * The answer to one prepare request; nothing thrown escapes to end the worker. The prompt ids and
 * the engine body are in shared memory (prepare.ts): they reach the event loop uncopied and stay
 * here too, as the session's id text for its next turn.
 */
function prepareReply(m: PrepareTask, after: (() => void)[]): LaneReply {
  const { id, body, ...params } = m;
  try {
    return { id, out: prepareChat(tokenizer, body, params, (task) => after.push(task)) };
  } catch (err) {
    return { id, failure: { code: err instanceof ReefError ? err.code : null, message: err instanceof Error ? err.message : String(err) } };
  }
}
