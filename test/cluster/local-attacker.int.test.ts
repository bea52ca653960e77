import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BUS_KEY_FILE, type BusKey, readBusKeyFile } from '../../actors/runtime/bus-key.js';
import { RpcClient } from '../../actors/runtime/rpc.js';
import { freePort } from '../../cluster/net.js';
import { readRunFile } from '../../cluster/run-file.js';
import { type KeylessKind, keylessSend } from '../helpers/keyless.js';
import { descendants, ensureTinyModel, runReef, testConfig } from '../helpers/stack.js';
import { pidAlive, waitFor } from '../helpers/wait.js';

/**
 * A local attacker against a real stack (`reef up` on the tiny model): a process on the same
 * machine without the stack's keys, as an agent's own shell tools are. It finds every listener as
 * such a process can (the control endpoint in the run file, the mailboxes in a status it cannot get
 * without the key, so here from the test's keyed status; the shim's endpoint on its command line;
 * the engines' ports) and sends every message a reviewer would. Each ZeroMQ attempt must fail at
 * the CURVE handshake, so none is ever delivered; the engines' admin routes answer 401. Afterwards
 * the stack serves as before: same processes, same mailboxes, a chat completion still answered.
 * Positive controls (a client holding the key is answered on each listener) show that every
 * refusal is the key's doing, not a wrong endpoint.
 */

interface Status {
  actors: Array<{ id: string; name: string; pid: number | null; state: string; mailbox: string | null; restarts: number }>;
  engines: Array<{ name: string; healthy: boolean; url: string; pid: number | null; weightVersion: string | null }>;
  shim: { pid: number | null; state: string; restarts: number };
}

const ROLLOUT_SPEC = { name: 'rollout', role: 'rollout', kind: 'sglang', modelPath: '/tmp/attacker-model', group: 'reef-rollout', bundleIndex: 0, host: '0.0.0.0', port: 31337, extraArgs: ['--trust-remote-code'] };

/** What a reviewer would send to each kind of listener. */
const ATTEMPTS: Record<'control' | 'gateway' | 'judge' | 'trainer-controller' | 'prm' | 'shim', Array<Record<string, unknown>>> = {
  control: [
    { type: 'status' },
    { type: 'scale', actor: 'prm', count: 5 },
    { type: 'register', id: 'gateway-0', name: 'gateway', pid: 1, mailbox: 'tcp://127.0.0.1:1', secret: '' },
    { type: 'down' },
  ],
  gateway: [
    { type: 'pause-generation', drainTimeoutMs: 1000, maxPauseMs: 900_000 },
    { type: 'resume-generation', weightVersion: 'v999' },
    { type: 'drain' },
  ],
  judge: [
    { type: 'complete-turn', actorId: 'prm-0', leaseId: 'bogus', turnRecordId: 'x', scoreCalls: [], hintCalls: [], prm: { api: 'sglang', url: 'http://127.0.0.1:1', model: null }, startedAt: 0, finishedAt: 0 },
    { type: 'drain' },
  ],
  'trainer-controller': [{ type: 'rollback', scenario: 'default', releaseId: null, keyId: null }, { type: 'drain' }],
  prm: [{ type: 'drain' }],
  shim: [
    { type: 'start-engine', spec: ROLLOUT_SPEC },
    { type: 'trainer-push-weights', engineUrl: 'http://203.0.113.9:30000', weightVersion: 'v1' },
    { type: 'init-ray', address: '203.0.113.9:6379', numCpus: null, numGpus: null, objectStoreBytes: null },
    { type: 'shutdown' },
  ],
};

