import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { afterAll, expect, it } from 'vitest';
import { fetch, request } from 'undici';
import { WeightSender, type AnnouncedTensors } from './weight-sender.js';

/**
 * The engine conformance suite: what Reef relies on from an engine's HTTP API (docs/internals.md,
 * "Engine HTTP API"), checked the same way against the `hf` CPU engine and SGLang.
 *
 * Call it inside a `describe`; the target's fields are read when each test runs, so a `beforeAll`
 * may fill them in after starting the engine.
 */
export interface EngineTarget {
  /** e.g. `http://127.0.0.1:30000`, no trailing slash. */
  baseUrl: string;
  /** The checkpoint the engine serves; reloaded by the weight-update test. */
  modelPath: string;
}

export interface ConformanceOptions {
  /**
   * Also check the `hf` engine's extras: `max_context_length`/`vocab_size` in model_info, and an
   * input at the context length answered with 400.
   * @default false
   */
  hfExtras?: boolean;
  /**
   * Check SGLang's distributed weight update (`/init_weights_update_group`,
   * `/update_weights_from_distributed`, `/destroy_weights_update_group`) with the test as trainer
   * rank 0. Left out, those cases are not run.
   */
  weightSync?: WeightSyncOptions;
}

export interface WeightSyncOptions {
  /** Rank 0's backend: `gloo` sends CPU tensors; `nccl` sends CUDA tensors from a GPU that is not the engine's. */
  backend: 'gloo' | 'nccl';
  /** Interpreter (torch, safetensors) and environment of the rank-0 process. */
  python: string;
  env: NodeJS.ProcessEnv;
  /**
   * A transfer that breaks off leaves the weights that were serving. The hf engine promises this;
   * SGLang answers such a failure with "partially updated, discard the whole weights", and a dead
   * NCCL peer may hang it, so the case is only run where this is set.
   */
  atomic: boolean;
  /** The same weights, however they arrived, give bit-identical logprobs (a CPU engine in fp32). */
  exact: boolean;
}

type Json = Record<string, any>;

async function call(target: EngineTarget, method: 'GET' | 'POST', path: string, body?: unknown): Promise<{ status: number; json: Json | null }> {
  const res = await request(target.baseUrl + path, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, json: text ? (JSON.parse(text) as Json) : null };
}

async function generate(target: EngineTarget, body: Json): Promise<Json> {
  const { status, json } = await call(target, 'POST', '/generate', body);
  expect(status, JSON.stringify(json)).toBe(200);
  return json!;
}

/** The SSE events of a streamed /generate: parsed objects, then the literal `[DONE]`. */
async function generateStream(target: EngineTarget, body: Json): Promise<Array<Json | '[DONE]'>> {
  const res = await fetch(target.baseUrl + '/generate', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
  });
  expect(res.status).toBe(200);
  expect(res.headers.get('content-type') ?? '').toMatch(/^text\/event-stream/);
  const events: Array<Json | '[DONE]'> = [];
  let buffer = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(chunk, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const payload = line.slice(5).trim();
        events.push(payload === '[DONE]' ? '[DONE]' : (JSON.parse(payload) as Json));
      }
    }
  }
  return events;
}

const PROMPT_IDS = [10, 11, 12, 13, 14, 15, 16, 17];

function greedy(maxNewTokens: number, extra: Json = {}): Json {
  return { input_ids: PROMPT_IDS, sampling_params: { max_new_tokens: maxNewTokens, temperature: 0, ignore_eos: true, ...extra } };
}

function expectLogprobEntry(entry: unknown, id?: number): void {
  expect(Array.isArray(entry) && entry.length === 3).toBe(true);
  const [lp, tid, text] = entry as [unknown, unknown, unknown];
  expect(typeof lp).toBe('number');
  expect(lp as number).toBeLessThanOrEqual(1e-6);
  expect(Number.isInteger(tid)).toBe(true);
  if (id !== undefined) expect(tid).toBe(id);
  expect(text).toBeNull();
}

