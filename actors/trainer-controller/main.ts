import { join } from 'node:path';
import { loadConfig } from '../../cluster/config/index.js';
import { stackEngines } from '../../cluster/stack-env.js';
import { SqliteStore } from '../gateway/store/sqlite-store.js';
import { runActor } from '../runtime/actor-host.js';
import { ReefError } from '../runtime/errors.js';
import type { TrainerController } from './controller.js';
import { createController } from './index.js';
import { trainerControllerMessages } from './messages.js';

/** How often the controller looks for new judged turns when idle. */
const POLL_MS = 500;

let store: SqliteStore | null = null;
let wiring: { controller: TrainerController; close(): Promise<void> } | null = null;
let stopping = false;
let loop: Promise<void> | null = null;
let failures = 0;

await runActor({
  name: 'trainer-controller',
  messages: trainerControllerMessages,
  async createHandler(ctx) {
    if (!ctx.configPath) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'the trainer-controller needs a config file' });
    const config = await loadConfig(ctx.configPath, ctx.overrides);
    const engines = stackEngines();
    if (!engines?.shim) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'REEF_ENGINES has no shim endpoint: start the trainer-controller with `reef up`' });
    // FULL sync on this connection: its commits are rare (one per read or step), and the one that
    // records a release is followed by deleting the checkpoints it retires, which must not happen
    // before that commit survives an OS crash. Its fsync of the WAL also makes every earlier frame
    // durable, the judged turns and records it read among them, so no batch it trained can refer
    // to turns an OS crash takes back.
    // 'block': it serves no client, and its commits (a state snapshot, bookkeeping after the await)
    // were written for a wait in which no other handler runs (docs/internals.md, record store).
    store = SqliteStore.open(join(config.reef.data_dir, 'records.sqlite'), { durability: 'power', lockWait: 'block' });
    wiring = await createController({ config, store, shimEndpoint: engines.shim, rolloutUrl: engines.rollout, supervisor: ctx.env.supervisor, log: ctx.log });
    const c = wiring.controller;
    // One tick at a time; a failing tick backs off instead of spinning. A batch that can never train
    // does not fail ticks: the controller dead-letters it and moves on.
    loop = (async () => {
      while (!stopping) {
        let read = 0;
        try {
          read = await c.tick();
          failures = 0;
        } catch (err) {
          failures++;
          ctx.log(`training loop: ${(err as Error).message}; retrying in ${Math.min(30, 2 ** failures)} s`);
          await new Promise((r) => setTimeout(r, Math.min(30_000, 1000 * 2 ** failures)));
        }
        if (read === 0) await new Promise((r) => setTimeout(r, POLL_MS));
      }
    })();
    return {
      'trainer-status': () => ({ weightVersion: c.currentVersion, releases: c.releaseCount, deadLetters: c.counters.dead_letters ?? 0, counters: { ...c.counters }, failures }),
      // Runs while the loop ticks: the controller makes it wait for the batch being trained.
      rollback: async (msg) => ({ release: await c.rollback(msg.releaseId, msg.keyId) }),
      // As a rollback: it waits for the batch being trained.
      'forget-records': async (msg) => ({ dropped: await c.forget(msg.recordIds) }),
    };
  },
  onDrain: async () => {
    stopping = true;
    await loop;
    await wiring?.close();
    await store?.close();
  },
  stats: (): Record<string, number> => (wiring ? { releases: wiring.controller.releaseCount, failures } : {}),
});
