import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../../cluster/net.js';
import { readRunFile } from '../../cluster/run-file.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { runReef, sessionChat, trainingLoopConfig } from '../helpers/stack.js';
import { waitFor } from '../helpers/wait.js';

/**
 * Training end to end on the tiny model: `reef up` with a judge whose PRM engine is a double
 * (it rejects every reply and proposes a hint), tagged conversations through the gateway, judged
 * turns batched by the trainer-controller, trained by 2 gloo ranks, released into the hf engine by
 * trainer rank 0 pushing the weights over gloo (`training.weight_sync: distributed`; the CPU
 * example's `auto` is `disk`, which test/trainer/bridge-train.int.test.ts covers). Then a rollback
 * to the base weights (always from disk) reproduces the earlier outputs exactly.
 */

const HINT = 'Answer in plain words without any formatting at all.';

interface Release {
  id: string;
  weightVersion: string;
  batchIds: string[];
  metrics: Record<string, number>;
  checkpointPath: string;
  rollbackOf: string | null;
  sync: 'disk' | 'distributed';
}

describe('judged turns → batches → training → release → rollback', () => {
  let cfg: { path: string; dir: string };
  let port: number;
  let prm: FakeEngine;
  const base = () => `http://127.0.0.1:${port}`;

  const chat = (session: string, messages: unknown[], extra: Record<string, unknown> = {}) => sessionChat(base(), session, messages, extra);
  const releases = async (): Promise<Release[]> => ((await (await fetch(`${base()}/reef/scenarios/default/releases`)).json()) as { data: Release[] }).data;
  const record = async (id: string) => (await (await fetch(`${base()}/reef/scenarios/default/records/${id}`)).json()) as { outputIds: number[]; logprobs: number[]; weightVersion: string | null };
  const probeRecord = async () => record((await chat('probe', [{ role: 'user', content: 'Tell me about the sea.' }], { seed: 1234, max_tokens: 16 })).id);
  const probe = async () => (await probeRecord()).outputIds;

  beforeAll(async () => {
    prm = await startFakeEngine({
      respond: ({ messages }) => {
        const prompt = JSON.stringify(messages);
        return prompt.includes('Your task: write the short instruction')
          ? { pieces: [`[HINT_START]${HINT}[HINT_END]`, '\n\\boxed{1}'] }
          : { pieces: ['The user asked for a redo.', '\n\\boxed{-1}'] };
      },
    });
    port = await freePort();
    cfg = trainingLoopConfig({ port, prmUrl: prm.url, prmModel: 'fake-prm', prmTimeoutS: 30 });
  });

  afterAll(async () => {
    if (cfg && readRunFile(join(cfg.dir, 'data', 'run'))) await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    await prm?.close();
  });

  it('trains judged turns into releases served by the engine, and rolls back exactly', async () => {
    const up = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 600_000, env: { REEF_TEST_PRM_KEY: 'prm-secret' } });
    expect(up.code, `${up.stdout}\n${up.stderr}`).toBe(0);

    const baseProbe = await probeRecord();
    const before = baseProbe.outputIds;
    expect(await probe()).toEqual(before); // the same seed gives the same tokens

    // Two conversations of three requests: each later user message is the next state of a turn.
    for (const s of ['s1', 's2']) {
      const msgs: Array<{ role: string; content: string }> = [{ role: 'system', content: 'You help with homework.' }, { role: 'user', content: `What is 12 + ${s.length}?` }];
      for (const follow of ['Please redo that without bold.', 'Still not right, try again.', 'Thanks.']) {
        const r = await chat(s, msgs);
        msgs.push({ role: 'assistant', content: r.content }, { role: 'user', content: follow });
        if (msgs.length > 7) break;
      }
    }

    const rels = await waitFor(async () => {
      const r = await releases();
      return r.filter((x) => x.rollbackOf === null).length >= 2 ? r : null;
    }, { what: 'two releases from two batches', timeoutMs: 300_000, intervalMs: 1000 });
    const trained = rels.filter((r) => r.rollbackOf === null).reverse();
    expect(trained.map((r) => r.batchIds)).toEqual([['default:openclawrl:1'], ['default:openclawrl:2']]);
    // Why a push fell back to disk, from the stack's log, should it have.
    const pushLog = () => readFileSync(join(cfg.dir, 'data', 'run', 'reef.log'), 'utf8').split('\n').filter((l) => /weight sync|pushed|trainer-push-weights/.test(l)).slice(-8).join('\n');
    for (const r of trained) {
      expect(r.sync, pushLog()).toBe('distributed'); // pushed, not the disk fallback
      expect(Number.isFinite(r.metrics.loss)).toBe(true);
      expect(existsSync(join(r.checkpointPath, 'model.safetensors'))).toBe(true);
    }
    // Before the first update the trainer reproduces the engine's logprobs; later batches hold
    // turns sampled by older weights, so there the difference measures staleness instead.
    expect(trained[0]!.metrics.train_rollout_logprob_abs_diff).toBeLessThan(1e-3);
    expect(trained[1]!.metrics.train_rollout_logprob_abs_diff).toBeGreaterThanOrEqual(0);
    // The PRM's key reached it, and the judgment is visible on the turn's record.
    expect(prm.requests.length).toBeGreaterThan(0);

    // The engine serves the newest release, and every new record carries its version.
    const latest = trained.at(-1)!.weightVersion;
    const status = (await (await fetch(`${base()}/reef/status`)).json()) as {
      gateway: { weightVersion: string };
      correlation: Record<string, number>;
      training: { releases: number; counters: Record<string, number> };
    };
    expect(status.gateway.weightVersion).toBe(latest);
    expect(status.training.counters.weight_sync_distributed).toBe(trained.length);
    expect(status.training.counters.weight_sync_fallbacks ?? 0).toBe(0);
    // The judge's and trainer's counters, as they persisted them, show in /reef/status.
    expect(status.correlation.tagged).toBeGreaterThanOrEqual(6);
    expect(status.correlation.bound).toBeGreaterThanOrEqual(4);
    expect(status.training.releases).toBeGreaterThanOrEqual(2);
    // The version a reply carries is the one the engine reports serving (meta_info.weight_version).
    const after = await probeRecord();
    expect(after.weightVersion).toBe(latest);
    // The tiny model is close to uniform, so two small steps flip only a few of the 16 sampled
    // tokens, and now and then none: then the same tokens must come with other logprobs.
    if (after.outputIds.join() === before.join()) {
      const moved = Math.max(...after.logprobs.map((lp, i) => Math.abs(lp - baseProbe.logprobs[i]!)));
      expect(moved, 'the same tokens with the same logprobs: the engine still serves the base weights').toBeGreaterThan(1e-3);
    }

    // Each batch wrote one record line that agrees with the store.
    const lines = readFileSync(join(cfg.dir, 'prm-records.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, any>);
    expect(lines.map((l) => [l.batch_id, l.samples, l.rewards])).toEqual([
      ['default:openclawrl:1', 2, { '1': 0, '-1': 2, '0': 0 }],
      ['default:openclawrl:2', 2, { '1': 0, '-1': 2, '0': 0 }],
    ]);
    expect(lines[0]!.judged['hint_accepted']).toBe(2);
    expect(lines[1]!.correlation.bound).toBeGreaterThanOrEqual(4);

    // Rollback to the base weights: the same seed gives exactly the tokens of before.
    const rb = await fetch(`${base()}/reef/scenarios/default/releases/rollback`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ release_id: 'base' }) });
    expect(rb.status, await rb.clone().text()).toBe(200);
    expect(await probe()).toEqual(before);
    const listed = await releases();
    expect(listed[0]).toMatchObject({ rollbackOf: 'base', weightVersion: 'base', sync: 'disk' });

    // A user takes their data back. Their session (a unique marker in what they wrote) is judged,
    // batched with another session's turn and trained into a release; the lineage names that
    // release, and the deletion with rollback=true puts back the weights served before it (the
    // base, after the rollback above).
    const MARK = 'Zx7MarkerForgetMe';
    const talk = async (session: string, words: string) => {
      const msgs = [{ role: 'user', content: words }];
      const r = await chat(session, msgs);
      await chat(session, [...msgs, { role: 'assistant', content: r.content }, { role: 'user', content: `${words} Please redo that.` }]);
    };
    await talk('forget-me', `My name is ${MARK} and I live on ${MARK} street.`);
    await talk('keep-me', 'Count to three for me.');
    const mine = await waitFor(async () => {
      const l = (await (await fetch(`${base()}/reef/scenarios/default/lineage?session=forget-me`)).json()) as { records: number; batches: { release_id: string | null }[]; releases: string[]; rollback_to: string | null };
      return l.batches.some((b) => b.release_id !== null) ? l : null;
    }, { what: 'a release trained on the session to delete', timeoutMs: 300_000, intervalMs: 1000 });
    expect(mine).toMatchObject({ records: 2, serving_trained: true, rollback_to: 'base' });
    const holding = (dir: string, marker: string): string[] => {
      const out: string[] = [];
      const walk = (d: string) => {
        for (const e of readdirSync(d, { withFileTypes: true })) {
          const p = join(d, e.name);
          if (e.isDirectory()) walk(p);
          else if (e.isFile() && readFileSync(p).includes(Buffer.from(marker))) out.push(p);
        }
      };
      walk(dir);
      return out;
    };
    expect(holding(join(cfg.dir, 'data'), MARK).some((p) => p.endsWith('records.sqlite') || p.endsWith('-wal'))).toBe(true);
    const del = await fetch(`${base()}/reef/scenarios/default/sessions/forget-me?rollback=true`, { method: 'DELETE', headers: { 'content-type': 'application/json' }, body: '{}' });
    const gone = (await del.json()) as { deleted: Record<string, unknown>; lineage: { releases: string[]; rollback_to: string }; rollback: { release: { rollbackOf: string } } | null };
    expect(del.status, JSON.stringify(gone)).toBe(200);
    expect(gone.deleted).toMatchObject({ records: 2, wal_truncated: true });
    expect(gone.lineage.releases).toEqual(mine.releases);
    expect(gone.rollback).toMatchObject({ release: { rollbackOf: 'base' } });
    expect(await probe()).toEqual(before);
    // While the stack runs: no byte of it in the store, its WAL, its shared memory, the logs, the
    // checkpoints, or the batch record file; nor in an export of the scenario.
    expect(holding(cfg.dir, MARK)).toEqual([]);
    const out = join(cfg.dir, 'export.jsonl');
    const exported = await runReef(['export', 'records', '--scenario', 'default', '--out', out, '-c', cfg.path], { timeoutMs: 60_000 });
    expect(exported.code, exported.stderr).toBe(0);
    expect(readFileSync(out, 'utf8')).toContain('Count to three for me.');
    expect(holding(cfg.dir, MARK)).toEqual([]);

    const down = await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    expect(down.code, down.stderr).toBe(0);
    expect(holding(cfg.dir, MARK)).toEqual([]);
    // Its own bound, not the suite's 120 s: on 2 loaded cores the two trained batches, the
    // rollback and the deletion's trained batch and rollback together come near that.
  }, 300_000);
});
