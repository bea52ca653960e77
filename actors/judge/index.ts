import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { ReefConfig } from '../../cluster/config/types.js';
import { stackEngines } from '../../cluster/stack-env.js';
import { SqliteStore } from '../gateway/store/sqlite-store.js';
import type { Handlers } from '../runtime/mailbox.js';
import type { LogFn } from '../runtime/log.js';
import { ReefError } from '../runtime/errors.js';
import { prmSettings } from '../prm/settings.js';
import { CONSUMER, JudgeCore } from './handler.js';
import type { JudgeMessage } from './messages.js';

/** The judge, wired: the record store, the core, a read loop, periodic state saves, the mailbox handlers. */
export interface Judge {
  core: JudgeCore;
  store: SqliteStore;
  handlers: Handlers<JudgeMessage>;
  stats(): Record<string, number>;
  /** Stop reading, answer waiting long-polls, save state, close the store. */
  close(): Promise<void>;
}

export interface StartJudgeOptions {
  config: ReefConfig;
  log: LogFn;
  /** How often the store is polled for new records when idle. @default 100 */
  pollMs?: number;
  /** How often leases and completions are saved, and (once every record is read) idle sessions expire. @default 1000 */
  flushMs?: number;
  /** @default REEF_JUDGE_LEASE_MS, else 15000 */
  leaseMs?: number;
}

/**
 * REEF_JUDGE_LEASE_MS, refused when set to anything but a whole number of ms a Node timer can wait:
 * a typo used to fall back to 15 s unnoticed, and a huge value overflowed the PRM actors' renewal
 * timers, which then fired at once, over and over.
 */
export function leaseFromEnv(value: string | undefined): number | null {
  if (value === undefined || value.trim() === '') return null;
  const ms = Number(value);
  if (!Number.isSafeInteger(ms) || ms < 100 || ms > 2 ** 31 - 1) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `REEF_JUDGE_LEASE_MS: expected whole milliseconds from 100 to ${2 ** 31 - 1}, got ${JSON.stringify(value)}` });
  }
  return ms;
}

export async function startJudge(opts: StartJudgeOptions): Promise<Judge> {
  const { config, log } = opts;
  const prm = prmSettings(config, stackEngines());
  mkdirSync(config.reef.data_dir, { recursive: true });
  // 'block': a commit marks its snapshot of the sessions saved after the await, so no handler may
  // run while it waits for the lock (docs/internals.md, record store).
  const store = SqliteStore.open(join(config.reef.data_dir, 'records.sqlite'), { durability: config.reef.durability, lockWait: 'block' });
  const envLease = leaseFromEnv(process.env.REEF_JUDGE_LEASE_MS);
  const core = new JudgeCore({
    store,
    mode: prm.mode,
    correlator: { sessionTtlS: prm.stage.session_ttl_s, maxOpenSessions: prm.stage.max_open_sessions },
    maxHintCandidates: prm.maxHintCandidates,
    leaseMs: opts.leaseMs ?? envLease ?? 15_000,
    log,
  });
  try {
    await core.start();
  } catch (err) {
    await store.close();
    throw err;
  }
  log(`judge mode ${prm.mode}${prm.mode === 'judge' ? ` (${prm.api} PRM, lease ${core.leaseMs} ms)` : ': sessions bind, nothing is judged'}`);

  let stopped = false;
  let loop: Promise<void> = Promise.resolve();
  let timer: NodeJS.Timeout | null = null;
  const tick = (): void => {
    loop = (async () => {
      let read = 0;
      try {
        read = await core.pump();
      } catch (err) {
        log(`reading records failed (will retry): ${String(err)}`);
      }
      if (!stopped) timer = setTimeout(tick, read > 0 ? 0 : (opts.pollMs ?? 100));
    })();
  };
  tick();
  const flusher = setInterval(() => {
    core.flush(Date.now()).catch((err: unknown) => log(`saving judge state failed (will retry): ${String(err)}`));
  }, opts.flushMs ?? 1000);

  const handlers: Handlers<JudgeMessage> = {
    'judge-status': async () => ({ consumer: CONSUMER, mode: core.mode, nextOffset: core.offset, headOffset: await store.headOffset(), judgedHead: await store.judgedHeadOffset(), stats: core.stats() }),
    'lease-turn': async (msg) => ({ ...(await core.lease(msg.actorId, msg.waitMs)), mode: core.mode }),
    'renew-lease': (msg) => ({ ...core.renew(msg.actorId, msg.leaseIds), leaseMs: core.leaseMs }),
    'release-lease': (msg) => ({ released: core.release(msg.actorId, msg.leaseIds) }),
    'complete-turn': (msg) => core.complete(msg),
    'forget-records': async (msg) => ({ dropped: await core.forget(msg.recordIds) }),
  };

  return {
    core,
    store,
    handlers,
    stats: () => core.stats(),
    async close() {
      stopped = true;
      if (timer !== null) clearTimeout(timer);
      clearInterval(flusher);
      core.close();
      await loop;
      await core.flush().catch((err: unknown) => log(`final state save failed: ${String(err)}`));
      await store.close();
    },
  };
}
