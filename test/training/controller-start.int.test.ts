import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { z } from 'zod';
import { afterEach, describe, expect, it } from 'vitest';
import { GenerationGate } from '../../actors/gateway/generation-gate.js';
import { gatewayMessages } from '../../actors/gateway/messages.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { Mailbox } from '../../actors/runtime/mailbox.js';
import { createController } from '../../actors/trainer-controller/index.js';
import { loadConfig } from '../../cluster/config/index.js';
import { lookupRequest } from '../../cluster/supervisor-messages.js';
import { ensureTinyModel, testConfig } from '../helpers/stack.js';

/**
 * What the trainer-controller does when it starts, against real mailboxes: a supervisor that
 * answers `lookup` and a gateway mailbox with the gateway's own message schema and generation
 * gate. No trainer and no engine: the wiring reaches neither until it trains.
 */

const cleanup: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const fn of cleanup.splice(0).reverse()) await fn();
});

async function wiring(gateway: string | null) {
  ensureTinyModel();
  const cfg = testConfig();
  cleanup.push(() => rmSync(cfg.dir, { recursive: true, force: true }));
  const supervisor = await Mailbox.open({
    name: 'test-supervisor',
    schema: z.discriminatedUnion('type', [lookupRequest]),
    handlers: { lookup: (msg) => ({ instances: msg.actor === 'gateway' && gateway ? [{ id: 'gateway-0', mailbox: gateway, state: 'running' }] : [] }) },
    log: () => {},
  });
  cleanup.push(() => supervisor.close());
  const config = await loadConfig(cfg.path);
  const store = SqliteStore.open(join(cfg.dir, 'records.sqlite'));
  cleanup.push(() => store.close());
  const log: string[] = [];
  const wired = await createController({ config, store, shimEndpoint: 'tcp://127.0.0.1:9', rolloutUrl: 'http://127.0.0.1:9', supervisor: supervisor.endpoint, log: (l) => log.push(l) });
  cleanup.push(() => wired.close());
  return { wired, log };
}

describe('a trainer-controller that starts', () => {
  it('resumes a gateway its predecessor paused and died before resuming', async () => {
    const gate = new GenerationGate('v3');
    const seen: unknown[] = [];
    const gateway = await Mailbox.open({
      name: 'test-gateway',
      schema: gatewayMessages,
      handlers: {
        'pause-generation': (msg) => gate.pause(msg.drainTimeoutMs),
        'resume-generation': (msg) => {
          seen.push({ type: msg.type, weightVersion: msg.weightVersion });
          gate.resume(msg.weightVersion);
          return { weightVersion: gate.weightVersion };
        },
        'gateway-status': () => ({ paused: gate.isPaused }),
      },
      log: () => {},
    });
    cleanup.push(() => gateway.close());
    await gate.pause(1_000); // the dead controller's pause, never resumed
    expect(gate.isPaused).toBe(true);
    await wiring(gateway.endpoint);
    expect(seen).toEqual([{ type: 'resume-generation', weightVersion: null }]);
    expect([gate.isPaused, gate.weightVersion]).toEqual([false, 'v3']);
  });

  it('starts all the same when no gateway is up', async () => {
    const { wired, log } = await wiring(null);
    expect(wired.controller.recentReleases).toEqual([]);
    expect(log.filter((l) => l.includes('could not ask the gateway'))).toEqual([]);
  });
});
