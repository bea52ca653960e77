import { z } from 'zod';
import { heartbeatReport, lifecycleStateSchema, registerRequest, statsSchema } from '../actors/runtime/messages.js';

/**
 * Everything the supervisor's control ROUTER accepts: `register` and `heartbeat` from its actors
 * (schemas shared with the actor host), and `status`, `scale`, `down`, `reload-keys` from the CLI.
 */

export const statusRequest = z.object({ type: z.literal('status'), requestId: z.string() });
/**
 * The most instances `scale` starts of an actor. Each is a Node process (~60 MB); a typo such as
 * 1000 for 10 would have spawned them all.
 */
export const MAX_SCALE = 64;

/** An actor kind's name (`prm`, `trainer-controller`): it names `dist/actors/<kind>/main.js`, so never a path. */
export const ACTOR_NAME = /^[a-z][a-z0-9-]{0,63}$/;

export const scaleRequest = z.object({
  type: z.literal('scale'),
  requestId: z.string(),
  actor: z.string().regex(ACTOR_NAME, 'an actor kind: lowercase letters, digits and dashes'),
  count: z.number().int().min(0).max(MAX_SCALE),
});
/** Replied `{}` first, then the whole stack drains. */
export const downRequest = z.object({ type: z.literal('down'), requestId: z.string() });

/** Every running gateway re-reads its API keys (`reef keys reload`); see the gateway's `reload-keys`. */
export const reloadKeysRequest = z.object({ type: z.literal('reload-keys'), requestId: z.string() });

export const controlMessages = z.discriminatedUnion('type', [statusRequest, scaleRequest, downRequest, reloadKeysRequest]);
export type ControlMessage = z.output<typeof controlMessages>;

/** Where an actor's mailbox is: actors find each other through the supervisor. */
export const lookupRequest = z.object({ type: z.literal('lookup'), requestId: z.string(), actor: z.string().min(1) });
export const lookupReply = z.object({
  type: z.literal('ok'),
  requestId: z.string(),
  instances: z.array(z.object({ id: z.string(), mailbox: z.string().nullable(), state: z.string() })),
});
export type LookupReply = z.output<typeof lookupReply>;

export const supervisorMessages = z.discriminatedUnion('type', [registerRequest, heartbeatReport, lookupRequest, controlMessages]);
export type SupervisorMessage = z.output<typeof supervisorMessages>;

/** One actor instance as `status` reports it. */
export const actorInstanceStatusSchema = z.object({
  id: z.string(),
  name: z.string(),
  pid: z.number().int().nullable(),
  /** The actor's own lifecycle state; `failed` while it waits to be restarted. */
  state: lifecycleStateSchema,
  restarts: z.number().int(),
  /** Why the last process died unasked (`exit code 1`, `exit signal SIGKILL`, `missed 6 heartbeats`); null if none did. */
  lastExit: z.string().nullable(),
  /** ms epoch of the last heartbeat, null before the first. */
  lastHeartbeat: z.number().nullable(),
  mailbox: z.string().nullable(),
  stats: statsSchema,
});
export type ActorInstanceStatus = z.output<typeof actorInstanceStatusSchema>;

/** `status` ok reply; `groups`, `engines`, `ray` are filled by whoever composes `reef up`. */
export const statusReply = z.object({
  type: z.literal('ok'),
  requestId: z.string(),
  actors: z.array(actorInstanceStatusSchema),
  groups: z.array(z.unknown()),
  engines: z.array(z.unknown()),
  ray: z.unknown().nullable(),
});
export type StatusReply = z.output<typeof statusReply>;

export const scaleReply = z.object({ type: z.literal('ok'), requestId: z.string(), before: z.number().int(), after: z.number().int() });
export type ScaleReply = z.output<typeof scaleReply>;

/**
 * `reload-keys` ok reply, one entry per gateway instance: `keys` in force now, or null for one that
 * was not registered (restarting), which reads the keys as they are when it starts.
 */
export const reloadKeysReply = z.object({
  type: z.literal('ok'),
  requestId: z.string(),
  gateways: z.array(z.object({ id: z.string(), keys: z.number().int().nullable(), state: z.string() })),
});
export type ReloadKeysReply = z.output<typeof reloadKeysReply>;
