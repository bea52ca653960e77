import { closeSync, existsSync, fstatSync, openSync, renameSync, unlinkSync, writeSync } from 'node:fs';

/**
 * A size-rotated log file: `<path>`, then `<path>.1` … `<path>.<backups>`, oldest last. The
 * detached stack's `run/reef.log` carries every actor's output for the stack's whole life and grew
 * without bound (security review M2).
 */

export interface RotatingLogOptions {
  /** @default 64 MiB */
  maxBytes: number;
  /** Earlier files kept. @default 3 */
  backups: number;
}

/**
 * 64 MiB × (1 + 3), as for the engine logs (python_shim/reef_shim/log_rotate.py): days of a busy
 * stack's output, and a bound well under the checkpoints beside it in the data dir.
 */
export const LOG_ROTATION: RotatingLogOptions = { maxBytes: 64 << 20, backups: 3 };

export class RotatingLog {
  private fd: number;
  private size: number;

  constructor(readonly path: string, private readonly options: RotatingLogOptions = LOG_ROTATION) {
    if (!(options.maxBytes >= 1) || !(options.backups >= 0)) throw new Error(`maxBytes must be positive and backups at least 0, got ${options.maxBytes} and ${options.backups}`);
    this.fd = openSync(path, 'a', 0o600);
    this.size = fstatSync(this.fd).size;
  }

  /** Appends synchronously: the process may exit right after, and its last words matter most. */
  write(chunk: string | Uint8Array): void {
    let data = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    // Split at the limit, so that no file passes it; a line cut in two goes on at the top of the next.
    while (data.length > 0) {
      let room = this.options.maxBytes - this.size;
      if (room <= 0) {
        this.rotate();
        room = this.options.maxBytes;
      }
      const part = data.subarray(0, room);
      writeSync(this.fd, part);
      this.size += part.length;
      data = data.subarray(part.length);
    }
  }

  private rotate(): void {
    closeSync(this.fd);
    if (this.options.backups === 0) unlinkSync(this.path);
    else {
      for (let n = this.options.backups - 1; n >= 1; n--) if (existsSync(`${this.path}.${n}`)) renameSync(`${this.path}.${n}`, `${this.path}.${n + 1}`);
      renameSync(this.path, `${this.path}.1`);
    }
    this.fd = openSync(this.path, 'a', 0o600);
    this.size = 0;
  }

  close(): void {
    closeSync(this.fd);
  }
}

/**
 * Sends this process's stdout and stderr writes to a rotating log at `path`. The process's file
 * descriptors 1 and 2 keep pointing where they did: only what Node itself prints without the
 * streams (a fatal error's report) lands there.
 */
export function redirectOutput(path: string, options: RotatingLogOptions = LOG_ROTATION): RotatingLog {
  const log = new RotatingLog(path, options);
  for (const stream of [process.stdout, process.stderr]) {
    stream.write = ((chunk: string | Uint8Array, encodingOrCb?: BufferEncoding | ((err?: Error | null) => void), cb?: (err?: Error | null) => void): boolean => {
      const done = typeof encodingOrCb === 'function' ? encodingOrCb : cb;
      const encoding = typeof encodingOrCb === 'string' ? encodingOrCb : 'utf8';
      try {
        log.write(typeof chunk === 'string' ? Buffer.from(chunk, encoding) : chunk);
      } catch {
        // A full disk must not take the stack down with it (an error on stderr's stream is
        // unhandled); the line is lost.
      }
      if (done) process.nextTick(done);
      return true;
    }) as typeof stream.write;
  }
  return log;
}
