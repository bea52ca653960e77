import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { ReefError } from '../runtime/errors.js';
import { Mailbox } from '../runtime/mailbox.js';
import { callRollback } from './rollback-rpc.js';

const messages = z.discriminatedUnion('type', [
  z.object({ type: z.literal('rollback'), requestId: z.string(), scenario: z.string(), releaseId: z.string().nullable(), keyId: z.string().nullable() }),
]);

describe('the gateway asking the trainer-controller for a rollback', () => {
  let mailbox: Mailbox<z.infer<typeof messages>> | null = null;
  afterEach(async () => {
    await mailbox?.close();
    mailbox = null;
  });

  async function controller(answer: (releaseId: string | null) => Promise<unknown>) {
    const asked: Array<string | null> = [];
    const keys: Array<string | null> = [];
    mailbox = await Mailbox.open({
      name: 'trainer-controller',
      schema: messages,
      log: () => {},
      handlers: { rollback: (msg) => (asked.push(msg.releaseId), keys.push(msg.keyId), answer(msg.releaseId)) as Promise<Record<string, unknown>> },
    });
    return { endpoint: mailbox.endpoint, asked, keys };
  }

  it('returns the release the controller answers with', async () => {
    const c = await controller(async (id) => ({ release: { id: 'release-3', rollbackOf: id } }));
    expect(await callRollback(c.endpoint, 'default', 'base', 'aaaa0001')).toEqual({ release: { id: 'release-3', rollbackOf: 'base' } });
    // Who asked travels with the request, for the release to keep.
    expect(c.keys).toEqual(['aaaa0001']);
  });

  it('on running out of time says the rollback may still go ahead, not to resend it blindly', async () => {
    let finish!: () => void;
    const done = new Promise<void>((resolve) => (finish = resolve));
    const c = await controller(async () => {
      await done; // a training step runs first
      return { release: { id: 'release-4' } };
    });
    const err = await callRollback(c.endpoint, 'alpha', null, null, 200).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(ReefError);
    expect(err).toMatchObject({ code: 'REEF_ERR_TIMEOUT', status: 504, retryable: false });
    expect((err as Error).message).toMatch(/may still go ahead\. Check GET \/reef\/scenarios\/alpha\/releases before asking again/);
    expect(c.asked).toEqual([null]);
    finish();
  });
});
