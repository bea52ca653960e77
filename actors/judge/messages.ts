import { z } from 'zod';

/**
 * The judge's mailbox. PRM actors PULL finished turns (credit-based dispatch): each free credit
 * is one `lease-turn` long-poll; a lease must be renewed within `leaseMs` or the turn goes to
 * another actor; `complete-turn` hands back the raw PRM replies, and the first completion of a turn
 * is the one that counts. See docs/internals.md "Judge and PRM actors".
 */

export const judgeStatus = z.object({ type: z.literal('judge-status'), requestId: z.string() });

export const leaseTurn = z.object({
  type: z.literal('lease-turn'),
  requestId: z.string(),
  actorId: z.string().min(1),
  /** How long to wait for a turn when none is free; the reply then carries `turn: null`. */
  waitMs: z.number().int().min(0).max(30_000),
});

export const renewLease = z.object({ type: z.literal('renew-lease'), requestId: z.string(), actorId: z.string().min(1), leaseIds: z.array(z.string()) });

/** Give leased turns back unjudged (a draining actor, a PRM failing their calls): they are dispatched again, behind the turns waiting. */
export const releaseLease = z.object({ type: z.literal('release-lease'), requestId: z.string(), actorId: z.string().min(1), leaseIds: z.array(z.string()) });

/** One PRM call: its reply text, or the error that stood in for it (a failed vote). */
export const callResultSchema = z.strictObject({ output: z.string().nullable(), error: z.string().nullable() });

export const completeTurn = z.object({
  type: z.literal('complete-turn'),
  requestId: z.string(),
  actorId: z.string().min(1),
  leaseId: z.string(),
  turnRecordId: z.string().min(1),
  /** `prm_m` score calls and `prm_m` hint calls, in the order they were made. */
  scoreCalls: z.array(callResultSchema),
  hintCalls: z.array(callResultSchema),
  /** Which PRM answered: `{api, url, model}`. */
  prm: z.strictObject({ api: z.enum(['sglang', 'openai']), url: z.string(), model: z.string().nullable() }),
  startedAt: z.number(),
  finishedAt: z.number(),
});

/** Deletion on request (the gateway): drop the pending turns of these records. Replies `{dropped}`. */
export const forgetRecords = z.object({ type: z.literal('forget-records'), requestId: z.string(), recordIds: z.array(z.string()) });

export const judgeMessages = z.discriminatedUnion('type', [judgeStatus, leaseTurn, renewLease, releaseLease, completeTurn, forgetRecords]);
export type JudgeMessage = z.output<typeof judgeMessages>;
export type CompleteTurn = z.output<typeof completeTurn>;

/** A finished turn as a PRM actor receives it. */
export const judgeTurnSchema = z.object({
  turnRecordId: z.string(),
  nextStateRecordId: z.string(),
  scenario: z.string(),
  sessionKey: z.string(),
  /** The request's first user message: the task an agent works on ('' when there is none). */
  task: z.string(),
  /** What the reply answered: the request's user/tool messages after its last assistant message, read as a next state is (system reminders skipped). */
  context: z.string(),
  /** The assistant's reply text, with its tool calls as JSON lines. */
  reply: z.string(),
  nextState: z.object({ role: z.enum(['user', 'tool']), content: z.string() }),
});
export type JudgeTurn = z.output<typeof judgeTurnSchema>;

export const leaseReply = z.object({
  type: z.literal('ok'),
  requestId: z.string(),
  turn: judgeTurnSchema.nullable(),
  leaseId: z.string().nullable(),
  leaseMs: z.number(),
  /** `correlate-only`: this judge dispatches nothing (no PRM configured). */
  mode: z.enum(['judge', 'correlate-only']),
});
export type LeaseReply = z.output<typeof leaseReply>;

export const renewReply = z.object({ type: z.literal('ok'), requestId: z.string(), renewed: z.array(z.string()), lost: z.array(z.string()), leaseMs: z.number() });
export type RenewReply = z.output<typeof renewReply>;

export const completeReply = z.object({
  type: z.literal('ok'),
  requestId: z.string(),
  /** False when the turn was judged already (by another actor, or before a judge restart). */
  accepted: z.boolean(),
  /** Offset of the turn in the judged-turn log, null when the turn is unknown. */
  offset: z.number().nullable(),
});
export type CompleteReply = z.output<typeof completeReply>;
