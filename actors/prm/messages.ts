import { z } from 'zod';

/**
 * A PRM actor's mailbox. Work does not come in here: the actor pulls turns from the judge's
 * mailbox (see actors/judge/messages.ts); this answers status for operators and tests.
 */
export const prmStatus = z.object({ type: z.literal('prm-status'), requestId: z.string() });

export const prmMessages = z.discriminatedUnion('type', [prmStatus]);
export type PrmMessage = z.output<typeof prmMessages>;
