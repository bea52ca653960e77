import { mkdtempSync, readFileSync, mkdirSync, existsSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ReefError } from '../runtime/errors.js';
import { MAX_DEAD_LETTERS, MAX_PENDING_BATCHES, TrainerController } from './controller.js';
import { opts, rec, world } from './fixtures.js';

/** The task ids of every step the trainer is sent, in order. */
function stepsSent(w: ReturnType<typeof world>): string[][] {
  const sent: string[][] = [];
  const step = w.ports.trainer.step;
  w.ports.trainer.step = async (id, tasks) => {
    sent.push(tasks.map((t) => t.taskId));
    return step(id, tasks);
  };
  return sent;
}


/** Four judged turns trained as two batches: releases v1 and v2. */
async function twoReleases(): Promise<{ dir: string; w: ReturnType<typeof world>; c: TrainerController }> {
  const dir = mkdtempSync(join(tmpdir(), 'tc-'));
  const w = world(dir);
  for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
  const c = new TrainerController(w.ports, opts(dir), 0, null);
  await c.tick();
  return { dir, w, c };
}

/**
 * Two judged turns (one batch), and a controller killed after its trainer step, before its release
 * was committed: the publish throws. The world is left as such a crash leaves it, publish restored.
 */
async function killedAfterStep(w: ReturnType<typeof world>, dir: string): Promise<void> {
  w.add('a', 1);
  w.add('b', 1);
  const c1 = new TrainerController(w.ports, opts(dir), 0, null);
  const publish = w.ports.publish;
  w.ports.publish = async () => {
    throw new Error('controller killed');
  };
  await expect(c1.tick()).rejects.toThrow('controller killed');
  w.ports.publish = publish;
}

/** Four judged turns (two batches) whose every trainer step also answers `extra` metrics. */
function twoBatchesWithMetrics(extra: Record<string, number>): { dir: string; w: ReturnType<typeof world> } {
  const dir = mkdtempSync(join(tmpdir(), 'tc-'));
  const w = world(dir);
  for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
  const step = w.ports.trainer.step;
  w.ports.trainer.step = async (id, tasks) => {
    const r = await step(id, tasks);
    return { ...r, metrics: { ...r.metrics, ...extra } };
  };
  return { dir, w };
}

