import { describe, expect, it } from 'vitest';
import { SendQueue } from './send-queue.js';

/** A socket that, like zeromq, rejects a second send while one is pending, and is released by hand. */
function fakeSocket() {
  const sent: string[] = [];
  const waiting: (() => void)[] = [];
  let busy = false;
  let overlapped = false;
  return {
    sent,
    get overlapped() {
      return overlapped;
    },
    release: () => waiting.shift()?.(),
    get waiting() {
      return waiting.length;
    },
    send(frames: unknown): Promise<void> {
      if (busy) overlapped = true;
      busy = true;
      return new Promise<void>((resolve, reject) => {
        waiting.push(() => {
          busy = false;
          const text = String((frames as Buffer[])[0]);
          if (text === 'fail') reject(new Error('send failed'));
          else {
            sent.push(text);
            resolve();
          }
        });
      });
    },
  };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('SendQueue', () => {
  it('keeps one send in flight and preserves order', async () => {
    const socket = fakeSocket();
    const queue = new SendQueue(socket, { name: 't' });
    const all = ['a', 'b', 'c'].map((s) => queue.send([Buffer.from(s)]));
    await tick();
    expect(socket.waiting).toBe(1);
    expect(queue.length).toBe(3);
    for (let i = 0; i < 3; i++) {
      socket.release();
      await tick();
    }
    await Promise.all(all);
    expect(socket.sent).toEqual(['a', 'b', 'c']);
    expect(socket.overlapped).toBe(false);
    expect(queue.length).toBe(0);
  });

  it('rejects with REEF_ERR_QUEUE_FULL past its bound, and accepts again once drained', async () => {
    const socket = fakeSocket();
    const queue = new SendQueue(socket, { name: 'small', maxQueued: 2 });
    const first = queue.send([Buffer.from('1')]);
    const second = queue.send([Buffer.from('2')]);
    await expect(queue.send([Buffer.from('3')])).rejects.toMatchObject({ code: 'REEF_ERR_QUEUE_FULL', retryable: true });
    await tick();
    socket.release();
    await first;
    const third = queue.send([Buffer.from('3')]);
    await tick();
    socket.release();
    await tick();
    socket.release();
    await Promise.all([second, third]);
    expect(socket.sent).toEqual(['1', '2', '3']);
  });

  it('a failed send rejects only its caller; later sends still go out', async () => {
    const socket = fakeSocket();
    const queue = new SendQueue(socket, { name: 't' });
    const bad = queue.send([Buffer.from('fail')]);
    const good = queue.send([Buffer.from('ok')]);
    await tick();
    socket.release();
    await expect(bad).rejects.toThrow('send failed');
    await tick();
    socket.release();
    await good;
    expect(socket.sent).toEqual(['ok']);
  });

  it('refuses sends after close but flushes those already queued', async () => {
    const socket = fakeSocket();
    const queue = new SendQueue(socket, { name: 't' });
    const queued = queue.send([Buffer.from('x')]);
    queue.close();
    await expect(queue.send([Buffer.from('y')])).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED' });
    await tick();
    socket.release();
    await queue.flush();
    await queued;
    expect(socket.sent).toEqual(['x']);
  });
});
