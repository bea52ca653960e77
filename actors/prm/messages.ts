import { z } from 'zod';

/** A PRM actor's mailbox. Vote dispatch from the judge (credit-based) builds on this. */
export const prmStatus = z.object({ type: z.literal('prm-status'), requestId: z.string() });

export const prmMessages = z.discriminatedUnion('type', [prmStatus]);
export type PrmMessage = z.output<typeof prmMessages>;
