import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import type { ChatCompletionChunk, ChatCompletionMessageParam } from 'openai/resources/chat/completions';
import { freePort } from '../../cluster/net.js';
import { tinyModelDir } from '../../cluster/paths.js';
import { readRunFile } from '../../cluster/run-file.js';
import { longSystemPrompt, TWELVE_TOOLS } from '../parity/corpus.js';
import { testKey } from '../helpers/api-keys.js';
import { longContextModel } from '../helpers/long-context-model.js';
import { commandOf, descendants, ensureTinyModel, runReef, testConfig } from '../helpers/stack.js';
import { pidAlive, waitFor } from '../helpers/wait.js';

/**
 * The official `openai` npm client against a real `reef up` stack on the tiny model: model list,
 * completions streamed and not, receipts, include_usage, tools, content parts,
 * max_completion_tokens, the developer role, and an OpenClaw-shaped session (long system prompt,
 * twelve tools, whole transcript resent each turn, always streaming). Every answer is checked
 * against the record the gateway committed, through the records API.
 */

const KEY = testKey('compat-test');
const SESSION = `compat-${process.pid}`;
const TOOLS = TWELVE_TOOLS as unknown as OpenAI.Chat.Completions.ChatCompletionTool[];

interface RecordJson {
  id: string;
  scenario: string;
  status: string;
  tags: Record<string, string>;
  request: { messages: Array<{ role: string; content: unknown }>; tools: unknown[] | null; params: Record<string, unknown> };
  promptIds: number[];
  outputIds: number[];
  usage: { promptTokens: number; completionTokens: number };
}

