import { z } from 'zod';
import { ReefError } from './errors.js';
import { Lifecycle } from './lifecycle.js';
import { type LogFn, prefixed, stderrLog } from './log.js';
import { type Handler, type Handlers, Mailbox } from './mailbox.js';
import { type ActorEnv, type ActorStatus, type BuiltinMessage, actorEnvSchema, builtinMessages } from './messages.js';
import { RpcClient } from './rpc.js';

/** What an actor's handler factory gets to build itself. */
export interface ActorContext {
  env: ActorEnv;
  id: string;
  name: string;
  configPath: string | null;
  overrides: Record<string, unknown>;
  lifecycle: Lifecycle;
  log: LogFn;
}

export interface RunActorOptions<S extends z.ZodType<{ type: string }>> {
  /** The actor's name; must match `REEF_ACTOR.name`. */
  name: string;
  /** The actor's mailbox schema (its `messages.ts`). `ping`, `heartbeat`, `drain` are added. */
  messages: S;
  createHandler: (ctx: ActorContext) => Promise<Handlers<z.output<S>>> | Handlers<z.output<S>>;
  /** Runs once in-flight requests are done, before the sockets close (flush state here). */
  onDrain?: () => Promise<void>;
  /** The actor's own counters, merged into heartbeat and ping stats. */
  stats?: () => Record<string, number>;
  /** Handlers running at once. @default 64 */
  concurrency?: number;
  /** @default parsed from process.env.REEF_ACTOR */
  env?: ActorEnv;
  /** What to do when the actor is done; tests pass a function instead of exiting. @default process.exit */
  exit?: (code: number) => void;
  /** Install SIGTERM/SIGINT and uncaught-error handlers (off for in-process use). @default true */
  processHooks?: boolean;
  log?: LogFn;
}

export interface ActorHost {
  readonly id: string;
  readonly endpoint: string;
  readonly lifecycle: Lifecycle;
  status(): ActorStatus;
  /** Stop taking work, finish in-flight requests, close sockets, then exit(0). Idempotent. */
  drain(reason: string): Promise<void>;
}

const DEFAULT_HEARTBEAT_MS = 500;
/** Heartbeats that may fail in a row before the actor concludes its supervisor is gone. */
const ORPHAN_AFTER_FAILURES = 20;

export function readActorEnv(raw: string | undefined = process.env.REEF_ACTOR): ActorEnv {
  if (raw === undefined || raw === '') throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'REEF_ACTOR is not set' });
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch (err) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `REEF_ACTOR is not JSON: ${String(err)}` });
  }
  const parsed = actorEnvSchema.safeParse(json);
  if (!parsed.success) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `REEF_ACTOR: ${parsed.error.message}` });
  return parsed.data;
}

/**
 * Run one actor process: bind its mailbox, register with the supervisor, heartbeat, and drain on
 * `drain`, SIGTERM or SIGINT. An error during start-up or an uncaught one ends in `failed`, exit 1.
 */