describe('TrainerController', () => {
  it('with training off, forms and records every batch and neither trains, starts nor releases anything', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    ['a', 'b', 'c', 'd', 'e'].forEach((id, i) => w.add(id, i % 2 ? -1 : 1));
    const c = new TrainerController(w.ports, { ...opts(dir), train: false }, 0, null);
    await c.tick();
    expect(w.stepsRun).toEqual([]);
    expect(w.published).toEqual([]);
    expect(w.calls).toEqual([]);
    expect(c.recentReleases).toEqual([]);
    expect(c.counters.batches_untrained).toBe(2);
    const lines = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.batch_id, l.samples, l.trained])).toEqual([['s:openclawrl:1', 2, false], ['s:openclawrl:2', 2, false]]);
    // A restart from the saved state writes no line twice and trains nothing either.
    const again = new TrainerController(w.ports, { ...opts(dir), train: false }, w.durable.offset, w.durable.state);
    await again.tick();
    expect(readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n')).toHaveLength(2);
    expect(w.stepsRun).toEqual([]);
  });

  it("trains a batch whose id the trainer's ledger holds with other tasks under the next id (the store lost commits the ledger kept)", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    const sent = stepsSent(w);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    w.failBatch('s:openclawrl:1', () => new ReefError('REEF_ERR_CONFLICT', { what: 'batch id s:openclawrl:1', details: 'trained before on other tasks' }));
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    // Answered "already trained", a and b were counted and never trained; as batch 3 they are.
    expect(w.stepsRun).toEqual(['s:openclawrl:3', 's:openclawrl:2']);
    expect(sent).toEqual([['a', 'b'], ['a', 'b'], ['c', 'd']]);
    expect(c.recentReleases.map((r) => r.batchIds)).toEqual([['s:openclawrl:3'], ['s:openclawrl:2']]);
    expect(c.counters.batches_renumbered).toBe(1);
    expect(c.counters.trainer_restarts ?? 0).toBe(0);
    expect(w.calls.filter((x) => x.startsWith('restart:'))).toHaveLength(1);
    const lines = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.batch, l.batch_id])).toEqual([[3, 's:openclawrl:3'], [2, 's:openclawrl:2']]);
    // The next batch takes the number after the one claimed (sampled from the last release: not stale).
    w.add('e', 1, 'anchor', c.recentReleases.at(-1)!.weightVersion);
    w.add('f', 1, 'anchor', c.recentReleases.at(-1)!.weightVersion);
    const again = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await again.tick();
    expect(w.stepsRun.at(-1)).toBe('s:openclawrl:4');
  });

  it('batches judged turns, trains each batch once, releases it and writes one record line per batch', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    ['a', 'b', 'c', 'd', 'e'].forEach((id, i) => w.add(id, i % 2 ? -1 : 1));
    w.add('x', 0, 'dropped');
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1', 's:openclawrl:2']);
    expect(w.published).toEqual(['v1', 'v2']);
    expect(c.recentReleases.map((r) => [r.weightVersion, r.parent, r.batchIds])).toEqual([['v1', null, ['s:openclawrl:1']], ['v2', 'v1', ['s:openclawrl:2']]]);
    const lines = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.batch_id, l.samples, l.rewards])).toEqual([['s:openclawrl:1', 2, { '1': 1, '-1': 1, '0': 0 }], ['s:openclawrl:2', 2, { '1': 1, '-1': 1, '0': 0 }]]);
    expect(w.durable.offset).toBe(7);
  });

  it('after a crash between a step and its commit, retrains nothing and releases the batch once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    await killedAfterStep(w, dir);
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
    // The new controller starts the group afresh; the batch comes back from the trainer's ledger,
    // untrained by this group, so its checkpoint is loaded before it is published.
    expect(w.calls).toEqual(['restart:base', 'step:s:openclawrl:1', 'restart:base', 'step:s:openclawrl:1', 'load:v1']);
    expect(c2.recentReleases.map((r) => r.batchIds[0])).toEqual(['s:openclawrl:1']);
    expect(readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n')).toHaveLength(1);
  });

  it('a new run (fresh data dir, same record file) writes its own lines, though its batch ids start at 1 again', async () => {
    const { dir } = await twoReleases();
    const w2 = world(dir);
    for (const id of ['e', 'f']) w2.add(id, -1);
    await new TrainerController(w2.ports, opts(dir), 0, null).tick();
    const lines = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.batch_id, l.rewards['-1']])).toEqual([['s:openclawrl:1', 0], ['s:openclawrl:2', 0], ['s:openclawrl:1', 2]]);
    expect(lines[2].run).not.toBe(lines[0].run);
    expect(lines[1].run).toBe(lines[0].run);
  });

  it('a crash between a release and its record line is healed when the controller starts again, once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('b', -1);
    // The release is saved; the process dies before the line is appended (here: it cannot be).
    mkdirSync(join(dir, 'prm.jsonl'));
    await expect(new TrainerController(w.ports, opts(dir), 0, null).tick()).rejects.toThrow();
    rmSync(join(dir, 'prm.jsonl'), { recursive: true });
    expect(w.durable.state!.recentReleases.map((r) => r.batchIds)).toEqual([['s:openclawrl:1']]);
    new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    const lines = readFileSync(join(dir, 'prm.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.batch_id, l.rewards])).toEqual([['s:openclawrl:1', { '1': 1, '-1': 1, '0': 0 }]]);
  });

  it('a restarted controller starts the trainer group from the last release, not from the base model', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    ['a', 'b', 'c', 'd'].forEach((id) => w.add(id, 1));
    const c1 = new TrainerController(w.ports, opts(dir), 0, null);
    await c1.tick();
    expect(c1.recentReleases.map((r) => r.weightVersion)).toEqual(['v1', 'v2']);
    ['e', 'f'].forEach((id) => w.add(id, 1, 'anchor', 'v2'));
    w.calls.length = 0;
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.calls).toEqual(['restart:v2', 'step:s:openclawrl:3']);
    expect(c2.recentReleases.at(-1)!.parent).toBe('v2');
  });

  it('restarts the trainer and retries the same batch when a rank dies', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('b', -1);
    w.failNext(2);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
    expect(c.counters.trainer_restarts).toBe(2);
  });

  it('leaves out a turn the trainer cannot take (a logprob the engine did not give, no output), not the batch it would join', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'nan', 'b', 'inf', 'empty']) w.add(id, 1);
    w.records.get('nan')!.logprobs = Float32Array.from([Number.NaN]);
    w.records.get('inf')!.logprobs = Float32Array.from([Number.NEGATIVE_INFINITY]);
    Object.assign(w.records.get('empty')!, { outputIds: new Int32Array(0), logprobs: new Float32Array(0), topkIds: new Int32Array(0), topkLogprobs: new Float32Array(0) });
    const sent = stepsSent(w);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(sent).toEqual([['a', 'b']]);
    expect(c.counters.untrainable).toBe(3);
    expect(c.deadLetters).toEqual([]);
  });

  it('leaves out a turn whose teacher prompt cannot be rendered, and trains the turns beside it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('bad', 1);
    w.add('c', 1);
    w.add('d', 1);
    for (const row of w.log) row.hints = ['use the list'];
    (w.records.get('bad')!.request.messages[0] as { content: string }).content = 'RAISE';
    // As the template raises: a plain Error, not a ReefError.
    w.ports.renderTeacher = async (messages) => {
      if (JSON.stringify(messages).includes('RAISE')) throw new Error('template raised: unsupported role');
      return Int32Array.from([9]);
    };
    const sent = stepsSent(w);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    await c.tick();
    expect(sent).toEqual([['a'], ['c', 'd']]);
    expect(c.counters.untrainable).toBe(1);
    expect(c.deadLetters).toEqual([]);
    expect(w.durable.state?.pending).toEqual([]);
  });

  it('drops turns generated more than max_staleness releases back', async () => {
    const { w, c } = await twoReleases();
    expect(c.currentVersion).toBe('v2');
    w.add('old', 1, 'anchor', null);
    w.add('new', 1, 'anchor', 'v2');
    await c.tick();
    expect(c.counters.stale).toBe(1);
  });

  it('checks staleness again when a batch trains: a backlog read in one tick does not train turns that went stale meanwhile', async () => {
    const { dir, w, c } = await twoReleases();
    expect(c.currentVersion).toBe('v2');
    const samples = c.counters.samples ?? 0;
    // Read together, all fresh (v2 current, v1 one behind): three batches of two.
    for (const [id, wv] of [['t1', 'v2'], ['t2', 'v2'], ['t3', 'v2'], ['t4', 'v1'], ['t5', 'v2'], ['t6', 'v2']] as const) w.add(id, 1, 'anchor', wv);
    await c.tick();
    // Batch 3 trained on v3: v2 still one behind. Batch 4 kept t3 (v2) and lost t4 (v1, now two
    // behind). Batch 5's turns were two behind v4 by its turn: not trained at all.
    expect(w.stepsRun.slice(-2)).toEqual(['s:openclawrl:3', 's:openclawrl:4']);
    expect(c.currentVersion).toBe('v4');
    expect(c.counters.stale).toBe(3);
    expect((c.counters.samples ?? 0) - samples).toBe(3);
    expect(w.durable.state!.pending).toEqual([]);
    // A controller restarted from what was persisted finds nothing left to train.
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.stepsRun.at(-1)).toBe('s:openclawrl:4');
  });

  it('says how to go on when the last release\'s checkpoint cannot be loaded, since every restart fails alike', async () => {
    const { dir, w } = await twoReleases();
    const logged: string[] = [];
    w.ports.log = (line) => logged.push(line);
    w.ports.trainer.restart = async (path) => {
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `checkpoint ${path}: incomplete metadata, file not fully covered` });
    };
    w.add('x', 1, 'anchor', 'v2');
    w.add('y', 1, 'anchor', 'v2');
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await expect(c2.tick()).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    expect(logged.filter((l) => l.startsWith("the last release's checkpoint"))).toEqual(
      Array(3).fill(`the last release's checkpoint ${join(dir, 'v2')} cannot be loaded, so training waits: roll back to an earlier release (POST /reef/scenarios/{scenario}/releases/rollback) to train on from it`));
    // The batch waits in pending, not dead-lettered: the checkpoint, not the batch, is at fault.
    expect(c2.deadLetters).toEqual([]);
  });

  it('puts the current release back into an engine that came up with the base weights, and trains on', async () => {
    const { dir, w } = await twoReleases();
    expect(w.published).toEqual(['v1', 'v2']);
    // reef down / reef up on the same data dir, or a shim restart: the engine starts from the base.
    w.restartEngine();
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect([w.published.at(-1), w.publishedKinds.at(-1)]).toEqual(['v2', 'restore']);
    expect(c2.counters.engine_restores).toBe(1);
    // Turns the restored engine samples are fresh, and train.
    w.add('e', 1, 'anchor', 'v2');
    w.add('f', 1, 'anchor', 'v2');
    await c2.tick();
    expect(c2.currentVersion).toBe('v3');
    expect(c2.counters.stale ?? 0).toBe(0);
    // Asked again each check, nothing to do while the engine serves the current release.
    await c2.tick();
    expect(c2.counters.engine_restores).toBe(1);
    // An engine that cannot be asked is left alone until it can; one that reports no version too.
    w.setEngineDown(true);
    await c2.tick();
    w.setEngineDown(false);
    w.setServed(null);
    await c2.tick();
    await c2.tick();
    expect(c2.counters.engine_restores).toBe(1);
  });

  it('drops turns of weights a rollback put aside, however recent', async () => {
    const { w, c } = await twoReleases();
    expect(c.currentVersion).toBe('v2');
    await c.rollback(null);
    expect(c.currentVersion).toBe('v1');
    w.add('e', 1, 'anchor', 'v1');
    w.add('f', 1, 'anchor', 'v1');
    await c.tick();
    expect(c.recentReleases.map((r) => [r.weightVersion, r.parent])).toEqual([['v1', null], ['v2', 'v1'], ['v1', 'v2'], ['v3', 'v1']]);
    // v2 is one release number from v3, but v3 was trained from v1: v2's weights were put aside.
    w.add('put-aside', 1, 'anchor', 'v2');
    w.add('served', 1, 'anchor', 'v1');
    await c.tick();
    expect(c.counters.stale ?? 0).toBe(1);
    // Base is two steps back along the lineage (v3, v1, base): past max_staleness 1.
    w.add('base', 1, 'anchor', null);
    await c.tick();
    expect(c.counters.stale).toBe(2);
  });

  it('rolls back to the previous release and to the base model', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    mkdirSync(join(dir, 'base'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    const back = await c.rollback(null, 'aaaa0001');
    expect([back.weightVersion, back.rollbackOf, back.parent, back.sync, back.keyId]).toEqual(['v1', 'release-1', 'v2', 'disk', 'aaaa0001']);
    expect(w.published.at(-1)).toBe('v1');
    const base = await c.rollback('base', 'bbbb0002');
    expect([base.weightVersion, base.keyId]).toEqual(['base', 'bbbb0002']);
    // Who asked is kept with the release; a trained release was asked for by no key.
    expect(c.recentReleases.map((r) => r.keyId)).toEqual([null, null, 'aaaa0001', 'bbbb0002']);
    await expect(c.rollback('release-99')).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
  });

  it('records which weight sync each release used and counts the fallbacks to disk', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd', 'e', 'f']) w.add(id, 1);
    w.pushFails(1);
    // A backlog of base turns, three batches deep: staleness must allow it to train whole.
    const c = new TrainerController(w.ports, { ...opts(dir), maxStaleness: 3 }, 0, null);
    await c.tick();
    expect(c.recentReleases.map((r) => [r.weightVersion, r.sync])).toEqual([['v1', 'disk'], ['v2', 'distributed'], ['v3', 'distributed']]);
    expect(c.counters).toMatchObject({ weight_sync_disk: 1, weight_sync_distributed: 2, weight_sync_fallbacks: 1 });
    expect(w.durable.state!.recentReleases.map((r) => r.sync)).toEqual(['disk', 'distributed', 'distributed']);
  });

  it('counts the teacher candidates the trainer left out as too long', async () => {
    const { dir, w } = twoBatchesWithMetrics({ teacher_candidates_overlong: 2 });
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(c.counters.teacher_candidates_overlong).toBe(4);
  });

  it('warns when the first batch, trained on the weights that sampled it, scores other logprobs than the engine reported', async () => {
    // As with SGLang's untruncated logprobs scored by the truncated distribution: log(kept mass).
    const { dir, w } = twoBatchesWithMetrics({ train_rollout_logprob_abs_diff: 0.105 });
    const logged: string[] = [];
    w.ports.log = (line) => logged.push(line);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    // Only the first batch says anything: later ones hold turns of older weights.
    expect(c.counters.logprob_mismatch_warnings).toBe(1);
    expect(logged.filter((l) => l.startsWith('warning:'))).toEqual([expect.stringMatching(/s:openclawrl:1, the first.*differ from the engine's by 0\.105.*training\.engine_logprobs/)]);
  });

  it('keeps only the newest checkpoints on disk', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (let i = 0; i < 8; i++) w.add(`r${i}`, 1);
    const c = new TrainerController(w.ports, { ...opts(dir), maxStaleness: 4 }, 0, null);
    await c.tick();
    expect(c.recentReleases.map((r) => existsSync(r.checkpointPath))).toEqual([false, false, true, true]);
  });

  it('deletes a checkpoint only once the commit that stops keeping it has returned (an earlier delete could leave the durable release without its checkpoint)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (let i = 0; i < 8; i++) w.add(`r${i}`, 1);
    const missing: string[] = [];
    const commit = w.ports.commit;
    w.ports.commit = async (offset, state, rows) => {
      // While this commit is under way, what the last committed state keeps must still be on disk.
      for (const r of w.durable.state?.recentReleases.slice(-2) ?? []) if (!existsSync(r.checkpointPath)) missing.push(r.checkpointPath);
      await commit(offset, state, rows);
    };
    const c = new TrainerController(w.ports, { ...opts(dir), maxStaleness: 4 }, 0, null);
    await c.tick();
    expect(c.recentReleases).toHaveLength(4);
    expect(missing).toEqual([]);
  });
  it('dead-letters a batch the trainer rejects as invalid, persists it, and trains the batches after it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    w.failBatch('s:openclawrl:1', () => new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'trainer-step.tasks[1]: 114 tokens exceed the model\'s context length 100' }));
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    // Asked once: the same batch fails the same way every time.
    expect(w.calls.filter((x) => x === 'step:s:openclawrl:1')).toHaveLength(1);
    expect(w.stepsRun).toEqual(['s:openclawrl:2']);
    expect(c.recentReleases.map((r) => r.batchIds)).toEqual([['s:openclawrl:2']]);
    expect(c.counters).toMatchObject({ dead_letters: 1, batches: 1 });
    expect(c.deadLetters.map((d) => [d.batch.batchId, d.code, d.attempts])).toEqual([['s:openclawrl:1', 'REEF_ERR_INVALID_ARGUMENT', 1]]);
    expect(c.deadLetters[0]!.message).toContain('exceed the model\'s context length');
    expect(w.durable.state!.pending).toEqual([]);
    expect(w.durable.state!.deadLetters.map((d) => [d.batch.batchId, d.batch.tasks.map((t) => t.turnRecordId)])).toEqual([['s:openclawrl:1', ['a', 'b']]]);
    // A restarted controller does not take it up again.
    w.calls.length = 0;
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.calls).toEqual([]);
    expect(c2.deadLetters).toHaveLength(1);
  });

  it('dead-letters a batch whose loss stays non-finite after the restarts, and trains on from the last release', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd', 'e', 'f']) w.add(id, 1);
    w.failBatch('s:openclawrl:2', () => new ReefError('REEF_ERR_TRAINER', { reason: 'batch s:openclawrl:2: non-finite loss: the batch was not applied' }));
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await c.tick();
    expect(w.calls).toEqual([
      'restart:base', 'step:s:openclawrl:1',
      'step:s:openclawrl:2', 'restart:v1', 'step:s:openclawrl:2', 'restart:v1', 'step:s:openclawrl:2',
      'restart:v1', 'step:s:openclawrl:3',
    ]);
    expect(w.trainedOn).toEqual(['s:openclawrl:1@base', 's:openclawrl:3@v1']);
    expect(c.recentReleases.map((r) => [r.weightVersion, r.parent, r.batchIds])).toEqual([['v1', null, ['s:openclawrl:1']], ['v2', 'v1', ['s:openclawrl:3']]]);
    expect(c.deadLetters.map((d) => [d.batch.batchId, d.code, d.attempts])).toEqual([['s:openclawrl:2', 'REEF_ERR_TRAINER', 3]]);
    expect(c.counters).toMatchObject({ dead_letters: 1, trainer_restarts: 2 });
  });

  it('a turn whose record is gone (deleted on request) is left out of its batch, which trains on the rest, instead of failing every tick or dead-lettering the other turns', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    const noted: [string, string[]][] = [];
    w.ports.noteBatchTurns = async (b, _s, turns) => void noted.push([b, turns]);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    const getRecord = w.ports.getRecord;
    // Present when the batch formed, gone when it is trained.
    w.ports.getRecord = async (id) => (id === 'b' && w.durable.state !== null ? null : getRecord(id));
    await c.tick();
    expect(c.deadLetters).toEqual([]);
    expect(w.stepsRun).toEqual(['s:openclawrl:1', 's:openclawrl:2']);
    expect(c.counters).toMatchObject({ turns_deleted: 1 });
    // Lineage is noted before each step, with the turns it trains on.
    expect(noted).toEqual([['s:openclawrl:1', ['a']], ['s:openclawrl:2', ['c', 'd']]]);
  });

  it('forget drops deleted turns from the unbatched tasks and the batches formed but not trained, and saves that', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c']) w.add(id, 1);
    w.failNext(1_000_000);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await expect(c.tick()).rejects.toThrow();
    // Batch 1 (a, b) waits for a trainer that is down; c waits unbatched.
    expect(w.durable.state!.pending.map((b) => b.tasks.map((t) => t.turnRecordId))).toEqual([['a', 'b']]);
    expect(await c.forget(['b', 'c', 'zz'])).toBe(2);
    expect(w.durable.state!.pending.map((b) => b.tasks.map((t) => t.turnRecordId))).toEqual([['a']]);
    expect(Object.values(w.durable.state!.batcher.pending).flat()).toEqual([]);
    expect(await c.forget(['a'])).toBe(1);
    expect(w.durable.state!.pending).toEqual([]);
    expect(await c.forget(['a'])).toBe(0);
  });

  it('stops reading judged turns while MAX_PENDING_BATCHES wait (a trainer down for good), and reads on where it stopped once they train', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    const turns = 2 * (MAX_PENDING_BATCHES + 10);
    for (let i = 0; i < turns; i++) w.add(`t${i}`, 1);
    w.failNext(1_000_000);
    // Stale-free whatever trains first: the turns wait behind many releases.
    const c = new TrainerController(w.ports, { ...opts(dir), maxStaleness: 1000 }, 0, null);
    await expect(c.tick()).rejects.toThrow('rank 1 died');
    expect(w.durable.state!.pending).toHaveLength(MAX_PENDING_BATCHES);
    expect(w.durable.offset).toBe(2 * MAX_PENDING_BATCHES + 1);
    await expect(c.tick()).rejects.toThrow('rank 1 died');
    expect(w.durable.state!.pending).toHaveLength(MAX_PENDING_BATCHES);
    // The trainer is back: every turn trains, each in one batch.
    w.failNext(0);
    for (let i = 0; i < 4 && w.stepsRun.length < turns / 2; i++) await c.tick();
    expect(w.stepsRun).toHaveLength(turns / 2);
    expect(new Set(c.recentReleases.flatMap((r) => r.batchIds)).size).toBe(turns / 2);
    expect(w.durable.state!.pending).toEqual([]);
  });

  it('keeps only the newest MAX_DEAD_LETTERS dead letters in its state, and counts them all', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    const batches = MAX_DEAD_LETTERS + 5;
    for (let i = 0; i < 2 * batches; i++) w.add(`t${i}`, 1);
    for (let b = 1; b <= batches; b++) w.failBatch(`s:openclawrl:${b}`, () => new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'too long' }));
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    for (let i = 0; i < 10 && w.durable.offset <= 2 * batches; i++) await c.tick();
    expect(c.counters).toMatchObject({ dead_letters: batches });
    expect(w.durable.state!.deadLetters.map((d) => d.batch.batchId)).toEqual(Array.from({ length: MAX_DEAD_LETTERS }, (_, i) => `s:openclawrl:${i + 6}`));
  });

  it('keeps a batch pending when the trainer is down for good: that is no verdict on the batch', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('b', 1);
    w.failNext(3);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    await expect(c.tick()).rejects.toThrow('rank 1 died');
    expect(c.deadLetters).toEqual([]);
    expect(w.durable.state!.pending.map((b) => b.batchId)).toEqual(['s:openclawrl:1']);
    await c.tick();
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
  });

  it('a restart that fails leaves the group not ready: the next step restarts it from the last release, not on base weights', async () => {
    const { w, c } = await twoReleases();
    expect(c.currentVersion).toBe('v2');
    // The next batch's step fails, and so does every restart (trainer-start ok, trainer-load failed) this tick.
    w.add('e', 1, 'anchor', 'v2');
    w.add('f', 1, 'anchor', 'v2');
    w.failNext(1);
    w.restartFails(2);
    await expect(c.tick()).rejects.toThrow();
    expect(w.holds).toBe('base');
    w.calls.length = 0;
    await c.tick();
    expect(w.calls).toEqual(['restart:v2', 'step:s:openclawrl:3']);
    expect(w.trainedOn.at(-1)).toBe('s:openclawrl:3@v2');
  });

  it('a release whose publish failed and broke the group: the next tick restarts it and releases the batch from the trainer ledger', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    w.add('a', 1);
    w.add('b', 1);
    const c = new TrainerController(w.ports, opts(dir), 0, null);
    // The release's publish fails and takes a rank with it.
    const publish = w.ports.publish;
    w.ports.publish = async () => {
      w.ports.publish = publish;
      w.breakGroup();
      throw new Error('push broke a rank');
    };
    await expect(c.tick()).rejects.toThrow('push broke a rank');
    w.calls.length = 0;
    await c.tick();
    expect(w.calls).toEqual(['restart:base', 'step:s:openclawrl:1', 'load:v1']);
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
    expect(c.recentReleases.map((r) => r.weightVersion)).toEqual(['v1']);
  });

  it('a batch found in the trainer ledger whose load fails is retried with a restart, not given up on', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    await killedAfterStep(w, dir);
    w.calls.length = 0;
    w.loadFails(1);
    const c2 = new TrainerController(w.ports, opts(dir), w.durable.offset, w.durable.state);
    await c2.tick();
    expect(w.calls).toEqual(['restart:base', 'step:s:openclawrl:1', 'load:v1', 'restart:base', 'step:s:openclawrl:1', 'load:v1']);
    expect(w.stepsRun).toEqual(['s:openclawrl:1']);
    expect(c2.recentReleases.map((r) => r.weightVersion)).toEqual(['v1']);
    expect(c2.counters.trainer_restarts).toBe(1);
  });

  it('a rollback asked during a step waits for its release: engine, trainer and lineage agree', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'tc-'));
    const w = world(dir);
    for (const id of ['a', 'b', 'c', 'd']) w.add(id, 1);
    const c = new TrainerController(w.ports, { ...opts(dir), keepCheckpoints: 5 }, 0, null);
    await c.tick();
    w.add('e', 1, 'anchor', 'v2');
    w.add('f', 1, 'anchor', 'v2');
    const step3 = w.hold('s:openclawrl:3');
    const ticking = c.tick();
    await step3.entered;
    // The operator asks for the release before the current one (v2): v1.
    const back = c.rollback(null);
    await Promise.resolve();
    expect(w.calls.at(-1)).toBe('step:s:openclawrl:3');
    step3.release();
    const [, rb] = await Promise.all([ticking, back]);
    expect(w.calls.slice(-2)).toEqual(['step:s:openclawrl:3', 'load:v1']);
    expect(w.published).toEqual(['v1', 'v2', 'v3', 'v1']);
    expect(w.holds).toBe('v1');
    expect(c.recentReleases.map((r) => [r.weightVersion, r.parent, r.rollbackOf])).toEqual([['v1', null, null], ['v2', 'v1', null], ['v3', 'v2', null], ['v1', 'v3', 'release-1']]);
    expect(rb).toMatchObject({ id: 'release-4', weightVersion: 'v1', parent: 'v3' });
    // The next batch trains on top of the rollback.
    w.add('g', 1, 'anchor', 'v1');
    w.add('h', 1, 'anchor', 'v1');
    await c.tick();
    expect(w.trainedOn.at(-1)).toBe('s:openclawrl:4@v1');
    expect(c.recentReleases.at(-1)!.parent).toBe('v1');
  });

  it('a batch stepped but not released when a rollback came trains on the rollback, which stays in effect', async () => {
    const { w, c } = await twoReleases();
    w.add('e', 1, 'anchor', 'v1');
    w.add('f', 1, 'anchor', 'v1');
    const publish = w.ports.publish;
    w.ports.publish = async () => {
      w.ports.publish = publish;
      throw new Error('engine gone');
    };
    await expect(c.tick()).rejects.toThrow('engine gone');
    expect(w.trainedOn.at(-1)).toBe('s:openclawrl:3@v2');
    w.calls.length = 0;
    const rb = await c.rollback('release-1');
    expect(rb.weightVersion).toBe('v1');
    await c.tick();
    // Answered from the ledger, v3 (trained from v2) went out as the rollback's child.
    expect(w.calls).toEqual(['restart:v1', 'step:s:openclawrl:3']);
    expect(w.trainedOn.at(-1)).toBe('s:openclawrl:3@v1');
    expect(c.recentReleases.map((r) => [r.weightVersion, r.parent, r.rollbackOf])).toEqual([
      ['v1', null, null], ['v2', 'v1', null], ['v1', 'v2', 'release-1'], ['v4', 'v1', null],
    ]);
    expect(w.holds).toBe('v4');
  });

  it('a rollback after one that lost a rank restarts the group from its target, with no batch pending to restart it', async () => {
    const { w, c } = await twoReleases();
    w.breakGroup();
    await expect(c.rollback(null)).rejects.toThrow(/died/);
    w.calls.length = 0;
    const rb = await c.rollback(null);
    expect(w.calls).toEqual(['restart:v1']);
    expect(rb).toMatchObject({ weightVersion: 'v1', parent: 'v2', rollbackOf: 'release-1' });
    expect(w.holds).toBe('v1');
    // The group holds the last release: the next batch trains on it without another restart.
    w.add('e', 1, 'anchor', 'v1');
    w.add('f', 1, 'anchor', 'v1');
    w.calls.length = 0;
    await c.tick();
    expect(w.calls).toEqual(['step:s:openclawrl:3']);
    expect(w.trainedOn.at(-1)).toBe('s:openclawrl:3@v1');
  });

  it('a rollback whose publish fails leaves the group not ready: the next step restarts it from the last release', async () => {
    const { w, c } = await twoReleases();
    const publish = w.ports.publish;
    w.ports.publish = async (p, v, kind) => {
      if (kind === 'rollback') throw new Error('engine refused the reload');
      return publish(p, v, kind);
    };
    await expect(c.rollback(null)).rejects.toThrow('engine refused the reload');
    expect(w.holds).toBe('v1'); // the trainer took the rollback, the engine did not
    expect(c.recentReleases.map((r) => r.weightVersion)).toEqual(['v1', 'v2']);
    w.add('e', 1, 'anchor', 'v2');
    w.add('f', 1, 'anchor', 'v2');
    w.calls.length = 0;
    await c.tick();
    expect(w.calls).toEqual(['restart:v2', 'step:s:openclawrl:3']);
    expect(w.trainedOn.at(-1)).toBe('s:openclawrl:3@v2');
  });
});
