import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';

/**
 * WAL checkpoints off the event loop. SQLite's automatic checkpoint runs inside the COMMIT that
 * crosses the threshold, on the committing thread: with ~40 KB records that was a 15–70 ms stall
 * every few dozen commits, during which the gateway could not stream a token. A worker thread with
 * its own connection runs PASSIVE checkpoints on a timer instead; PASSIVE never waits for readers or
 * writers, and writers never wait for it. The writer keeps a high automatic threshold as a safety
 * net in case this thread falls behind or dies.
 *
 * The worker is an eval'd CommonJS script so that it runs the same under vitest (TypeScript
 * sources) as from dist/.
 */

const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const Database = require(workerData.driver);
const db = new Database(workerData.path);
db.pragma('busy_timeout = 1000');
db.pragma('synchronous = ' + workerData.synchronous);
let stopped = false;
// data_version when the WAL was last found fully copied. It changes only when another connection
// commits, so while it stands still there is nothing to copy: PASSIVE would report the frames it
// copied before all over again, and every idle tick counted as one more checkpoint.
let copiedAt = null;
function checkpoint() {
  try {
    const version = db.pragma('data_version', { simple: true });
    if (version === copiedAt) return;
    // Under a steady stream of commits one pass never reaches the end of the log, and SQLite only
    // rewinds the WAL when a writer finds it fully copied; each further pass copies only what was
    // committed meanwhile, so a few passes catch up and the WAL stays small.
    let frames = 0;
    for (let pass = 0; pass < 8; pass++) {
      const [r] = db.pragma('wal_checkpoint(PASSIVE)');
      if (!r || r.log <= 0) {
        // busy: another connection's checkpoint held the lock and may have stopped part-way.
        if (!r || !r.busy) copiedAt = version;
        break;
      }
      frames = r.checkpointed;
      if (r.checkpointed >= r.log) {
        copiedAt = version;
        break;
      }
    }
    if (frames > 0) parentPort.postMessage({ type: 'checkpoint', frames });
  } catch (err) {
    parentPort.postMessage({ type: 'error', message: String(err && err.message || err) });
  }
}
const timer = setInterval(checkpoint, workerData.intervalMs);
parentPort.on('message', (msg) => {
  if (msg !== 'stop' || stopped) return;
  stopped = true;
  clearInterval(timer);
  db.close();
  parentPort.close();
});
`;

export interface CheckpointerStats {
  checkpoints: number;
  framesCheckpointed: number;
  errors: number;
  lastError: string | null;
}

export class Checkpointer {
  private readonly worker: Worker;
  private readonly exited: Promise<void>;
  readonly stats: CheckpointerStats = { checkpoints: 0, framesCheckpointed: 0, errors: 0, lastError: null };

  constructor(path: string, intervalMs: number, synchronous: 'NORMAL' | 'FULL') {
    const driver = createRequire(import.meta.url).resolve('better-sqlite3');
    // execArgv []: the worker's source is CommonJS, and a process started with
    // --input-type=module (the eventloop bench's gateway) passed that on and failed every checkpoint.
    this.worker = new Worker(WORKER_SOURCE, { eval: true, execArgv: [], workerData: { path, intervalMs, synchronous, driver } });
    // A store someone forgot to close must not keep the process alive.
    this.worker.unref();
    this.worker.on('message', (msg: { type: string; frames?: number; message?: string }) => {
      if (msg.type === 'checkpoint') {
        this.stats.checkpoints += 1;
        this.stats.framesCheckpointed += msg.frames ?? 0;
      } else if (msg.type === 'error') {
        this.stats.errors += 1;
        this.stats.lastError = msg.message ?? null;
      }
    });
    this.worker.on('error', (err) => {
      this.stats.errors += 1;
      this.stats.lastError = err.message;
    });
    this.exited = new Promise((resolve) => this.worker.once('exit', () => resolve()));
  }

  /** Stops the timer and closes the worker's connection. */
  async stop(): Promise<void> {
    this.worker.ref(); // an unref'd worker's exit would not keep the caller's await alive
    this.worker.postMessage('stop');
    await this.exited;
  }
}
