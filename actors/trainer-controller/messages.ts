import { z } from 'zod';

/** The trainer-controller's mailbox: status, releases, rollback, deletion. */
export const trainerStatus = z.object({ type: z.literal('trainer-status'), requestId: z.string() });

/** Puts an earlier release back (`releaseId` null = the one before the current; 'base' = the base model). */
export const rollbackRequest = z.object({
  type: z.literal('rollback'),
  requestId: z.string(),
  scenario: z.string(),
  releaseId: z.string().nullable(),
  /** The principal id of the API key that asked (auth.ts), kept on the release it makes. */
  keyId: z.string().nullable(),
});

/** Deletion on request (the gateway): drop these turns from unbatched tasks and untrained batches. Replies `{dropped}`. */
export const forgetRecords = z.object({ type: z.literal('forget-records'), requestId: z.string(), recordIds: z.array(z.string()) });

export const trainerControllerMessages = z.discriminatedUnion('type', [trainerStatus, rollbackRequest, forgetRecords]);
export type TrainerControllerMessage = z.output<typeof trainerControllerMessages>;

/** Where the controller keeps its state in the store's kv table (with its judged-turn offset). */
export const STATE_KEY = 'trainer-controller:state';
export const CONSUMER = 'trainer-controller';
