import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { decode, encode } from '../actors/runtime/codec.js';
import { ReefError } from '../actors/runtime/errors.js';
import { waitFor } from '../test/helpers/wait.js';
import { BridgeClient } from './client.js';
import type { Layout } from './messages.js';
import { type ShimProcess, spawnShim } from './shim-process.js';

const quiet = (): void => {};
const LAYOUT: Layout = { trainer: { gpus: 4 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 1 }, student: { gpus: 1 }, cpusPerBundle: 1, colocate: false };

/**
 * A ROUTER standing in for a shim: `answer(type, reply)` is called for each request (`reply` sends
 * `{type: 'ok', requestId, ...fields}`), and `body` runs with a client connected to it.
 */
async function withFakeShim(
  answer: (type: string, reply: (fields: Record<string, unknown>) => void) => void,
  heartbeatMs: number,
  body: (client: BridgeClient) => Promise<void>,
): Promise<void> {
  const router = new zmq.Router();
  await router.bind('tcp://127.0.0.1:*');
  // One send at a time: a socket refuses a send while another is in progress.
  let sending: Promise<void> = Promise.resolve();
  const serving = (async () => {
    for await (const [identity, payload] of router) {
      const msg = decode(payload!) as { type: string; requestId: string };
      answer(msg.type, (fields) => {
        sending = sending.then(() => router.send([identity!, encode({ type: 'ok', requestId: msg.requestId, ...fields })])).catch(() => {});
      });
    }
  })().catch(() => {});
  const client = await BridgeClient.connect(router.lastEndpoint!, { heartbeatMs });
  try {
    await body(client);
  } finally {
    await client.close();
    router.close();
    await serving;
  }
}