describe('a local attacker without the stack keys', () => {
  let cfg: { path: string; dir: string };
  let port: number;
  let stackPid = 0;
  let busKey: BusKey;
  let before: Status;
  let shimEndpoint: string;

  const status = async (): Promise<Status> => {
    const r = await runReef(['status', '--json', '-c', cfg.path]);
    expect(r.code, r.stderr).toBe(0);
    return JSON.parse(r.stdout) as Status;
  };
  const chat = () =>
    fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 }),
    });

  beforeAll(async () => {
    ensureTinyModel();
    port = await freePort();
    cfg = testConfig((c) => {
      c.reef.port = port;
      c.cluster.prm_actors = 1;
    });
    const r = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 600_000 });
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
    stackPid = readRunFile(join(cfg.dir, 'data', 'run'))!.pid;
    busKey = readBusKeyFile(join(cfg.dir, 'data', 'run', BUS_KEY_FILE));
    before = await status();
    // As the attacker finds it: on the shim's command line, which every user can read.
    const cmdline = readFileSync(`/proc/${before.shim.pid}/cmdline`, 'utf8').split('\0');
    shimEndpoint = cmdline[cmdline.indexOf('--endpoint') + 1]!;
    expect(shimEndpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
  }, 600_000);

  afterAll(async () => {
    const tree = stackPid ? descendants(stackPid) : [];
    if (cfg && readRunFile(join(cfg.dir, 'data', 'run'))) await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    for (const pid of tree) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
  });

  const listeners = (): Array<[keyof typeof ATTEMPTS, string]> => {
    const rf = readRunFile(join(cfg.dir, 'data', 'run'))!;
    const mailbox = (name: string) => before.actors.find((a) => a.name === name)!.mailbox!;
    return [['control', rf.control!], ['gateway', mailbox('gateway')], ['judge', mailbox('judge')], ['trainer-controller', mailbox('trainer-controller')], ['prm', mailbox('prm')], ['shim', shimEndpoint]];
  };

  it('is refused at the handshake by every ZeroMQ listener, whatever it sends', async () => {
    const attempts: Array<{ listener: string; kind: KeylessKind; outcome: string; events: string[] }> = [];
    for (const [name, endpoint] of listeners()) {
      // 'own-key' even knows the server's public key (it is no secret): CURVE alone would let it in.
      for (const kind of ['plain', 'own-key'] as const) {
        const [first, ...rest] = ATTEMPTS[name];
        const attempt = await keylessSend(endpoint, kind, first!, busKey.publicKey);
        attempts.push({ listener: name, kind, outcome: attempt.outcome, events: attempt.events });
        attempt.close();
        for (const msg of rest) {
          const again = await keylessSend(endpoint, kind, msg, busKey.publicKey);
          attempts.push({ listener: name, kind, outcome: again.outcome, events: again.events });
          again.close();
        }
      }
    }
    expect(attempts.filter((a) => a.outcome !== 'refused'), JSON.stringify(attempts)).toEqual([]);
    expect(attempts.length).toBe(2 * Object.values(ATTEMPTS).flat().length);
  });

  it('gets 401 from the engines\' admin routes, which a request with the key passes', async () => {
    const adminKey = readFileSync(join(cfg.dir, 'data', 'run', 'engine-admin.key'), 'utf8').trim();
    for (const engine of before.engines) {
      for (const [path, body] of [
        ['/pause_generation', {}],
        ['/update_weights_from_disk', { model_path: '/tmp/attacker-model', weight_version: 'evil' }],
        ['/flush_cache', {}],
        ['/init_weights_update_group', { master_address: '203.0.113.9', master_port: 1, rank_offset: 1, world_size: 2 }],
      ] as const) {
        for (const authorization of [null, 'Bearer guessed']) {
          const res = await fetch(`${engine.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) }, body: JSON.stringify(body) });
          expect([engine.name, path, res.status]).toEqual([engine.name, path, 401]);
        }
      }
      // The control: the same route with the key is the engine's to answer.
      const flushed = await fetch(`${engine.url}/flush_cache`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${adminKey}` }, body: '{}' });
      expect(flushed.status).toBe(200);
    }
  });

  it('leaves the stack serving as before: same processes and mailboxes, not paused, a chat answered', async () => {
    const after = await status();
    const shape = (s: Status) => ({
      actors: s.actors.map((a) => [a.id, a.pid, a.mailbox, a.state, a.restarts]),
      engines: s.engines.map((e) => [e.name, e.pid, e.url, e.healthy, e.weightVersion]),
      shim: [s.shim.pid, s.shim.state, s.shim.restarts],
    });
    expect(shape(after)).toEqual(shape(before));
    expect(after.actors.filter((a) => a.name === 'prm')).toHaveLength(1);
    const res = await chat();
    expect(res.status).toBe(200);
    // The controls: a client holding the key is answered on every listener the attacker tried.
    for (const [name, endpoint] of listeners()) {
      const rpc = new RpcClient(endpoint, { name: `keyed→${name}`, busKey, log: () => {} });
      try {
        const reply = await rpc.call({ type: name === 'control' ? 'status' : 'ping' }, { timeoutMs: 10_000 });
        expect(reply.type).toBe('ok');
        if (name === 'gateway') expect((await rpc.call({ type: 'gateway-status' })) as Record<string, unknown>).toMatchObject({ paused: false, weightVersion: before.engines.find((e) => e.name === 'rollout')!.weightVersion });
      } finally {
        await rpc.close();
      }
    }
    await waitFor(() => pidAlive(stackPid), { what: 'the stack to still run' });
  });
});
