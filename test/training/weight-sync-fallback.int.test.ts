import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync, readdirSync, realpathSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../../cluster/net.js';
import { repoRoot } from '../../cluster/paths.js';
import { readRunFile } from '../../cluster/run-file.js';
import { runReef, sessionChat, trainingLoopConfig } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait.js';

/**
 * The trainer-controller's fallback from a failed distributed weight sync to a disk load, with real
 * processes only: `reef up` with `training.weight_sync: distributed`, 2 gloo trainer ranks, and a
 * real hf rollout engine that cannot form a gloo weight group (it runs with GLOO_SOCKET_IFNAME set
 * to an interface that does not exist, python_shim/tests/hf_server_bad_gloo_ifname.py). Every
 * push is refused at /init_weights_update_group, and each release must still reach the engine,
 * from its checkpoint, inside the gateway's pause/resume, trained once.
 *
 * The pause is made observable without timing: the test holds one gateway request inside the
 * engine (the engine's own /pause_generation) while the release happens, so the controller's
 * pause-generation waits for it to drain and the gateway stays paused until the test lets it go.
 */

const HINT = 'Answer in plain words without any formatting at all.';
const ABSENT_INTERFACE = 'reef-absent0'; // hf_server_bad_gloo_ifname.ABSENT_INTERFACE

interface Release {
  id: string;
  weightVersion: string;
  batchIds: string[];
  checkpointPath: string;
  rollbackOf: string | null;
  sync: 'disk' | 'distributed';
}

interface Status {
  gateway: { weightVersion: string | null; paused: boolean; inflight: number };
  training: { releases: number; counters: Record<string, number> };
}

/** A PRM double (OpenAI chat API) that rejects every reply with a hint; its answers wait until `open()`. */
async function startGatedPrm(): Promise<{ url: string; open: () => void; close: () => Promise<void> }> {
  let opened!: () => void;
  const gate = new Promise<void>((resolve) => (opened = resolve));
  let calls = 0;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      calls++;
      const prompt = Buffer.concat(chunks).toString('utf8');
      const content = prompt.includes('Your task: write the short instruction') ? `[HINT_START]${HINT}[HINT_END]\n\\boxed{1}` : 'The user asked for a redo.\n\\boxed{-1}';
      void gate.then(() => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ id: `prm-${calls}`, object: 'chat.completion', created: 0, model: 'gated-prm', choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }] }));
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    open: () => opened(),
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

