import { z } from 'zod';
import { LIFECYCLE_STATES } from './lifecycle.js';

/**
 * Messages of the runtime itself: the environment an actor process is started with, the requests
 * every actor's mailbox answers, and what an actor sends to the supervisor's control socket.
 */

export const lifecycleStateSchema = z.enum(LIFECYCLE_STATES as ['starting', 'running', 'draining', 'stopped', 'failed']);

/** `REEF_ACTOR` (JSON) — see docs/internals.md "Actors and the supervisor". */
export const actorEnvSchema = z
  .object({
    name: z.string().min(1),
    /** Unique per instance: `prm-0`, `prm-1`, … */
    id: z.string().min(1),
    /** The supervisor's control endpoint; null runs the actor alone (no register, no heartbeats). */
    supervisor: z.string().min(1).nullable(),
    configPath: z.string().nullable(),
    /** Command-line overrides of the config: dotted path → value. */
    overrides: z.record(z.string(), z.unknown()),
    /** @default 500 */
    heartbeatMs: z.number().int().positive().nullable().default(null),
    /**
     * What this instance's `register` must carry: the supervisor made it for this process alone,
     * and it reaches the process through its environment, which other users cannot read. A pid
     * proves nothing (anyone can read it). Null with no supervisor.
     */
    secret: z.string().min(1).nullable().default(null),
  })
  .strict();
export type ActorEnv = z.output<typeof actorEnvSchema>;

/** Counters an actor reports (mailbox counters plus the actor's own). */
export const statsSchema = z.record(z.string(), z.number());
export type ActorStats = z.output<typeof statsSchema>;

// --- requests every actor's mailbox answers -------------------------------------------------

export const pingRequest = z.object({ type: z.literal('ping'), requestId: z.string() });
/** Same answer as `ping`; lets the supervisor probe an actor it has not heard from. */
export const heartbeatRequest = z.object({ type: z.literal('heartbeat'), requestId: z.string() });
/** Stop taking work, finish what is in flight, exit 0. Answered at once with the new state. */
export const drainRequest = z.object({ type: z.literal('drain'), requestId: z.string() });

export const builtinMessages = z.discriminatedUnion('type', [pingRequest, heartbeatRequest, drainRequest]);
export type BuiltinMessage = z.output<typeof builtinMessages>;

/** Reply fields of `ping` / `heartbeat`. */
export const actorStatusSchema = z.object({
  id: z.string(),
  name: z.string(),
  state: lifecycleStateSchema,
  pid: z.number().int(),
  uptimeMs: z.number(),
  stats: statsSchema,
});
export type ActorStatus = z.output<typeof actorStatusSchema>;

export const pingReply = actorStatusSchema.extend({ type: z.literal('ok'), requestId: z.string() });

// --- actor → supervisor ---------------------------------------------------------------------

export const registerRequest = z.object({
  type: z.literal('register'),
  requestId: z.string(),
  id: z.string(),
  name: z.string(),
  pid: z.number().int(),
  mailbox: z.string(),
  /** `REEF_ACTOR.secret` of the instance. */
  secret: z.string(),
});
export type RegisterRequest = z.output<typeof registerRequest>;

/** Sent every `heartbeatMs`; an unknown `id` is answered REEF_ERR_NOT_FOUND and the actor registers again. */
export const heartbeatReport = z.object({
  type: z.literal('heartbeat'),
  requestId: z.string(),
  id: z.string(),
  state: lifecycleStateSchema,
  stats: statsSchema,
});
export type HeartbeatReport = z.output<typeof heartbeatReport>;