describe('the openai npm client against reef up', () => {
  let cfg: { path: string; dir: string };
  let base: string;
  let client: OpenAI;
  let stackPid = 0;
  let tree: number[] = [];

  const record = async (id: string): Promise<RecordJson> => {
    const res = await fetch(`${base}/reef/scenarios/default/records/${id}`, { headers: { authorization: `Bearer ${KEY}` } });
    expect(res.status, await res.clone().text()).toBe(200);
    return (await res.json()) as RecordJson;
  };

  /** Streams one completion; returns the chunks, the receipt and where in the stream it came. */
  const streamed = async (params: Omit<OpenAI.Chat.Completions.ChatCompletionCreateParamsStreaming, 'stream'>) => {
    const stream = await client.chat.completions.create({ ...params, stream: true });
    const chunks: ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    const receiptAt = chunks.findIndex((c) => (c as { reef?: { agent_record_id?: string } }).reef?.agent_record_id !== undefined);
    const receipt = receiptAt < 0 ? null : (chunks[receiptAt] as unknown as { reef: { agent_record_id: string } }).reef.agent_record_id;
    const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    const toolCalls = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
    return { chunks, receipt, receiptAt, text, toolCalls };
  };

  beforeAll(async () => {
    ensureTinyModel();
    const port = await freePort();
    cfg = testConfig((c) => {
      c.reef.port = port;
      c.reef.api_keys = [{ key: KEY }];
      // One rollout engine is all the client talks to; no PRM engine competes for the 2 cores.
      c.cluster.prm.replicas = 0;
      c.cluster.prm_actors = 0;
    });
    const model = longContextModel(cfg.dir);
    const yaml = readFileSync(cfg.path, 'utf8').replaceAll(tinyModelDir(), model);
    writeFileSync(cfg.path, yaml);
    const r = await runReef(['up', '-c', cfg.path, '--detach'], { timeoutMs: 600_000 });
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
    stackPid = readRunFile(join(cfg.dir, 'data', 'run'))!.pid;
    tree = descendants(stackPid);
    base = `http://127.0.0.1:${port}`;
    client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, defaultHeaders: { 'x-reef-tag-session': SESSION }, maxRetries: 0, timeout: 120_000 });
  }, 660_000);

  afterAll(async () => {
    if (!cfg) return;
    if (readRunFile(join(cfg.dir, 'data', 'run'))) await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    for (const pid of tree) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
  }, 200_000);

  it('lists the model', async () => {
    const page = await client.models.list();
    expect(page.data.map((m) => m.id)).toEqual(['tiny-model-32k']);
    expect(page.data[0]!.object).toBe('model');
  });

  it('answers a non-streamed completion with a receipt for a committed record', async () => {
    const { data, response } = await client.chat.completions
      .create({ messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 6, temperature: 0 })
      .withResponse();
    expect(data.object).toBe('chat.completion');
    expect(data.choices).toHaveLength(1);
    expect(data.choices[0]!.message.role).toBe('assistant');
    expect(['stop', 'length', 'tool_calls']).toContain(data.choices[0]!.finish_reason);
    const id = response.headers.get('x-reef-agent-record-id');
    expect(id).toMatch(/^[0-9A-Z]{26}$/);
    const rec = await record(id!);
    expect(rec).toMatchObject({ id, scenario: 'default', status: 'ok', tags: { session: SESSION } });
    expect(rec.outputIds).toHaveLength(data.usage!.completion_tokens);
    expect(rec.promptIds).toHaveLength(data.usage!.prompt_tokens);
  });

  it('streams with include_usage, and the receipt arrives before the stream ends', async () => {
    const s = await streamed({ messages: [{ role: 'user', content: 'Count to three.' }], max_tokens: 8, stream_options: { include_usage: true } });
    expect(s.chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    const usage = s.chunks.find((c) => c.usage != null);
    expect(usage?.choices).toEqual([]);
    expect(usage!.usage!.completion_tokens).toBeGreaterThan(0);
    expect(s.receipt).toMatch(/^[0-9A-Z]{26}$/);
    expect(s.chunks[s.receiptAt]!.choices).toEqual([]);
    // The SDK ends the iteration at [DONE]; the receipt is the last chunk before it.
    expect(s.receiptAt).toBe(s.chunks.length - 1);
    const rec = await record(s.receipt!);
    expect(rec.status).toBe('ok');
    expect(rec.usage).toEqual({ promptTokens: usage!.usage!.prompt_tokens, completionTokens: usage!.usage!.completion_tokens });
  });

  it('accepts a dozen tools with tool_choice auto, non-streamed and streamed, and records them', async () => {
    const messages: ChatCompletionMessageParam[] = [{ role: 'user', content: 'What is the weather in Oslo?' }];
    const { data, response } = await client.chat.completions.create({ messages, tools: TOOLS, tool_choice: 'auto', max_tokens: 8 }).withResponse();
    for (const call of data.choices[0]!.message.tool_calls ?? []) {
      if (call.type === 'function') expect(() => JSON.parse(call.function.arguments)).not.toThrow();
    }
    const plain = await record(response.headers.get('x-reef-agent-record-id')!);
    expect(plain.request.tools).toEqual(TWELVE_TOOLS);
    expect(plain.request.params.tool_choice).toBe('auto');

    const s = await streamed({ messages, tools: TOOLS, tool_choice: 'auto', max_tokens: 8 });
    expect(s.receipt).not.toBeNull();
    const rec = await record(s.receipt!);
    expect(rec.request.tools).toEqual(TWELVE_TOOLS);
    // Same conversation and tools: the same prompt, whether streamed or not.
    expect(rec.promptIds).toEqual(plain.promptIds);
    // The template renders the tool schemas into the prompt.
    const bare = (await client.chat.completions.create({ messages, max_tokens: 1 }).withResponse()).response.headers.get('x-reef-agent-record-id')!;
    expect(plain.promptIds.length).toBeGreaterThan((await record(bare)).promptIds.length + 500);
  });

  it('takes content-part arrays and max_completion_tokens', async () => {
    const { data, response } = await client.chat.completions
      .create({
        messages: [{ role: 'user', content: [{ type: 'text', text: 'First part.' }, { type: 'text', text: ' Second part.' }] }],
        max_completion_tokens: 3,
        temperature: 0,
      })
      .withResponse();
    expect(data.usage!.completion_tokens).toBeLessThanOrEqual(3);
    const rec = await record(response.headers.get('x-reef-agent-record-id')!);
    expect(rec.request.params.max_completion_tokens).toBe(3);
    expect(rec.outputIds.length).toBeLessThanOrEqual(3);
    expect(rec.request.messages[0]!.content).toEqual([{ type: 'text', text: 'First part.' }, { type: 'text', text: ' Second part.' }]);
  });

  it('treats the developer role as system', async () => {
    const ask = async (role: 'developer' | 'system') => {
      const { response } = await client.chat.completions
        .create({ messages: [{ role, content: 'Answer tersely.' }, { role: 'user', content: 'Hi.' }], max_tokens: 1 })
        .withResponse();
      return record(response.headers.get('x-reef-agent-record-id')!);
    };
    const dev = await ask('developer');
    const sys = await ask('system');
    expect(dev.request.messages[0]!.role).toBe('developer');
    expect(dev.promptIds).toEqual(sys.promptIds);
  });

  it('records an OpenClaw-shaped session whose every turn extends the previous prompt', async () => {
    const openclaw = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, defaultHeaders: { 'x-reef-tag-session': `${SESSION}-openclaw` }, maxRetries: 0, timeout: 300_000 });
    const system = longSystemPrompt(20_000);
    expect(system.length).toBeGreaterThanOrEqual(20_000);
    const transcript: ChatCompletionMessageParam[] = [{ role: 'system', content: system }];
    const asks = ['Check the weather in Berlin.', 'Now save it to weather.txt.', [{ type: 'text' as const, text: 'And Paris?' }]];
    const records: RecordJson[] = [];
    const sent: number[] = [];
    for (const ask of asks) {
      transcript.push({ role: 'user', content: ask });
      sent.push(transcript.length);
      const stream = await openclaw.chat.completions.create({
        messages: transcript, tools: TOOLS, tool_choice: 'auto', stream: true, stream_options: { include_usage: true }, max_completion_tokens: 6,
      });
      let content = '';
      const calls = new Map<number, { id: string; name: string; args: string }>();
      let receipt: string | null = null;
      for await (const c of stream) {
        const d = c.choices[0]?.delta;
        content += d?.content ?? '';
        for (const t of d?.tool_calls ?? []) {
          const prev = calls.get(t.index) ?? { id: '', name: '', args: '' };
          calls.set(t.index, { id: t.id ?? prev.id, name: prev.name + (t.function?.name ?? ''), args: prev.args + (t.function?.arguments ?? '') });
        }
        receipt ??= (c as { reef?: { agent_record_id: string } }).reef?.agent_record_id ?? null;
      }
      expect(receipt).not.toBeNull();
      records.push(await record(receipt!));
      // Like OpenClaw: the reply goes back into the transcript, which is resent whole next turn.
      const toolCalls = [...calls.values()].map((t) => ({ id: t.id, type: 'function' as const, function: { name: t.name, arguments: t.args } }));
      transcript.push(toolCalls.length > 0 ? { role: 'assistant', content: content || null, tool_calls: toolCalls } : { role: 'assistant', content });
      for (const t of toolCalls) transcript.push({ role: 'tool', tool_call_id: t.id, content: 'ok' });
    }
    expect(records.map((r) => r.tags.session)).toEqual(Array(3).fill(`${SESSION}-openclaw`));
    expect(records[0]!.promptIds.length).toBeGreaterThan(10_000);
    for (let t = 1; t < records.length; t++) {
      const prev = records[t - 1]!.promptIds;
      const cur = records[t]!.promptIds;
      expect(cur.length).toBeGreaterThan(prev.length);
      expect(cur.slice(0, prev.length)).toEqual(prev);
    }
    expect(records.map((r) => r.request.messages.length)).toEqual(sent);
  }, 300_000);

  it('stops on reef down with nothing left running', async () => {
    tree = [...new Set([...tree, ...descendants(stackPid)])];
    const r = await runReef(['down', '-c', cfg.path], { timeoutMs: 180_000 });
    expect(r.code, r.stderr).toBe(0);
    await waitFor(() => tree.filter(pidAlive).length === 0 || null, { what: 'every process of the stack to exit', timeoutMs: 30_000 }).catch(() => null);
    const survivors = tree.filter(pidAlive).map((p) => `${p}: ${commandOf(p)}`);
    expect(survivors, `left running:\n${survivors.join('\n')}`).toEqual([]);
    expect(readRunFile(join(cfg.dir, 'data', 'run'))).toBeNull();
  }, 200_000);
});
