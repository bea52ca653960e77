import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { Piscina } from 'piscina';
import { distEntry } from '../../../cluster/paths.js';
import { isErrorCode, ReefError } from '../../runtime/errors.js';
import type { ChatTokenizerStats } from './chat-tokenizer.js';
import { loadModelFiles } from './model-files.js';
import type { PreparedChat, PrepareParams, RefusedChat } from './prepare.js';
import type { WorkerFailure, WorkerTask } from './worker.js';

/**
 * One worker per core beyond the event loop's, at most 4. More workers than that share cores with
 * the event loop, and a worker that waits between tasks pays for it: measured here, a worker that
 * slept ~3 ms between OpenClaw-sized tasks took ~1.7× as long per task as one kept busy, so on two
 * cores one worker serves a session's turns faster than two taking turns.
 */
export function defaultTokenizerThreads(cores = availableParallelism()): number {
  return Math.max(1, Math.min(4, cores - 1));
}

export interface TokenizerPoolOptions {
  /** Worker threads, each with its own tokenizer and piece cache. @default defaultTokenizerThreads() */
  threads?: number;
  /** Piece-cache bound per worker, in token ids. @default 4_000_000 */
  cacheMaxIds?: number;
}

/**
 * The compiled worker sits next to this module in dist/; when this module runs from source (tests),
 * the dist/ copy is used, since worker threads cannot load TypeScript.
 */
function workerFile(): string {
  const sibling = fileURLToPath(new URL('./worker.js', import.meta.url));
  if (existsSync(sibling)) return sibling;
  const built = distEntry('actors/gateway/tokenize/worker');
  if (existsSync(built)) return built;
  throw new ReefError('REEF_ERR_TOKENIZER', { modelDir: '-', reason: `no compiled tokenizer worker at ${built} (run npm run build)` });
}

/** FNV-1a: a stable, cheap spread of session keys over the workers. */
function hashKey(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/**
 * Chat-template rendering and tokenization on worker threads. One single-thread piscina pool per
 * worker, because piscina cannot pin a task to a thread and session affinity is what makes the
 * piece cache hit: a session's next turn re-renders the whole transcript, and only its new pieces
 * cost BPE work on the worker that saw the earlier turns.
 */
export class TokenizerPool {
  readonly contextLength: number | null;
  private readonly workers: Piscina[];
  /** Tasks sent to each worker and not yet answered. */
  private readonly inflight: number[];
  private closed = false;

  private constructor(workers: Piscina[], contextLength: number | null) {
    this.workers = workers;
    this.inflight = workers.map(() => 0);
    this.contextLength = contextLength;
  }

  static async create(modelDir: string, opts: TokenizerPoolOptions = {}): Promise<TokenizerPool> {
    // Read the files here first, so a bad model directory fails with its own error, not a worker crash.
    const files = loadModelFiles(modelDir);
    const threads = Math.max(1, opts.threads ?? defaultTokenizerThreads());
    const filename = workerFile();
    const workers = Array.from({ length: threads }, () => new Piscina({
      filename,
      minThreads: 1,
      maxThreads: 1,
      idleTimeout: Number.POSITIVE_INFINITY,
      // Nothing reads piscina's run/wait histograms (see leastBusy), so no task pays to fill them.
      recordTiming: false,
      workerData: { modelDir, cacheMaxIds: opts.cacheMaxIds ?? 4_000_000 },
    }));
    const pool = new TokenizerPool(workers, files.contextLength);
    // Load every worker's tokenizer now rather than on the first request.
    try {
      await Promise.all(workers.map((w) => w.run({ op: 'stats' } satisfies WorkerTask)));
    } catch (err) {
      await pool.close();
      throw err instanceof ReefError ? err : new ReefError('REEF_ERR_TOKENIZER', { modelDir, reason: (err as Error).message }, { cause: err });
    }
    return pool;
  }

  /**
   * Parses, validates, renders and tokenizes a raw chat-completion body on a worker (see
   * prepare.ts). The body is copied to the worker; the answer's arrays are moved back. Requests
   * with the same `sessionKey` go to the same worker, so that worker's piece cache hits.
   */
  async prepare(body: Uint8Array, params: PrepareParams): Promise<PreparedChat | RefusedChat> {
    const task: WorkerTask = { op: 'prepare', body, ...params };
    return (await this.run(task, params.sessionKey ?? null)) as PreparedChat | RefusedChat;
  }

  async decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): Promise<string> {
    const task: WorkerTask = { op: 'decode', ids: Int32Array.from(ids), skipSpecialTokens: opts.skipSpecialTokens ?? false };
    return (await this.run(task, null)) as string;
  }

  /** Per-worker render counts and piece-cache hits/misses. */
  async stats(): Promise<ChatTokenizerStats[]> {
    this.assertOpen();
    return (await Promise.all(this.workers.map((w) => w.run({ op: 'stats' } satisfies WorkerTask)))) as ChatTokenizerStats[];
  }

  /** Idempotent; waits for tasks in flight. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all(this.workers.map((w) => w.close()));
  }

  private async run(task: WorkerTask, sessionKey: string | null): Promise<unknown> {
    this.assertOpen();
    const i = sessionKey !== null ? hashKey(sessionKey) % this.workers.length : this.leastBusy();
    this.inflight[i]!++;
    let out: unknown;
    try {
      out = await this.workers[i]!.run(task);
    } finally {
      this.inflight[i]!--;
    }
    const failure = (out as Partial<WorkerFailure> | null)?.reefError;
    if (failure) throw isErrorCode(failure.code) ? new ReefError(failure.code, {}, { message: failure.message }) : new Error(failure.message);
    return out;
  }

  /**
   * Our own count of tasks in flight, not piscina's `utilization`/`queueSize`: `utilization` builds a
   * full histogram summary (stddev and 20 percentiles) on every read, which cost ~1.5 ms per request.
   */
  private leastBusy(): number {
    let best = 0;
    for (let i = 1; i < this.workers.length; i++) if (this.inflight[i]! < this.inflight[best]!) best = i;
    return best;
  }

  private assertOpen(): void {
    if (this.closed) throw new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: 'tokenizer pool', state: 'closed' });
  }
}

