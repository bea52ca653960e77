import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { Mailbox } from '../runtime/mailbox.js';
import { JudgeLink } from './worker.js';

describe('JudgeLink', () => {
  const cleanups: Array<() => Promise<void>> = [];
  afterEach(async () => {
    while (cleanups.length > 0) await cleanups.pop()!();
  });

  it('lets go of a peer that does not know the judge\'s messages (another actor on the judge\'s old port), and looks again', async () => {
    const other = await Mailbox.open({
      name: 'not-the-judge',
      schema: z.discriminatedUnion('type', [z.object({ type: z.literal('ping') })]),
      log: () => {},
      handlers: { ping: () => ({}) },
    });
    cleanups.push(() => other.close());
    const link = new JudgeLink(null, other.endpoint, () => {});
    cleanups.push(() => link.close());
    const held = () => (link as unknown as { rpc: unknown }).rpc;
    await expect(link.call({ type: 'lease-turn', actorId: 'prm-0', waitMs: 0 }, { timeoutMs: 2000 })).rejects.toMatchObject({ code: 'REEF_ERR_UNKNOWN_MESSAGE' });
    expect(held()).toBeNull();
  });
});
