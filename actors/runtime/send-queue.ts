import { ReefError } from './errors.js';

/** What the queue needs of a socket: zeromq's `send`, which allows one pending call at a time. */
export interface Sender {
  send(frames: Buffer | Buffer[] | (Buffer | string)[]): Promise<void>;
}

export interface SendQueueOptions {
  /** Name used in errors and logs. */
  name: string;
  /**
   * How many sends may wait (the one in flight included) before `send` rejects with
   * REEF_ERR_QUEUE_FULL instead of growing without bound.
   * @default 10000
   */
  maxQueued?: number;
}

/**
 * Serialises sends on one socket: zeromq rejects a second `send` while one is pending, and
 * awaiting each send is how the socket's high-water mark becomes backpressure for the caller.
 */
export class SendQueue {
  readonly name: string;
  readonly maxQueued: number;
  private tail: Promise<void> = Promise.resolve();
  private queued = 0;
  private closed = false;

  constructor(
    private readonly socket: Sender,
    options: SendQueueOptions,
  ) {
    this.name = options.name;
    this.maxQueued = options.maxQueued ?? 10_000;
  }

  /** Sends waiting or in flight. */
  get length(): number {
    return this.queued;
  }

  /** Resolves once the frames are handed to zeromq; rejects on a send error or a full queue. */
  send(frames: Buffer | Buffer[] | (Buffer | string)[]): Promise<void> {
    if (this.closed) return Promise.reject(new ReefError('REEF_ERR_ACTOR_CLOSED', { actor: this.name, state: 'closed' }));
    if (this.queued >= this.maxQueued) {
      return Promise.reject(new ReefError('REEF_ERR_QUEUE_FULL', { queue: this.name, limit: this.maxQueued }));
    }
    this.queued++;
    const sent = this.tail.then(() => this.socket.send(frames));
    const settle = (): void => {
      this.queued--;
    };
    // The chain must survive a failed send, or every later send would reject with its error.
    this.tail = sent.then(settle, settle);
    return sent;
  }

  /** Resolves when every send queued so far has settled. */
  async flush(): Promise<void> {
    await this.tail;
  }

  /** Refuse new sends; the ones already queued still go out (await `flush()` for them). */
  close(): void {
    this.closed = true;
  }
}
