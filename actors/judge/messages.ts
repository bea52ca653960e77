import { z } from 'zod';

/** The judge's mailbox. Correlation and PRM dispatch (record2record) build on this. */
export const judgeStatus = z.object({ type: z.literal('judge-status'), requestId: z.string() });

export const judgeMessages = z.discriminatedUnion('type', [judgeStatus]);
export type JudgeMessage = z.output<typeof judgeMessages>;