export async function runActor<S extends z.ZodType<{ type: string }>>(options: RunActorOptions<S>): Promise<ActorHost> {
  const exit = options.exit ?? ((code: number) => process.exit(code));
  const hooks = options.processHooks ?? true;
  const env = options.env ?? readActorEnv();
  const log = prefixed(options.log ?? stderrLog, `actor ${env.id}`);
  const lifecycle = new Lifecycle(`actor ${env.id}`);
  const startedAt = Date.now();
  const heartbeatMs = env.heartbeatMs ?? DEFAULT_HEARTBEAT_MS;
  let mailbox: Mailbox<z.ZodType<{ type: string }>> | null = null;
  let supervisor: RpcClient | null = null;
  let heartbeat: NodeJS.Timeout | null = null;
  let working = 0;
  let draining: Promise<void> | null = null;

  const fail = (err: unknown): void => {
    log(`failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    if (!lifecycle.is('stopped', 'failed')) lifecycle.transition('failed', String(err));
    exit(1);
  };
  if (hooks) {
    process.on('uncaughtException', fail);
    process.on('unhandledRejection', fail);
  }
  if (env.name !== options.name) fail(new ReefError('REEF_ERR_CONFIG_INVALID', { details: `REEF_ACTOR.name is ${env.name}, expected ${options.name}` }));

  let statsFailing = false;
  /**
   * The actor's own figures. The heartbeat asks for them from a timer, where a throw would end the
   * process: a stats() that fails costs its figures (logged once until it works again), not the actor.
   */
  const ownStats = (): Record<string, number> => {
    try {
      const out = options.stats?.() ?? {};
      statsFailing = false;
      return out;
    } catch (err) {
      if (!statsFailing) log(`stats() failed, reporting the mailbox's figures only: ${err instanceof Error ? err.message : String(err)}`);
      statsFailing = true;
      return {};
    }
  };

  const status = (): ActorStatus => ({
    id: env.id,
    name: env.name,
    state: lifecycle.state,
    pid: process.pid,
    uptimeMs: Date.now() - startedAt,
    stats: { ...(mailbox?.stats ?? {}), working, ...ownStats() },
  });

  const drain = (reason: string): Promise<void> => {
    draining ??= (async () => {
      log(`draining (${reason})`);
      try {
        await lifecycle.close({
          drain: async () => {
            while (working > 0) await new Promise((resolve) => setTimeout(resolve, 10));
            await options.onDrain?.();
          },
          destroy: async () => {
            // Heartbeats go on through the drain: the supervisor kills an actor that falls silent,
            // and one that drains on its own (SIGTERM) may take longer than that to finish its work.
            if (heartbeat !== null) clearInterval(heartbeat);
            await mailbox?.close();
            await supervisor?.close();
          },
        });
      } catch (err) {
        fail(err);
        return;
      }
      log('stopped');
      exit(0);
    })();
    return draining;
  };

  try {
    const ctx: ActorContext = { env, id: env.id, name: env.name, configPath: env.configPath, overrides: env.overrides, lifecycle, log };
    const own = (await options.createHandler(ctx)) as Record<string, Handler<unknown>>;
    // Actor work is refused once draining starts; the built-ins stay answerable to the end.
    const guarded: Record<string, Handler<unknown>> = {};
    for (const [type, handler] of Object.entries(own)) {
      guarded[type] = async (msg, hctx) => {
        if (!lifecycle.is('running', 'starting')) throw new ReefError('REEF_ERR_ACTOR_DRAINING', { actor: env.id });
        working++;
        try {
          return await handler(msg, hctx);
        } finally {
          working--;
        }
      };
    }
    const builtins: Handlers<BuiltinMessage> = {
      ping: () => ({ ...status() }),
      heartbeat: () => ({ ...status() }),
      drain: () => {
        setImmediate(() => void drain('drain request'));
        return { ...status(), state: 'draining' };
      },
    };
    mailbox = await Mailbox.open({
      name: env.id,
      schema: z.discriminatedUnion('type', [builtinMessages, options.messages as never]) as z.ZodType<{ type: string }>,
      handlers: { ...guarded, ...builtins } as unknown as Handlers<{ type: string }>,
      concurrency: options.concurrency ?? 64,
      log,
    });
    if (env.supervisor !== null) {
      supervisor = new RpcClient(env.supervisor, { name: `${env.id}→supervisor`, defaultTimeoutMs: Math.max(2000, heartbeatMs * 4), log });
      await register(supervisor, env, mailbox.endpoint);
    }
    lifecycle.transition('running');
    log(`running, mailbox ${mailbox.endpoint}`);
  } catch (err) {
    fail(err);
    throw err;
  }

  if (supervisor !== null) {
    const sup = supervisor;
    const box = mailbox;
    const parentPid = process.ppid;
    let failures = 0;
    let busy = false;
    heartbeat = setInterval(() => {
      if (busy) return;
      if (process.ppid !== parentPid) {
        void drain(`parent ${parentPid} is gone`);
        return;
      }
      busy = true;
      sup
        .call({ type: 'heartbeat', id: env.id, state: lifecycle.state, stats: status().stats }, { timeoutMs: heartbeatMs * 4 })
        .then(
          () => {
            failures = 0;
          },
          async (err: unknown) => {
            if (err instanceof ReefError && err.code === 'REEF_ERR_NOT_FOUND') {
              await register(sup, env, box.endpoint).catch(() => {});
              return;
            }
            failures++;
            if (failures >= ORPHAN_AFTER_FAILURES) void drain(`supervisor unreachable: ${String(err)}`);
          },
        )
        .finally(() => {
          busy = false;
        });
    }, heartbeatMs);
  }
  if (hooks) {
    process.once('SIGTERM', () => void drain('SIGTERM'));
    process.once('SIGINT', () => void drain('SIGINT'));
  }
  const endpoint = mailbox.endpoint;
  return { id: env.id, endpoint, lifecycle, status, drain };
}

async function register(rpc: RpcClient, env: ActorEnv, mailbox: string): Promise<void> {
  await rpc.call({ type: 'register', id: env.id, name: env.name, pid: process.pid, mailbox, secret: env.secret ?? '' });
}