function expectReplyShape(r: Json, promptTokens: number | null): void {
  expect(typeof r.text).toBe('string');
  expect(Array.isArray(r.output_ids) && r.output_ids.every((x: unknown) => Number.isInteger(x))).toBe(true);
  const m = r.meta_info;
  expect(typeof m.id).toBe('string');
  expect(['stop', 'length', 'abort']).toContain(m.finish_reason.type);
  if (promptTokens !== null) expect(m.prompt_tokens).toBe(promptTokens);
  expect(m.completion_tokens).toBe(r.output_ids.length);
  expect(typeof m.weight_version).toBe('string');
}

export function engineConformance(target: EngineTarget, options: ConformanceOptions = {}): void {
  let initialVersion = '';

  it('answers /health with 200 and describes the model in /model_info', async () => {
    expect((await call(target, 'GET', '/health')).status).toBe(200);
    const { status, json } = await call(target, 'GET', '/model_info');
    expect(status).toBe(200);
    expect(typeof json!.model_path).toBe('string');
    expect(typeof json!.tokenizer_path).toBe('string');
    expect(json!.is_generation).toBe(true);
    expect(typeof json!.weight_version).toBe('string');
    initialVersion = json!.weight_version;
    if (options.hfExtras) {
      expect(Number.isInteger(json!.max_context_length) && json!.max_context_length > 0).toBe(true);
      expect(Number.isInteger(json!.vocab_size) && json!.vocab_size > Math.max(...PROMPT_IDS)).toBe(true);
    }
  });

  it('generates from input_ids and text; max_new_tokens ends with finish_reason length; greedy repeats', async () => {
    const a = await generate(target, { ...greedy(5), rid: 'conformance-a' });
    expectReplyShape(a, PROMPT_IDS.length);
    expect(a.output_ids).toHaveLength(5);
    expect(a.meta_info.finish_reason.type).toBe('length');
    expect(a.meta_info.finish_reason.matched ?? null).toBeNull();
    expect(a.meta_info.id).toBe('conformance-a');
    const b = await generate(target, greedy(5));
    expect(b.output_ids).toEqual(a.output_ids);
    expect(b.text).toBe(a.text);
    const t = await generate(target, { text: 'Hello there', sampling_params: { max_new_tokens: 3, temperature: 0.7, ignore_eos: true } });
    expectReplyShape(t, null);
    expect(t.output_ids).toHaveLength(3);
    expect(t.meta_info.prompt_tokens).toBeGreaterThan(0);
  });

  it('returns per-token logprobs and a sorted top-K that leads with the greedy token', async () => {
    const K = 4;
    const r = await generate(target, { ...greedy(6), return_logprob: true, top_logprobs_num: K });
    const m = r.meta_info;
    expect(m.output_token_logprobs).toHaveLength(r.output_ids.length);
    expect(m.output_top_logprobs).toHaveLength(r.output_ids.length);
    r.output_ids.forEach((id: number, t: number) => {
      expectLogprobEntry(m.output_token_logprobs[t], id);
      const row = m.output_top_logprobs[t] as unknown[][];
      expect(row).toHaveLength(K);
      row.forEach((e) => expectLogprobEntry(e));
      const values = row.map((e) => e[0] as number);
      expect(values).toEqual([...values].sort((x, y) => y - x));
      expect(row[0]![1]).toBe(id);
      expect(Math.abs((row[0]![0] as number) - m.output_token_logprobs[t][0])).toBeLessThan(1e-3);
    });
  });

  it('reports logprobs before top-k (SGLang\'s convention): at temperature 1 with top_k 1, those of the greedy run, all K finite', async () => {
    // At temperature 1, log_softmax(logits / T) is the greedy run's log_softmax(logits), and top_k 1
    // draws its argmax. The distribution sampled from (top_k 1, renormalised) would say 0 for every
    // token and the floor (-10000) for the other K-1 entries.
    const K = 4;
    const greedyRun = await generate(target, { ...greedy(6), return_logprob: true, top_logprobs_num: K });
    const topK1 = await generate(target, {
      input_ids: PROMPT_IDS, return_logprob: true, top_logprobs_num: K,
      sampling_params: { max_new_tokens: 6, temperature: 1, top_k: 1, ignore_eos: true, sampling_seed: 1 },
    });
    expect(topK1.output_ids).toEqual(greedyRun.output_ids);
    const g = greedyRun.meta_info;
    const m = topK1.meta_info;
    topK1.output_ids.forEach((id: number, t: number) => {
      expectLogprobEntry(m.output_token_logprobs[t], id);
      expect(Math.abs(m.output_token_logprobs[t][0] - g.output_token_logprobs[t][0])).toBeLessThan(1e-3);
      const row = m.output_top_logprobs[t] as Array<[number, number, null]>;
      expect(row).toHaveLength(K);
      expect(row.every(([lp]) => lp > -1000)).toBe(true);
      expect(row.map(([, tid]) => tid)).toEqual((g.output_top_logprobs[t] as Array<[number, number, null]>).map(([, tid]) => tid));
    });
    expect(Math.min(...m.output_token_logprobs.map((e: number[]) => e[0]))).toBeLessThan(-1e-4);
  });

  it('stops on stop_token_ids with matched = the token id, the token kept in output_ids', async () => {
    const first = await generate(target, greedy(4));
    const stopId = first.output_ids[0] as number;
    const r = await generate(target, greedy(4, { stop_token_ids: [stopId], ignore_eos: false }));
    expect(r.meta_info.finish_reason.type).toBe('stop');
    expect(r.meta_info.finish_reason.matched).toBe(stopId);
    expect(r.output_ids).toEqual([stopId]);
  });

  // SGLang 0.5.23 `update_finish_state` (srt/managers/schedule_batch.py:2007-2044): the stop string,
  // then the stop token, then the length; up to 0.5.16 the length came first.
  it('checks stop tokens before max_new_tokens: a stop token that is the last token allowed ends with stop', async () => {
    const first = await generate(target, greedy(4));
    const stopId = first.output_ids[0] as number;
    const last = await generate(target, greedy(1, { stop_token_ids: [stopId], ignore_eos: false }));
    expect(last.output_ids).toEqual([stopId]);
    expect(last.meta_info.finish_reason).toMatchObject({ type: 'stop', matched: stopId });
  });

  it('checks stop strings before max_new_tokens too: one completed by the last token allowed is matched and cut', async () => {
    const two = await generate(target, greedy(2));
    const three = await generate(target, greedy(3));
    const stop = three.text as string;
    expect(stop.length).toBeGreaterThan((two.text as string).length); // the third token completes it
    const atBudget = await generate(target, greedy(3, { stop: [stop] }));
    expect(atBudget.meta_info.finish_reason).toMatchObject({ type: 'stop', matched: stop });
    expect(atBudget.output_ids).toEqual(three.output_ids);
    expect(atBudget.text).toBe('');
    const within = await generate(target, greedy(4, { stop: [stop] }));
    expect(within.meta_info.finish_reason).toMatchObject({ type: 'stop', matched: stop });
    expect(within.output_ids).toEqual(three.output_ids);
    expect(within.text).toBe('');
  });

  it('turns stop_token_ids off with ignore_eos, as it does the eos ids', async () => {
    const first = await generate(target, greedy(4));
    const ignored = await generate(target, greedy(4, { stop_token_ids: [first.output_ids[0] as number] }));
    expect(ignored.output_ids).toEqual(first.output_ids);
    expect(ignored.meta_info.finish_reason.type).toBe('length');
  });

  it('streams cumulative SSE events that end like the non-stream reply, then [DONE]', async () => {
    const body = { ...greedy(6), return_logprob: true, top_logprobs_num: 2 };
    const plain = await generate(target, body);
    const events = await generateStream(target, body);
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1) as Json[];
    expect(chunks.length).toBeGreaterThanOrEqual(2);
    expect(chunks.includes('[DONE]' as never)).toBe(false);
    for (let i = 0; i < chunks.length; i++) {
      const c = chunks[i]!;
      expect(c.output_ids.length).toBeGreaterThan(0);
      if (i > 0) expect(c.output_ids.slice(0, chunks[i - 1]!.output_ids.length)).toEqual(chunks[i - 1]!.output_ids);
      if (i < chunks.length - 1) expect(c.meta_info.finish_reason).toBeNull();
    }
    const last = chunks.at(-1)!;
    expectReplyShape(last, PROMPT_IDS.length);
    expect(last.output_ids).toEqual(plain.output_ids);
    expect(last.text).toBe(plain.text);
    expect(last.meta_info.finish_reason.type).toBe('length');
    expect(last.meta_info.output_token_logprobs).toHaveLength(plain.output_ids.length);
    expect(last.meta_info.output_top_logprobs).toHaveLength(plain.output_ids.length);
  });

  it('reloads weights from disk under a new weight_version and rejects a bad path with 400', async () => {
    const before = await generate(target, greedy(4));
    const ok = await call(target, 'POST', '/update_weights_from_disk', { model_path: target.modelPath, weight_version: 'conformance-2' });
    expect(ok.status).toBe(200);
    expect(ok.json).toMatchObject({ success: true });
    expect(typeof ok.json!.message).toBe('string');
    // SGLang answers {success, message, num_paused_requests}; the version is read from /model_info.
    if (options.hfExtras) expect(ok.json!.weight_version).toBe('conformance-2');
    expect((await call(target, 'GET', '/model_info')).json!.weight_version).toBe('conformance-2');
    const after = await generate(target, greedy(4));
    expect(after.meta_info.weight_version).toBe('conformance-2');
    expect(after.output_ids).toEqual(before.output_ids);
    const bad = await call(target, 'POST', '/update_weights_from_disk', { model_path: '/nonexistent/reef-model', weight_version: 'never' });
    expect(bad.status).toBe(400);
    expect(bad.json!.success).toBe(false);
    expect(typeof bad.json!.message).toBe('string');
    const back = await call(target, 'POST', '/update_weights_from_disk', { model_path: target.modelPath, weight_version: initialVersion || 'default' });
    expect(back.status).toBe(200);
  });

  it('holds new requests while paused, answers /health, and serves them after continue', async () => {
    expect((await call(target, 'POST', '/pause_generation', {})).status).toBe(200);
    let settled = false;
    const pending = generate(target, greedy(2)).finally(() => { settled = true; });
    try {
      expect((await call(target, 'GET', '/health')).status).toBe(200);
      // Not a timing assertion: whatever the speed, a paused engine must not have answered yet.
      await new Promise((resolve) => setTimeout(resolve, 750));
      expect(settled).toBe(false);
    } finally {
      expect((await call(target, 'POST', '/continue_generation', {})).status).toBe(200);
    }
    const r = await pending;
    expect(r.output_ids).toHaveLength(2);
    // SGLang answers /flush_cache in plain text, not JSON.
    const flushed = await request(target.baseUrl + '/flush_cache', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(flushed.statusCode).toBe(200);
    expect(await flushed.body.text()).toMatch(/^Cache flushed/);
  });

  if (options.weightSync) weightSyncCases(target, options.weightSync, () => initialVersion);

  if (options.hfExtras) {
    it('rejects an input at the context length with 400 and a JSON error', async () => {
      const info = (await call(target, 'GET', '/model_info')).json!;
      const { status, json } = await call(target, 'POST', '/generate', { input_ids: new Array(info.max_context_length).fill(10) });
      expect(status).toBe(400);
      expect(typeof json!.error.message).toBe('string');
    });
  }
}

