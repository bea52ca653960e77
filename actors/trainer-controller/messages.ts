import { z } from 'zod';

/** The trainer-controller's mailbox. Batches, training steps and releases build on this. */
export const trainerStatus = z.object({ type: z.literal('trainer-status'), requestId: z.string() });

export const trainerControllerMessages = z.discriminatedUnion('type', [trainerStatus]);
export type TrainerControllerMessage = z.output<typeof trainerControllerMessages>;
