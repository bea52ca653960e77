import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startGateway, type Gateway } from '../../actors/gateway/index.js';
import { pythonBin, pythonEnv, tinyModelDir } from '../../cluster/paths.js';
import { startWithReadyLine, type EngineChild } from '../engine/launch.js';
import { ensureBuilt, postChat, readSse, testConfig } from './harness.js';

/**
 * The gateway in front of the real hf engine on the tiny model: what is recorded is exactly what
 * the engine generated for the recorded prompt (replayed with the same seed), streamed and not.
 */

describe('gateway on the hf engine', () => {
  let engine: EngineChild | null = null;
  let gw: Gateway;
  let dir: string;

  beforeAll(async () => {
    ensureBuilt();
    engine = await startWithReadyLine(pythonBin(), ['-m', 'reef_shim.engines.hf_server', '--model-path', tinyModelDir(), '--host', '127.0.0.1', '--port', '0', '--seed', '0', '--weight-version', 'hf-1'], pythonEnv(), 120_000);
    dir = mkdtempSync(join(tmpdir(), 'reef-gw-hf-'));
    gw = await startGateway({ config: await testConfig(dir), engineUrl: engine.baseUrl, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: 1 });
  });
  afterAll(async () => {
    await gw?.close();
    expect(await engine?.stop()).toBe(0);
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const request = { model: 'tiny', messages: [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Name three colours.' }], temperature: 1, max_tokens: 12, seed: 7 };

  it('records the engine output token for token: replaying the recorded prompt gives the recorded ids, logprobs and top-K', async () => {
    const res = await postChat(gw.url, request);
    expect(res.status).toBe(200);
    const body = (await res.json()) as any;
    const rec = (await gw.store.get(res.headers.get('x-reef-agent-record-id')!))!;
    expect(rec.weightVersion).toBe('hf-1');
    expect(rec.outputIds.length).toBeGreaterThan(0);
    expect(body.usage).toEqual({ prompt_tokens: rec.promptIds.length, completion_tokens: rec.outputIds.length, total_tokens: rec.promptIds.length + rec.outputIds.length });

    const replay = (await (await fetch(`${engine!.baseUrl}/generate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ input_ids: Array.from(rec.promptIds), sampling_params: { max_new_tokens: 12, temperature: 1, top_p: 1, sampling_seed: 7 }, return_logprob: true, top_logprobs_num: 4 }),
    })).json()) as any;
    expect(replay.meta_info.prompt_tokens).toBe(rec.promptIds.length);
    expect(Array.from(rec.outputIds)).toEqual(replay.output_ids);
    expect(Array.from(rec.logprobs)).toEqual(replay.meta_info.output_token_logprobs.map((e: number[]) => Math.fround(e[0]!)));
    const tops = replay.meta_info.output_top_logprobs as number[][][];
    expect(Array.from(rec.topkIds)).toEqual(tops.flatMap((row) => row.map((e) => e[1])));
    expect(Array.from(rec.topkLogprobs)).toEqual(tops.flatMap((row) => row.map((e) => Math.fround(e[0]!))));
    expect(rec.finishReason).toBe(replay.meta_info.finish_reason.type);
    expect(body.choices[0].finish_reason).toBe(replay.meta_info.finish_reason.type === 'length' ? 'length' : 'stop');
  });

  it('a streamed completion records the same tokens as the non-streamed one for the same seed', async () => {
    const plain = await postChat(gw.url, request);
    const plainRec = (await gw.store.get(plain.headers.get('x-reef-agent-record-id')!))!;
    const events = await readSse(await postChat(gw.url, { ...request, stream: true, stream_options: { include_usage: true } }));
    expect(events.at(-1)).toBe('[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
    const rec = (await gw.store.get(chunks.at(-1).reef.agent_record_id))!;
    expect(Array.from(rec.promptIds)).toEqual(Array.from(plainRec.promptIds));
    expect(Array.from(rec.outputIds)).toEqual(Array.from(plainRec.outputIds));
    expect(Array.from(rec.logprobs)).toEqual(Array.from(plainRec.logprobs));
    expect(chunks.at(-2).usage.completion_tokens).toBe(rec.outputIds.length);
    expect(rec.response).toEqual(plainRec.response);
  });
});