async function rejection(p: Promise<unknown>): Promise<ReefError> {
  const err = await p.then(
    () => {
      throw new Error('expected a rejection');
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ReefError);
  return err as ReefError;
}

describe('BridgeClient against the real shim', () => {
  let shim: ShimProcess;
  let client: BridgeClient;

  beforeAll(async () => {
    shim = await spawnShim({ log: quiet });
    client = await BridgeClient.forProcess(shim);
  });
  afterAll(async () => {
    await client?.close();
    await shim?.stop();
  });

  it('pings the shim it spawned', async () => {
    const pong = await client.ping();
    expect(pong).toMatchObject({ type: 'ok', pid: shim.pid, rayConnected: false });
    expect(shim.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
  });

  it('plans the reference layout', async () => {
    const plan = await client.planPlacement(LAYOUT);
    expect(plan.groups.map((g) => [g.name, g.strategy, g.bundles.length])).toEqual([
      ['reef-trainer', 'STRICT_PACK', 4],
      ['reef-rollout', 'PACK', 1],
      ['reef-prm-0', 'PACK', 1],
      ['reef-student', 'PACK', 1],
    ]);
    expect(plan.totalGpus).toBe(7);
  });

  it('turns error replies into typed errors', async () => {
    const invalid = await rejection(client.planPlacement({ ...LAYOUT, trainer: { gpus: 0 } }));
    expect(invalid.code).toBe('REEF_ERR_INVALID_ARGUMENT');
    expect(invalid.message).toContain('layout.trainer.gpus must be at least 1');
    const bad = await rejection(client.callUnchecked({ type: 'plan-placement', layout: { trainer: 'four' } }));
    expect(bad.code).toBe('REEF_ERR_BAD_MESSAGE');
    expect(bad.message).toContain('plan-placement.layout.trainer: expected a map');
    expect(bad.retryable).toBe(false);
    const unknown = await rejection(client.callUnchecked({ type: 'reticulate-splines' }));
    expect(unknown.code).toBe('REEF_ERR_UNKNOWN_MESSAGE');
    const noRay = await rejection(client.createPlacement(LAYOUT, 5));
    expect(noRay.code).toBe('REEF_ERR_RAY');
    expect((await client.ping()).type).toBe('ok');
  });

  it('refuses a malformed request before it leaves', async () => {
    const err = await rejection(client.stopEngine(42 as unknown as string));
    expect(err.code).toBe('REEF_ERR_INVALID_ARGUMENT');
  });

  it('reports status without Ray', async () => {
    expect(await client.status()).toMatchObject({ ray: null, groups: [], engines: [] });
  });
});

describe('a shim that dies', () => {
  it('rejects the pending call and every later one with REEF_ERR_BRIDGE_DOWN after kill -9', async () => {
    const shim = await spawnShim({ log: quiet });
    const client = await BridgeClient.forProcess(shim);
    try {
      process.kill(shim.pid, 'SIGSTOP'); // frozen: the next ping stays pending until the kill
      const pending = client.ping({ timeoutMs: 60_000 });
      process.kill(shim.pid, 'SIGKILL');
      const err = await rejection(pending);
      expect(err.code).toBe('REEF_ERR_BRIDGE_DOWN');
      expect(err.message).toContain('SIGKILL');
      expect((await rejection(client.status())).code).toBe('REEF_ERR_BRIDGE_DOWN');
      expect(client.isDown).toBe(true);
    } finally {
      await client.close();
      await shim.stop();
    }
  });

  it('treats an unanswered ping as down, and drops the late reply', async () => {
    const shim = await spawnShim({ log: quiet });
    const client = await BridgeClient.connect(shim.endpoint);
    try {
      process.kill(shim.pid, 'SIGSTOP');
      expect((await rejection(client.ping({ timeoutMs: 300 }))).code).toBe('REEF_ERR_BRIDGE_DOWN');
      process.kill(shim.pid, 'SIGCONT');
      const pong = await waitFor(() => client.ping({ timeoutMs: 2_000 }), { what: 'the shim to answer again' });
      expect(pong.pid).toBe(shim.pid);
    } finally {
      await client.close();
      await shim.stop();
    }
  });

  // Production connects by endpoint (trainer-controller, stack), with no process to watch: a long
  // call pending when the shim died used to wait out its whole timeout (600 s for trainer-step).
  it('rejects a pending call with REEF_ERR_BRIDGE_DOWN when the shim it connected to dies', async () => {
    const shim = await spawnShim({ log: quiet });
    const client = await BridgeClient.connect(shim.endpoint, { heartbeatMs: 200 });
    try {
      process.kill(shim.pid, 'SIGSTOP');
      const pending = client.callUnchecked({ type: 'status' }, { timeoutMs: 60_000 });
      process.kill(shim.pid, 'SIGKILL');
      // Not the call's own timeout (60 s, REEF_ERR_TIMEOUT): the heartbeat found the shim gone.
      const err = await rejection(pending);
      expect(err.code).toBe('REEF_ERR_BRIDGE_DOWN');
      expect(err.message).toContain(`pid ${shim.pid}`);
      expect(client.isDown).toBe(true);
    } finally {
      await client.close();
      await shim.stop();
    }
  });

  it('rejects a pending call when another shim answers at its endpoint (the request went to the old one)', async () => {
    let pid = 111;
    // A restarted shim answers pings at once and never hears of what the old one was doing.
    await withFakeShim((type, reply) => (type === 'ping' ? reply({ pid, version: 'x', rayConnected: false }) : undefined), 200, async (client) => {
      const pending = client.callUnchecked({ type: 'trainer-step' }, { timeoutMs: 60_000 });
      pid = 222;
      // Not the call's own timeout (60 s, REEF_ERR_TIMEOUT): the new pid gave the restart away.
      const err = await rejection(pending);
      expect(err.code).toBe('REEF_ERR_BRIDGE_DOWN');
      expect(err.message).toContain('pid 111');
      expect(err.message).toContain('pid 222');
      expect(client.isDown).toBe(true);
    });
  });

  it('keeps a slow call that the live shim is still working on', async () => {
    const answer = (type: string, reply: (fields: Record<string, unknown>) => void): void => {
      if (type === 'ping') reply({ pid: 111, version: 'x', rayConnected: false });
      else setTimeout(() => reply({ done: true }), 1_500);
    };
    await withFakeShim(answer, 100, async (client) => {
      expect(await client.callUnchecked({ type: 'trainer-step' }, { timeoutMs: 10_000 })).toMatchObject({ done: true });
      expect(client.isDown).toBe(false);
    });
  });

  it('fails to connect to nothing', async () => {
    const err = await rejection(BridgeClient.connect('tcp://127.0.0.1:9', { timeoutMs: 300 }));
    expect(err.code).toBe('REEF_ERR_BRIDGE_DOWN');
  });

  it('reports a shim that cannot start, with its stderr', async () => {
    const err = await rejection(spawnShim({ endpoint: 'tcp://256.0.0.1:1', log: quiet }));
    expect(err.code).toBe('REEF_ERR_SHIM');
    expect(err.message).toContain('exited with code 1 before it was ready');
    expect(err.message).toContain('cannot bind tcp://256.0.0.1:1');
  });

  it('exits 0 on SIGTERM through stop()', async () => {
    const shim = await spawnShim({ log: quiet });
    await shim.stop();
    expect(await shim.exited).toBe(0);
  });
});
