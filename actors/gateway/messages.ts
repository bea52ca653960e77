import { z } from 'zod';

/**
 * The gateway's mailbox: the trainer-controller brackets a weight swap with `pause-generation`
 * (stop admitting, drain in-flight requests, bounded) and `resume-generation` (admit again, with
 * the new weight version that every later record carries).
 */
/** Node's longest timer: a longer one fires at once (with a warning), which would end a pause as it began. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export const pauseGeneration = z.object({
  type: z.literal('pause-generation'),
  requestId: z.string(),
  /** How long to wait for in-flight generations before answering anyway. */
  drainTimeoutMs: z.number().int().positive().max(MAX_TIMER_MS),
  /**
   * How long the pause may last before the gateway resumes by itself (weight version unchanged);
   * absent: generation-gate.ts DEFAULT_MAX_PAUSE_MS.
   */
  maxPauseMs: z.number().int().positive().max(MAX_TIMER_MS).optional(),
});

export const resumeGeneration = z.object({
  type: z.literal('resume-generation'),
  requestId: z.string(),
  /** The weight version now served, or null when unchanged (e.g. a failed swap). */
  weightVersion: z.string().nullable(),
});

export const gatewayStatus = z.object({ type: z.literal('gateway-status'), requestId: z.string() });

export const gatewayMessages = z.discriminatedUnion('type', [pauseGeneration, resumeGeneration, gatewayStatus]);
export type GatewayMessage = z.output<typeof gatewayMessages>;

/** ok reply of `pause-generation`: whether every in-flight generation finished in time. */
export const pauseReply = z.object({ type: z.literal('ok'), requestId: z.string(), drained: z.boolean(), inflight: z.number().int() });
export const resumeReply = z.object({ type: z.literal('ok'), requestId: z.string(), weightVersion: z.string().nullable() });
