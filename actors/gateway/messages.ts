import { z } from 'zod';

/**
 * The gateway's mailbox: the trainer-controller brackets a weight swap with `pause-generation`
 * (stop admitting, drain in-flight requests, bounded) and `resume-generation` (admit again, with
 * the new weight version that every later record carries).
 */
/**
 * The longest pause a message may ask for: the trainer-controller's swap asks at most 13.5 min
 * (its drain, a weight push and an engine call, `maxPauseMs` in trainer-controller/index.ts).
 * Anything that reaches the mailbox could otherwise stop every agent's generation for 24.8 days
 * (Node's longest timer) with one message.
 */
export const MAX_PAUSE_MS = 15 * 60_000;
/** The longest wait for in-flight generations a pause may ask for (the controller asks 30 s). */
export const MAX_DRAIN_MS = 5 * 60_000;

export const pauseGeneration = z.object({
  type: z.literal('pause-generation'),
  requestId: z.string(),
  /** How long to wait for in-flight generations before answering anyway. */
  drainTimeoutMs: z.number().int().positive().max(MAX_DRAIN_MS),
  /**
   * How long the pause may last before the gateway resumes by itself (weight version unchanged);
   * absent: generation-gate.ts DEFAULT_MAX_PAUSE_MS.
   */
  maxPauseMs: z.number().int().positive().max(MAX_PAUSE_MS).optional(),
});

export const resumeGeneration = z.object({
  type: z.literal('resume-generation'),
  requestId: z.string(),
  /** The weight version now served, or null when unchanged (e.g. a failed swap). */
  weightVersion: z.string().nullable(),
});

export const gatewayStatus = z.object({ type: z.literal('gateway-status'), requestId: z.string() });

/**
 * Re-reads the config (file and environment) the gateway was started with and puts its
 * `reef.api_keys` in force; on any problem the keys stay as they were and the error names the key
 * path (`reef keys reload`, or SIGHUP to a detached stack).
 */
export const reloadKeys = z.object({ type: z.literal('reload-keys'), requestId: z.string() });

export const gatewayMessages = z.discriminatedUnion('type', [pauseGeneration, resumeGeneration, gatewayStatus, reloadKeys]);
export type GatewayMessage = z.output<typeof gatewayMessages>;

/** ok reply of `pause-generation`: whether every in-flight generation finished in time. */
export const pauseReply = z.object({ type: z.literal('ok'), requestId: z.string(), drained: z.boolean(), inflight: z.number().int() });
/** ok reply of `reload-keys`: how many keys are in force now. */
export const reloadKeysReply = z.object({ type: z.literal('ok'), requestId: z.string(), keys: z.number().int() });
export const resumeReply = z.object({ type: z.literal('ok'), requestId: z.string(), weightVersion: z.string().nullable() });
