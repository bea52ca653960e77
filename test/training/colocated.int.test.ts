import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../../cluster/net.js';
import { readRunFile } from '../../cluster/run-file.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { runReef, sessionChat, trainingLoopConfig } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait.js';

/**
 * The one-GPU colocated layout end to end on CPU (`cluster.colocate: true`, one logical GPU): the
 * rollout engine sits in the trainer group's bundle, gives its weights' memory back for each step
 * (`/release_memory_occupation`), takes it back, and gets each release by trainer rank 0 handing
 * the weights over in shared memory (`/update_weights_from_tensor`, `training.weight_sync: auto` →
 * `tensor`), with the gateway paused from before the step until the release is in. The PRM is an
 * external endpoint (a double), as the layout documents.
 */

const HINT = 'Answer in plain words without any formatting at all.';

interface Release {
  weightVersion: string;
  rollbackOf: string | null;
  sync: string;
}

describe('colocated: trainer and rollout engine on one GPU', () => {
  let cfg: { path: string; dir: string };
  let port: number;
  let prm: FakeEngine;
  const base = () => `http://127.0.0.1:${port}`;
  const chat = (session: string, messages: unknown[], extra: Record<string, unknown> = {}) => sessionChat(base(), session, messages, extra);
  const releases = async (): Promise<Release[]> => ((await (await fetch(`${base()}/reef/scenarios/default/releases`)).json()) as { data: Release[] }).data;
  const probe = async () => {
    const id = (await chat('probe', [{ role: 'user', content: 'Tell me about the sea.' }], { seed: 1234, max_tokens: 16 })).id;
    return (await (await fetch(`${base()}/reef/scenarios/default/records/${id}`)).json()) as { outputIds: number[]; logprobs: number[]; weightVersion: string };
  };
  const rollback = async (releaseId: string) => {
    const r = await fetch(`${base()}/reef/scenarios/default/releases/rollback`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ release_id: releaseId }) });
    expect(r.status, await r.clone().text()).toBe(200);
  };

  beforeAll(async () => {
    prm = await startFakeEngine({
      respond: ({ messages }) => (JSON.stringify(messages).includes('Your task: write the short instruction')
        ? { pieces: [`[HINT_START]${HINT}[HINT_END]`, '\n\\boxed{1}'] }
        : { pieces: ['The user asked for a redo.', '\n\\boxed{-1}'] }),
    });
    port = await freePort();
    cfg = trainingLoopConfig({
      port, prmUrl: prm.url, prmModel: 'fake-prm', prmTimeoutS: 30,
      patch: (c) => {
        c.cluster.colocate = true;
        c.cluster.trainer.gpus = 1;
        c.cluster.num_gpus = 1;
        c.training.weight_sync = 'auto';
      },
    });
  });

  afterAll(async () => {
    if (cfg && readRunFile(join(cfg.dir, 'data', 'run'))) await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    await prm?.close();
  });

  it('releases each step into the engine that gave its memory back for it, exactly as its checkpoint', async () => {
    const up = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 600_000, env: { REEF_TEST_PRM_KEY: 'prm-secret' } });
    expect(up.code, `${up.stdout}\n${up.stderr}`).toBe(0);
    const before = await probe();

    // Two conversations of three requests: each later user message is the next state of a turn,
    // so four judged turns make two batches.
    for (const s of ['s1', 's2']) {
      const msgs: Array<{ role: string; content: string }> = [{ role: 'user', content: `What is 12 + ${s.length}?` }];
      for (const follow of ['Please redo that without bold.', 'Still not right, try again.', 'Thanks.']) {
        const r = await chat(s, msgs);
        msgs.push({ role: 'assistant', content: r.content }, { role: 'user', content: follow });
      }
    }
    const trained = await waitFor(async () => {
      const r = (await releases()).filter((x) => x.rollbackOf === null);
      return r.length >= 2 ? r.reverse() : null;
    }, { what: 'two releases', timeoutMs: 300_000, intervalMs: 1000 });
    const log = () => readFileSync(join(cfg.dir, 'data', 'run', 'reef.log'), 'utf8').split('\n').filter((l) => /weight sync|pushed|memory|trainer-push-weights/.test(l)).slice(-10).join('\n');
    for (const r of trained) expect(r.sync, log()).toBe('tensor');
    const status = (await (await fetch(`${base()}/reef/status`)).json()) as { gateway: { weightVersion: string; paused: boolean }; training: { counters: Record<string, number> } };
    expect(status.training.counters.weight_sync_tensor).toBe(trained.length);
    expect(status.training.counters.weight_sync_fallbacks ?? 0).toBe(0);
    expect(status.gateway).toMatchObject({ weightVersion: trained.at(-1)!.weightVersion, paused: false });

    // The engine gave its weights back for each step and took them again (its own log says so).
    const logs = join(cfg.dir, 'data', 'logs');
    const engineLog = readdirSync(logs).filter((f) => f.includes('rollout')).map((f) => readFileSync(join(logs, f), 'utf8')).join('\n');
    expect(engineLog.match(/release_memory_occupation: released/g)?.length ?? 0).toBeGreaterThanOrEqual(2);
    expect(engineLog.match(/resume_memory_occupation: resumed/g)?.length ?? 0).toBeGreaterThanOrEqual(2);

    // What the shared-memory push put in is exactly the release's checkpoint: loading that from
    // disk (a rollback to it) serves the same tokens and logprobs for the same seed.
    const pushed = await probe();
    expect(pushed.weightVersion).toBe(trained.at(-1)!.weightVersion);
    await rollback(`release-${trained.length}`);
    const fromDisk = await probe();
    expect([fromDisk.outputIds, fromDisk.logprobs]).toEqual([pushed.outputIds, pushed.logprobs]);
    // And the base weights come back too: the same seed, the tokens of before.
    await rollback('base');
    expect((await probe()).outputIds).toEqual(before.outputIds);

    const down = await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    expect(down.code, down.stderr).toBe(0);
  });
});
