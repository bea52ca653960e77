import { existsSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { fileURLToPath } from 'node:url';
import { MessageChannel, type MessagePort } from 'node:worker_threads';
import { Piscina } from 'piscina';
import { distEntry } from '../../../cluster/paths.js';
import { isErrorCode, ReefError } from '../../runtime/errors.js';
import type { ChatTokenizerStats } from './chat-tokenizer.js';
import { loadModelFiles } from './model-files.js';
import type { PreparedChat, PrepareParams, PrepareStats, RefusedChat } from './prepare.js';
import type { PrepareTask, WorkerFailure, WorkerTask } from './worker.js';

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

/** A worker's error as it crossed the thread boundary, with its Reef code when it had one. */
function workerError(code: string | null, message: string): Error {
  return code !== null && isErrorCode(code) ? new ReefError(code, {}, { message }) : new Error(message);
}

/** What a worker answers on its lane: the task's id and its result, or why it failed. */
export interface LaneReply {
  id: number;
  out?: unknown;
  failure?: { code: string | null; message: string };
}

/**
 * The prepare requests of one worker, on a message port of their own. piscina starts, watches and
 * replaces the worker and runs its other tasks, but its per-task machinery (task records, async
 * resources, queue and balancer, the worker's async handler) cost ~0.1 ms on the event loop and
 * more on the worker for each request, measured on this machine, against ~30 µs for the message
 * itself; prepare is the one task every chat completion waits for. The port is set up by a piscina
 * task (`connect`), and again after the worker it reached has gone (its port then closes).
 */
class PrepareLane {
  private port: MessagePort | null = null;
  private connecting: Promise<MessagePort> | null = null;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  private seq = 0;

  constructor(private readonly worker: Piscina) {}

  async connect(): Promise<MessagePort> {
    const { port1, port2 } = new MessageChannel();
    try {
      await this.worker.run({ op: 'connect', port: port2 } satisfies WorkerTask, { transferList: [port2 as never] });
    } catch (err) {
      port1.close();
      throw err;
    }
    port1.on('message', (reply: LaneReply) => this.settle(reply));
    port1.once('close', () => this.lost(port1));
    // An idle lane must not keep the process alive; one with requests waiting must (`send`).
    port1.unref();
    this.port = port1;
    return port1;
  }

  send(task: Omit<PrepareTask, 'id'>): Promise<unknown> {
    const port = this.port;
    if (port === null) {
      this.connecting ??= this.connect().finally(() => {
        this.connecting = null;
      });
      return this.connecting.then(() => this.send(task));
    }
    const id = ++this.seq;
    return new Promise((resolve, reject) => {
      if (this.pending.size === 0) port.ref();
      this.pending.set(id, { resolve, reject });
      port.postMessage({ id, ...task });
    });
  }

  close(): void {
    this.port?.close();
    this.port = null;
  }

  private settle(reply: LaneReply): void {
    const waiter = this.pending.get(reply.id);
    if (!waiter) return;
    this.pending.delete(reply.id);
    if (this.pending.size === 0) this.port?.unref();
    if (reply.failure) waiter.reject(workerError(reply.failure.code, reply.failure.message));
    else waiter.resolve(reply.out);
  }

  /** The worker went away (crashed, or the pool closed): what it had not answered fails. */
  private lost(port: MessagePort): void {
    if (this.port === port) this.port = null;
    // 503 and retryable: piscina starts a new worker, and the next request reaches it.
    for (const { reject } of this.pending.values()) reject(new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: 'tokenizer worker', state: 'gone (it exited before it answered)' }));
    this.pending.clear();
  }
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
  private readonly lanes: PrepareLane[];
  /** Tasks sent to each worker and not yet answered. */
  private readonly inflight: number[];
  private closed = false;

  private constructor(workers: Piscina[], contextLength: number | null) {
    this.workers = workers;
    this.lanes = workers.map((w) => new PrepareLane(w));
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
      // An idle worker waits in its event loop, not in Atomics.wait: its lane (PrepareLane) is a
      // message port, and a thread blocked in Atomics.wait never reads it.
      atomics: 'disabled',
      workerData: { modelDir, cacheMaxIds: opts.cacheMaxIds ?? 4_000_000 },
    }));
    const pool = new TokenizerPool(workers, files.contextLength);
    // Load every worker's tokenizer now rather than on the first request.
    try {
      await Promise.all(workers.map((w) => w.run({ op: 'stats' } satisfies WorkerTask)));
      await Promise.all(pool.lanes.map((l) => l.connect()));
    } catch (err) {
      await pool.close();
      throw err instanceof ReefError ? err : new ReefError('REEF_ERR_TOKENIZER', { modelDir, reason: (err as Error).message }, { cause: err });
    }
    return pool;
  }

  /**
   * Parses, validates, renders and tokenizes a raw chat-completion body on a worker (see
   * prepare.ts), on the worker's lane. Requests with the same `sessionKey` go to the same worker,
   * where that session's last body, id text and pieces are. A body in shared memory (the gateway
   * reads bodies that way) and the answer's arrays (always) cross without a copy.
   */
  async prepare(body: Uint8Array, params: PrepareParams): Promise<PreparedChat | RefusedChat> {
    return (await this.onWorker(params.sessionKey ?? null, (i) => this.lanes[i]!.send({ body, ...params }))) as PreparedChat | RefusedChat;
  }

  async decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): Promise<string> {
    const task: WorkerTask = { op: 'decode', ids: Int32Array.from(ids), skipSpecialTokens: opts.skipSpecialTokens ?? false };
    const out = await this.onWorker(null, (i) => this.workers[i]!.run(task));
    const failure = (out as Partial<WorkerFailure> | null)?.reefError;
    if (failure) throw workerError(failure.code, failure.message);
    return out as string;
  }

  /** Per worker: renders (and what they reused), piece-cache hits and misses, bodies extended or parsed whole. */
  async stats(): Promise<Array<ChatTokenizerStats & PrepareStats>> {
    this.assertOpen();
    return (await Promise.all(this.workers.map((w) => w.run({ op: 'stats' } satisfies WorkerTask)))) as Array<ChatTokenizerStats & PrepareStats>;
  }

  /** Idempotent; waits for tasks in flight. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const lane of this.lanes) lane.close();
    await Promise.all(this.workers.map((w) => w.close()));
  }

  /**
   * Runs `f` for a worker: the session's own (its earlier turns are there), or the least busy one
   * for work without a session.
   */
  private async onWorker<T>(sessionKey: string | null, f: (i: number) => Promise<T>): Promise<T> {
    this.assertOpen();
    const i = sessionKey ? hashKey(sessionKey) % this.workers.length : this.leastBusy();
    this.inflight[i]!++;
    try {
      return await f(i);
    } finally {
      this.inflight[i]!--;
    }
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