const WEIGHT_PROBE = { ...greedy(6), return_logprob: true, top_logprobs_num: 4 };

interface Outputs {
  ids: number[];
  logprobs: number[];
  top: unknown[];
}

function outputsOf(r: Json): Outputs {
  return { ids: r.output_ids, logprobs: r.meta_info.output_token_logprobs.map((e: unknown[]) => e[0]), top: r.meta_info.output_top_logprobs };
}

function maxLogprobGap(a: Outputs, b: Outputs): number {
  return Math.max(...a.logprobs.map((x, i) => Math.abs(x - (b.logprobs[i] ?? Infinity))));
}

/** The same weights served: bit for bit where the engine is exact, else the same tokens and near logprobs. */
function expectSameOutputs(actual: Json, expected: Json, exact: boolean): void {
  const a = outputsOf(actual);
  const b = outputsOf(expected);
  if (exact) {
    expect(a).toEqual(b);
    return;
  }
  expect(a.ids).toEqual(b.ids);
  expect(maxLogprobGap(a, b)).toBeLessThan(1e-2);
}

/** Other weights served: any difference where the engine is exact, else one well above its run-to-run noise. */
function expectOtherOutputs(actual: Json, expected: Json, exact: boolean): void {
  const a = outputsOf(actual);
  const b = outputsOf(expected);
  if (exact) {
    expect(a).not.toEqual(b);
    return;
  }
  expect(a.ids.join(',') !== b.ids.join(',') || maxLogprobGap(a, b) > 0.05).toBe(true);
}