describe('a failed distributed weight sync falls back to a disk load', () => {
  let cfg: { path: string; dir: string };
  let port: number;
  let enginePort: number;
  let prm: Awaited<ReturnType<typeof startGatedPrm>>;
  const base = () => `http://127.0.0.1:${port}`;
  const engine = () => `http://127.0.0.1:${enginePort}`;

  const chat = (session: string, messages: unknown[], extra: Record<string, unknown> = {}) => sessionChat(base(), session, messages, extra);
  /** Three requests of one session: its first two turns get next states, so they are judged. */
  const conversation = async (session: string) => {
    const msgs: Array<{ role: string; content: string }> = [{ role: 'system', content: 'You help with homework.' }, { role: 'user', content: `What is 12 + ${session.length}?` }];
    for (const follow of ['Please redo that without bold.', 'Still not right, try again.', 'Thanks.']) {
      const r = await chat(session, msgs);
      msgs.push({ role: 'assistant', content: r.content }, { role: 'user', content: follow });
      if (msgs.length > 7) break;
    }
  };
  const json = async <T>(url: string, init?: RequestInit): Promise<T> => {
    const res = await fetch(url, init);
    expect(res.status, url).toBe(200);
    return (await res.json()) as T;
  };
  const status = () => json<Status>(`${base()}/reef/status`);
  const trained = async () => (await json<{ data: Release[] }>(`${base()}/reef/scenarios/default/releases`)).data.filter((r) => r.rollbackOf === null).reverse();
  const record = (id: string) => json<{ outputIds: number[]; logprobs: number[]; weightVersion: string | null }>(`${base()}/reef/scenarios/default/records/${id}`);
  const probe = async () => record((await chat('probe', [{ role: 'user', content: 'Tell me about the sea.' }], { seed: 1234, max_tokens: 16 })).id);
  const engineInfo = () => json<{ weight_version: string; model_path: string }>(`${engine()}/model_info`);
  // The engine's admin routes take the key `reef up` made for the stack's engines.
  const adminKey = () => readFileSync(join(cfg.dir, 'data', 'run', 'engine-admin.key'), 'utf8').trim();
  const enginePost = (path: string) => json<unknown>(`${engine()}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${adminKey()}` }, body: '{}' });

  beforeAll(async () => {
    prm = await startGatedPrm();
    port = await freePort();
    enginePort = await freePort();
    cfg = trainingLoopConfig({ port, prmUrl: prm.url, prmModel: 'gated-prm', prmTimeoutS: 60, patch: (c) => (c.cluster.rollout.port = enginePort) });
  });

  afterAll(async () => {
    if (cfg && readRunFile(join(cfg.dir, 'data', 'run'))) await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    await prm?.close();
  });

  it('releases each batch once, from its checkpoint, inside the gateway pause, counting and logging the fallback', async () => {
    const shimTests = join(repoRoot(), 'python_shim', 'tests');
    const up = await runReef(['up', '-c', cfg.path, '--detach'], {
      timeoutMs: 600_000,
      env: {
        REEF_TEST_PRM_KEY: 'prm-secret',
        // The stack's own launch path (shim → Ray actor → subprocess) starts the engine module named here.
        REEF_ENGINE_MODULE_HF: 'hf_server_bad_gloo_ifname',
        PYTHONPATH: [shimTests, process.env.PYTHONPATH].filter(Boolean).join(':'),
      },
    });
    expect(up.code, `${up.stdout}\n${up.stderr}`).toBe(0);

    const baseVersion = (await engineInfo()).weight_version;
    const before = await probe();
    expect(before.weightVersion).toBe(baseVersion);

    // Batch 1: its turns wait at the PRM until the test has a request held in the engine.
    await conversation('s1');
    await enginePost('/pause_generation');
    const held = chat('held', [{ role: 'user', content: 'Say something while the weights change.' }], { max_tokens: 4 });
    held.catch(() => {}); // awaited below; a failure before then must not also surface as unhandled
    await waitFor(async () => (await status()).gateway.inflight === 1, { what: 'the held request in flight at the gateway' });
    prm.open();

    // Trained; the controller paused the gateway and now waits for the held request to drain,
    // before any weight reached the engine.
    const first = await waitFor(async () => ((await status()).gateway.paused ? 'paused' : (await trained()).length > 0 ? 'released without a pause' : null), {
      what: 'the controller to pause the gateway for release 1',
      timeoutMs: 300_000,
      intervalMs: 100,
    });
    expect(first).toBe('paused');
    const paused = await status();
    expect(paused.gateway).toMatchObject({ paused: true, inflight: 1, weightVersion: baseVersion });
    expect(await trained()).toEqual([]);
    expect((await engineInfo()).weight_version).toBe(baseVersion);

    await enginePost('/continue_generation');
    // The drain let the held request finish on the old weights before the swap.
    expect((await record((await held).id)).weightVersion).toBe(baseVersion);

    const [r1] = await waitFor(async () => ((await trained()).length >= 1 ? trained() : null), { what: 'release 1', timeoutMs: 120_000 });
    expect(r1).toMatchObject({ batchIds: ['default:openclawrl:1'], weightVersion: 'v1', sync: 'disk' });
    const s1 = await status();
    // Resumed with the new version: the gateway's version only changes through resume-generation.
    expect(s1.gateway).toMatchObject({ paused: false, weightVersion: 'v1' });
    expect(s1.training.counters).toMatchObject({ weight_sync_disk: 1, weight_sync_fallbacks: 1 });
    expect(s1.training.counters.weight_sync_distributed).toBeUndefined();
    // The engine serves the release's checkpoint, loaded from disk.
    expect(await engineInfo()).toMatchObject({ weight_version: 'v1', model_path: realpathSync(r1!.checkpointPath) });
    expect((await probe()).weightVersion).toBe('v1');

    // Batch 2 trains on top of release 1 and falls back the same way.
    await conversation('s2');
    const rels = await waitFor(async () => ((await trained()).length >= 2 ? trained() : null), { what: 'release 2', timeoutMs: 300_000 });
    expect(rels.map((r) => [r.batchIds, r.weightVersion, r.sync])).toEqual([
      [['default:openclawrl:1'], 'v1', 'disk'],
      [['default:openclawrl:2'], 'v2', 'disk'],
    ]);
    const s2 = await status();
    expect(s2.gateway).toMatchObject({ paused: false, weightVersion: 'v2' });
    expect(s2.training.counters).toMatchObject({ batches: 2, samples: 4, weight_sync_disk: 2, weight_sync_fallbacks: 2 });
    expect(s2.training.counters.weight_sync_distributed).toBeUndefined();
    expect(s2.training.counters.trainer_restarts).toBeUndefined();
    expect(await engineInfo()).toMatchObject({ weight_version: 'v2', model_path: realpathSync(rels[1]!.checkpointPath) });
    const after = await probe();
    expect(after.weightVersion).toBe('v2');
    // New weights: with the same seed the first token is another one, or the same one at another
    // log-probability (sampled tokens alone can survive two small steps unchanged; CI saw it once).
    expect([after.outputIds[0], after.logprobs[0]]).not.toEqual([before.outputIds[0], before.logprobs[0]]);

    // Trained once each: the trainer names a version per step taken (v1, v2, no v3), its ledger
    // holds the two batches, each batch wrote one record line of its two turns, and the shim
    // logged one step per batch.
    const ckpts = join(cfg.dir, 'data', 'checkpoints');
    expect(readdirSync(ckpts).filter((n) => /^v\d+$/.test(n)).sort()).toEqual(['v1', 'v2']);
    const ledger = JSON.parse(readFileSync(join(ckpts, 'reef_trainer_ledger.json'), 'utf8')) as { batches: Record<string, unknown> };
    expect(Object.keys(ledger.batches).sort()).toEqual(['default:openclawrl:1', 'default:openclawrl:2']);
    const lines = readFileSync(join(cfg.dir, 'prm-records.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { batch_id: string; samples: number });
    expect(lines.map((l) => [l.batch_id, l.samples])).toEqual([['default:openclawrl:1', 2], ['default:openclawrl:2', 2]]);

    const log = readFileSync(join(cfg.dir, 'data', 'run', 'reef.log'), 'utf8').split('\n');
    const steps = log.map((l) => /reef_shim\.trainer: trainer-step (\S+) → (v\d+)/.exec(l)).filter((m) => m !== null).map((m) => [m[1], m[2]]);
    expect(steps).toEqual([['default:openclawrl:1', 'v1'], ['default:openclawrl:2', 'v2']]);

    // The log says why each push failed: the engine's gloo found no such interface.
    const fallbacks = log.filter((l) => l.includes('distributed weight sync of') && l.includes('loading its checkpoint from disk instead'));
    expect(fallbacks).toHaveLength(2);
    expect(fallbacks[0]).toContain('distributed weight sync of v1 failed');
    expect(fallbacks[1]).toContain('distributed weight sync of v2 failed');
    for (const l of fallbacks) expect(l).toContain(ABSENT_INTERFACE);

    const down = await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    expect(down.code, down.stderr).toBe(0);
    rmSync(cfg.dir, { recursive: true, force: true }); // kept when the test fails, for its logs
  }, 900_000);
});
