import { afterEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { waitFor } from '../../test/helpers/wait.js';
import { type ActorHost, readActorEnv, runActor } from './actor-host.js';
import { Mailbox } from './mailbox.js';
import { heartbeatReport, registerRequest } from './messages.js';
import { RpcClient } from './rpc.js';

const messages = z.discriminatedUnion('type', [z.object({ type: z.literal('work'), requestId: z.string(), ms: z.number() })]);

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

async function start(onDrain: () => Promise<void> = async () => {}, onWorkDone: () => void = () => {}, stats: () => Record<string, number> = () => ({ custom: 7 })) {
  const exits: number[] = [];
  const host: ActorHost = await runActor({
    name: 'worker',
    messages,
    env: { name: 'worker', id: 'worker-0', supervisor: null, configPath: null, overrides: {}, heartbeatMs: null },
    processHooks: false,
    exit: (code) => exits.push(code),
    log: () => {},
    onDrain,
    stats,
    createHandler: () => ({
      work: async (msg) => {
        await new Promise((resolve) => setTimeout(resolve, msg.ms));
        onWorkDone();
        return { done: msg.ms };
      },
    }),
  });
  const rpc = new RpcClient(host.endpoint, { log: () => {} });
  cleanups.push(async () => {
    await rpc.close();
    await host.drain('test cleanup');
  });
  return { host, rpc, exits };
}

describe('runActor (in process, no supervisor)', () => {
  it('answers ping and heartbeat with state, pid and merged stats', async () => {
    const { rpc } = await start();
    const pong = await rpc.call<{ state: string; pid: number; stats: Record<string, number> }>({ type: 'ping' });
    expect(pong).toMatchObject({ id: 'worker-0', name: 'worker', state: 'running', pid: process.pid });
    expect(pong.stats).toMatchObject({ custom: 7, working: 0 });
    await expect(rpc.call({ type: 'heartbeat' })).resolves.toMatchObject({ state: 'running' });
  });

  it('an actor whose stats() throws still answers ping with the mailbox\'s figures (the heartbeat\'s timer would have ended the process)', async () => {
    const { rpc, exits } = await start(undefined, undefined, () => {
      throw new Error('counter store closed');
    });
    const pong = await rpc.call<{ state: string; stats: Record<string, number> }>({ type: 'ping' });
    expect(pong.state).toBe('running');
    expect(pong.stats).toMatchObject({ working: 0 });
    expect(exits).toEqual([]);
  });

  it('on drain: answers at once, refuses new work, finishes in-flight work, runs onDrain, exits 0', async () => {
    const order: string[] = [];
    // Both events are recorded in the actor: the reply to the work reaches the client over a
    // socket, possibly after onDrain has already run, so the client's view cannot order them.
    const { rpc, host, exits } = await start(async () => {
      order.push('onDrain');
    }, () => order.push('work done'));
    const inFlight = rpc.call({ type: 'work', ms: 150 });
    await waitFor(async () => ((await rpc.call<{ stats: { working: number } }>({ type: 'ping' })).stats.working === 1), { what: 'work to start' });
    await expect(rpc.call({ type: 'drain' })).resolves.toMatchObject({ state: 'draining' });
    await expect(rpc.call({ type: 'work', ms: 1 })).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_DRAINING' });
    await expect(inFlight).resolves.toMatchObject({ done: 150 });
    await waitFor(() => exits.length === 1, { what: 'the actor to exit' });
    expect(exits).toEqual([0]);
    expect(host.lifecycle.state).toBe('stopped');
    expect(order).toEqual(['work done', 'onDrain']);
  });

  it('readActorEnv rejects a missing or malformed REEF_ACTOR with REEF_ERR_CONFIG_INVALID', () => {
    expect(() => readActorEnv(undefined)).toThrow(expect.objectContaining({ code: 'REEF_ERR_CONFIG_INVALID' }));
    expect(() => readActorEnv('{nope')).toThrow(expect.objectContaining({ code: 'REEF_ERR_CONFIG_INVALID' }));
    expect(() => readActorEnv(JSON.stringify({ name: 'x', id: 'x-0' }))).toThrow(expect.objectContaining({ code: 'REEF_ERR_CONFIG_INVALID' }));
    const env = readActorEnv(JSON.stringify({ name: 'x', id: 'x-0', supervisor: 'tcp://127.0.0.1:1', configPath: null, overrides: {} }));
    expect(env.heartbeatMs).toBeNull();
  });

  // The actor stopped heartbeating as soon as it began to drain. The supervisor only expects that
  // of an actor it is stopping itself: one drained by a SIGTERM from elsewhere fell silent while
  // it finished its work, and was killed for missed heartbeats after 6 × heartbeatMs.
  it('keeps heartbeating while it drains, reporting state draining', async () => {
    const heartbeats: string[] = [];
    const supervisor = await Mailbox.open({
      name: 'fake-supervisor',
      schema: z.discriminatedUnion('type', [registerRequest, heartbeatReport]),
      log: () => {},
      handlers: {
        register: () => ({}),
        heartbeat: (msg) => {
          heartbeats.push(msg.state);
          return {};
        },
      },
    });
    cleanups.push(() => supervisor.close());
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const exits: number[] = [];
    const host = await runActor({
      name: 'worker',
      messages,
      env: { name: 'worker', id: 'worker-0', supervisor: supervisor.endpoint, configPath: null, overrides: {}, heartbeatMs: 20 },
      processHooks: false,
      exit: (code) => exits.push(code),
      log: () => {},
      createHandler: () => ({ work: async () => gate.then(() => ({})) }),
    });
    const rpc = new RpcClient(host.endpoint, { log: () => {} });
    // Popped first: a failed wait must not leave the drain waiting on the gate.
    cleanups.push(() => host.drain('test cleanup'), () => rpc.close(), async () => release());
    const work = rpc.call({ type: 'work', ms: 0 }, { timeoutMs: 60_000 });
    await waitFor(() => host.status().stats.working === 1, { what: 'work to start' });
    const drained = host.drain('SIGTERM');
    await waitFor(() => heartbeats.includes('draining'), { what: 'a heartbeat sent while draining' });
    release();
    await work;
    await drained;
    expect(exits).toEqual([0]);
  });
});