/** The engine's workers that join a weight group: SGLang's TP size, 1 for an engine without /server_info. */
async function engineRanks(target: EngineTarget): Promise<number> {
  const res = await request(`${target.baseUrl}/server_info`);
  const text = await res.body.text();
  if (res.statusCode !== 200) return 1;
  const tp = (JSON.parse(text) as Json).tp_size;
  return Number.isInteger(tp) && tp > 0 ? tp : 1;
}

function weightSyncCases(target: EngineTarget, ws: WeightSyncOptions, initialVersion: () => string): void {
  // One rank-0 process for all cases (torch takes seconds to import); a case that kills it gets a new one.
  let sender: WeightSender | null = null;
  let tensors: AnnouncedTensors | null = null;
  let checkpoint: string | null = null;
  const rank0 = async (): Promise<{ s: WeightSender; t: AnnouncedTensors }> => {
    if (!sender?.alive) {
      checkpoint ??= mkdtempSync(join(tmpdir(), 'reef-conformance-weights-'));
      ({ sender, tensors } = await WeightSender.start({ python: ws.python, env: ws.env, modelPath: target.modelPath, checkpoint, backend: ws.backend }));
    }
    return { s: sender!, t: tensors! };
  };
  afterAll(async () => {
    await sender?.kill();
    if (checkpoint) rmSync(checkpoint, { recursive: true, force: true });
  });

  /** Hosts a new group as rank 0 and has the engine join it; returns the group's name. */
  const joinGroup = async (s: WeightSender): Promise<string> => {
    const group = `conformance-${randomUUID().slice(0, 8)}`;
    const worldSize = 1 + (await engineRanks(target));
    const { masterAddress, masterPort } = await s.listen(worldSize, group);
    const init = await call(target, 'POST', '/init_weights_update_group', {
      master_address: masterAddress, master_port: masterPort, rank_offset: 1, world_size: worldSize, group_name: group, backend: ws.backend,
    });
    expect(init.status, JSON.stringify(init.json)).toBe(200);
    expect(init.json).toMatchObject({ success: true });
    expect(typeof init.json!.message).toBe('string');
    await s.joined();
    return group;
  };

  const update = (group: string, t: AnnouncedTensors, version: string) =>
    call(target, 'POST', '/update_weights_from_distributed', { names: t.names, dtypes: t.dtypes, shapes: t.shapes, group_name: group, flush_cache: true, weight_version: version });
  /** Opens (`begin`) or closes (`end`) the engine's update session and expects it to succeed. */
  const session = async (which: 'begin' | 'end') => {
    const r = await call(target, 'POST', `/${which}_weight_update`, {});
    expect(r.status, JSON.stringify(r.json)).toBe(200);
    expect(r.json).toMatchObject({ success: true });
  };

  // SGLang 0.5.23, srt/managers/scheduler_components/weight_updater.py:187-198 and 309-335.
  it('refuses an update outside a session, a second begin and an end with no session, before any broadcast', async () => {
    const { s, t } = await rank0();
    const version = (await call(target, 'GET', '/model_info')).json!.weight_version as string;
    const group = await joinGroup(s);
    const outside = await update(group, t, 'conformance-outside');
    expect(outside.status).toBe(400);
    expect(outside.json).toMatchObject({ success: false });
    expect(outside.json!.message).toContain('begin_weight_update');
    await session('begin');
    const twice = await call(target, 'POST', '/begin_weight_update', {});
    expect(twice.status).toBe(400);
    expect(twice.json!.message).toContain('already open');
    await session('end');
    const none = await call(target, 'POST', '/end_weight_update', {});
    expect(none.status).toBe(400);
    expect(none.json!.message).toContain('no weight-update session');
    expect((await call(target, 'GET', '/model_info')).json!.weight_version).toBe(version);
    await call(target, 'POST', '/destroy_weights_update_group', { group_name: group });
    await s.leave();
  });

  it('refuses to destroy a weight group it never joined, with success false and a message', async () => {
    const r = await call(target, 'POST', '/destroy_weights_update_group', { group_name: `never-joined-${randomUUID().slice(0, 8)}` });
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ success: false });
    expect(typeof r.json!.message).toBe('string');
  });

  it('takes changed weights over a weight group, serving exactly what a disk load of them serves, then leaves the group', async () => {
    const { s, t } = await rank0();
    const before = await generate(target, WEIGHT_PROBE);
    const group = await joinGroup(s);

    await session('begin');
    const sent = s.send();
    sent.catch(() => {}); // awaited below, once the engine's answer says whether it can come
    const r = await update(group, t, 'conformance-pushed');
    expect(r.status, JSON.stringify(r.json)).toBe(200);
    expect(r.json).toMatchObject({ success: true });
    expect(typeof r.json!.message).toBe('string');
    expect(await sent).toBe(t.names.length);
    await session('end');
    expect((await call(target, 'GET', '/model_info')).json!.weight_version).toBe('conformance-pushed');
    const pushed = await generate(target, WEIGHT_PROBE);
    expect(pushed.meta_info.weight_version).toBe('conformance-pushed');
    expectOtherOutputs(pushed, before, ws.exact);

    const destroyed = await call(target, 'POST', '/destroy_weights_update_group', { group_name: group });
    expect(destroyed.status, JSON.stringify(destroyed.json)).toBe(200);
    expect(destroyed.json).toMatchObject({ success: true });
    expect(typeof destroyed.json!.message).toBe('string');
    await s.leave();
    expect((await call(target, 'POST', '/destroy_weights_update_group', { group_name: group })).status).toBe(400);

    // The same tensors from disk serve the same outputs: nothing was lost, reordered or cast on the way.
    const disk = await call(target, 'POST', '/update_weights_from_disk', { model_path: s.checkpoint, weight_version: 'conformance-disk' });
    expect(disk.status, JSON.stringify(disk.json)).toBe(200);
    expectSameOutputs(await generate(target, WEIGHT_PROBE), pushed, ws.exact);

    const back = await call(target, 'POST', '/update_weights_from_disk', { model_path: target.modelPath, weight_version: initialVersion() || 'default' });
    expect(back.status, JSON.stringify(back.json)).toBe(200);
    expectSameOutputs(await generate(target, WEIGHT_PROBE), before, ws.exact);
  });

  if (ws.atomic) {
    it('keeps serving the old weights and version when rank 0 dies part-way through a transfer', async () => {
      const { s, t } = await rank0();
      expect(t.names.length).toBeGreaterThanOrEqual(2);
      const version = (await call(target, 'GET', '/model_info')).json!.weight_version as string;
      const before = await generate(target, WEIGHT_PROBE);
      const group = await joinGroup(s);

      await session('begin');
      const answer = update(group, t, 'conformance-broken');
      // Half the tensors arrive; then the sender is gone without a word, as a crashed trainer is.
      await s.send(Math.floor(t.names.length / 2));
      await s.kill();
      const r = await answer;
      expect(r.status, JSON.stringify(r.json)).toBe(400);
      expect(r.json).toMatchObject({ success: false });
      expect(typeof r.json!.message).toBe('string');
      await session('end'); // the session outlives the failed call; the next trainer's begin needs it closed

      expect((await call(target, 'GET', '/model_info')).json!.weight_version).toBe(version);
      const after = await generate(target, WEIGHT_PROBE);
      expect(after.meta_info.weight_version).toBe(version);
      expectSameOutputs(after, before, ws.exact);
      // Whatever is left of the group goes; the engine may already have dropped it.
      await call(target, 'POST', '/destroy_weights_update_group', { group_name: group });
    });
  }
}
