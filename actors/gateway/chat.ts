import type { EngineClient, GenerateResponse } from '../../cluster/engine-client.js';
import { ReefError } from '../runtime/errors.js';
import type { GenerationGate } from './generation-gate.js';
import type { GatewayMetrics } from './metrics.js';
import type { NewRecord, OutputParser, ParsedOutput, PromptTokenizer, RecordSink } from './ports.js';
import { CHUNK_BYTES } from './store/chunks.js';
import type { StagedPayloads } from './store/types.js';
import type { PreparedChat, RefusedChat } from './tokenize/prepare.js';

/**
 * The chat-completion pipeline, transport-free: raw body → (tokenizer worker: parse, validate,
 * render, tokenize, build the engine body) → engine `/generate` with `input_ids` → parse → record. The ids
 * sent to the engine are exactly the ids recorded.
 */

export interface ChatDeps {
  tokenizer: PromptTokenizer;
  parser: OutputParser;
  engine: EngineClient;
  engineName: string;
  records: RecordSink;
  gate: GenerationGate;
  metrics: GatewayMetrics;
  modelName: string;
  /** K of the recorded top-K. @default 4 */
  topK: number;
  /** max_new_tokens when the client sets none (capped by the context); Infinity = the rest of the context. reef.default_max_tokens */
  defaultMaxTokens: number;
}

export interface ChatContext {
  scenario: string;
  /** The principal's id (auth.ts), stored on the record. */
  keyId: string;
  tags: Record<string, string>;
  sessionKey: string | null;
  startedAt: number;
}

export interface Prepared extends Omit<PreparedChat, 'ok'> {
  id: string;
  ctx: ChatContext;
  /** The client's body as received: what the record stores as its request. */
  body: Uint8Array;
  /** The record's request and prompt ids, written ahead of it (`stageRecord`). */
  staged?: StagedPayloads | null;
  /** The gateway's weight version when the request passed the generation gate. */
  admittedVersion?: string | null;
  /**
   * How the generation ended, as settled (`settleStop`), once it has: the Messages API names the
   * stop sequence that ended a reply, which the chat-completions body has no field for.
   */
  finish?: GenerateResponse['meta_info']['finish_reason'];
}

/** Prepares a raw request body on a tokenizer worker; a refused request comes back as its error. */
export async function prepare(deps: ChatDeps, body: Uint8Array, ctx: ChatContext): Promise<Prepared | RefusedChat> {
  const id = deps.records.newId();
  const out = await deps.tokenizer.prepare(body, { rid: id, topK: deps.topK, defaultMaxTokens: deps.defaultMaxTokens, sessionKey: ctx.sessionKey });
  if (!out.ok) return out;
  const { ok: _ok, ...prepared } = out;
  return { ...prepared, id, ctx, body };
}

/**
 * Writes the coming record's request and prompt ids while the engine works on the request (they
 * are most of an OpenClaw-sized record), so that the commit the receipt waits for writes little
 * more than the output. Scheduled after the engine request has gone out; short requests have
 * nothing to stage.
 */
export function stageRecord(deps: ChatDeps, p: Prepared): void {
  if (!deps.records.stage || (p.body.length <= CHUNK_BYTES && p.promptIds.byteLength <= CHUNK_BYTES)) return;
  const stage = deps.records.stage.bind(deps.records);
  // Two turns of the event loop on: undici writes a request on a reused keep-alive socket from an
  // immediate of its own (it first lets the socket report a close), queued after ours, so staging
  // one turn on ran first and held the engine request back by the whole stage (~0.1 ms).
  setImmediate(() =>
    setImmediate(() => {
      p.staged = stage({ request: { chatBody: p.body }, promptIds: p.promptIds });
    }),
  );
}

/** The OpenAI assistant message of a parsed output: absent fields are left out, as OpenAI does. */
export function assistantMessage(parsed: ParsedOutput): { role: 'assistant'; content: string | null; reasoning_content?: string; tool_calls?: ParsedOutput['tool_calls'] } {
  return {
    role: 'assistant',
    content: parsed.content,
    ...(parsed.reasoning_content !== null ? { reasoning_content: parsed.reasoning_content } : {}),
    ...(parsed.tool_calls.length > 0 ? { tool_calls: parsed.tool_calls } : {}),
  };
}

/**
 * An engine that ends a generation with finish_reason `abort` (it is stopping, or a weight swap's
 * pause aborted what was still running) did not finish it: the output is cut short, and answering
 * it as `stop` would give the client, and the trainer, a truncated reply as a complete one.
 */
export function engineAborted(deps: ChatDeps, res: GenerateResponse | null): ReefError {
  const fr = res?.meta_info.finish_reason as { message?: unknown } | null | undefined;
  const why = typeof fr?.message === 'string' && fr.message ? `: ${fr.message}` : '';
  return new ReefError('REEF_ERR_ENGINE_FAILED', { engine: deps.engineName, reason: `the engine aborted the generation${why}` });
}

/**
 * A stop string that the last token the budget allowed completed. SGLang checks the length before
 * stop strings, so it answers `length` with the stop string left in the text, where one token
 * earlier it would have cut the text and answered `stop`; OpenAI never returns a stop sequence.
 * Answered (and recorded) as the stop it is: the output ids are the same either way.
 */
export function settleStop(res: GenerateResponse, stop: readonly string[] | null | undefined): GenerateResponse {
  if (!stop || res.meta_info.finish_reason?.type !== 'length') return res;
  let at = -1;
  let matched = '';
  for (const s of stop) {
    const i = res.text.indexOf(s);
    if (i >= 0 && (at < 0 || i < at)) [at, matched] = [i, s];
  }
  if (at < 0) return res;
  return { ...res, text: res.text.slice(0, at), meta_info: { ...res.meta_info, finish_reason: { type: 'stop', matched } } };
}

/** OpenAI finish_reason from the engine's, given what the parser found. */
export function finishReason(res: GenerateResponse | null, hasToolCalls: boolean): 'stop' | 'length' | 'tool_calls' {
  if (res?.meta_info.finish_reason?.type === 'length') return 'length';
  return hasToolCalls ? 'tool_calls' : 'stop';
}

/** Builds the record of a finished (or aborted, or failed) generation. */
export function buildRecord(deps: ChatDeps, p: Prepared, res: GenerateResponse | null, status: NewRecord['status'], error: string | null, response: unknown): NewRecord {
  const outputIds = Int32Array.from(res?.output_ids ?? []);
  const lps = res?.meta_info.output_token_logprobs ?? [];
  const tops = res?.meta_info.output_top_logprobs ?? [];
  const n = outputIds.length;
  const K = deps.topK;
  const logprobs = new Float32Array(n);
  const topkIds = new Int32Array(n * K).fill(-1);
  const topkLogprobs = new Float32Array(n * K).fill(Number.NEGATIVE_INFINITY);
  for (let t = 0; t < n; t++) {
    logprobs[t] = lps[t]?.[0] ?? Number.NaN;
    const row = tops[t] ?? [];
    for (let k = 0; k < Math.min(K, row.length); k++) {
      topkIds[t * K + k] = row[k]![1];
      topkLogprobs[t * K + k] = row[k]![0];
    }
  }
  const finishedAt = Date.now();
  return {
    id: p.id,
    scenario: p.ctx.scenario,
    keyId: p.ctx.keyId,
    tags: p.ctx.tags,
    status,
    startedAt: p.ctx.startedAt,
    finishedAt,
    request: { chatBody: p.body },
    staged: p.staged ?? null,
    promptIds: p.promptIds,
    outputIds,
    logprobs,
    topK: K,
    topkIds,
    topkLogprobs,
    finishReason: res?.meta_info.finish_reason?.type ?? (status === 'ok' ? null : status),
    usage: { promptTokens: p.promptIds.length, completionTokens: n },
    // An engine that reports no version generated on the weights it had when the request was let
    // through: a swap waits for the generations in flight (SGLang's and the hf engine's both do),
    // so the gateway's version by the time the record is built may already name the next ones.
    weightVersion: res?.meta_info.weight_version ?? (p.admittedVersion !== undefined ? p.admittedVersion : deps.gate.weightVersion),
    engine: deps.engineName,
    latencyMs: finishedAt - p.ctx.startedAt,
    error,
    response,
  };
}

export async function commit(deps: ChatDeps, record: NewRecord): Promise<string> {
  const t0 = performance.now();
  const { id } = await deps.records.append(record);
  deps.metrics.commitLatency.observe((performance.now() - t0) / 1000);
  deps.metrics.records.inc({ scenario: record.scenario, status: record.status });
  deps.metrics.tokens.inc({ kind: 'prompt' }, record.usage.promptTokens);
  deps.metrics.tokens.inc({ kind: 'completion' }, record.usage.completionTokens);
  return id;
}

/**
 * Non-streamed completion: generate, parse, commit, and only then return the body with its receipt.
 * A client that leaves (`signal`) ends the generation, leaves an `aborted` record, as a stream's
 * does, and gets `null`: an SDK that timed out sends the request again, and the one it left must
 * not train as a turn the user saw.
 */
export async function completeOnce(deps: ChatDeps, p: Prepared, signal?: AbortSignal): Promise<{ recordId: string; body: unknown } | null> {
  await deps.gate.enter(signal);
  p.admittedVersion = deps.gate.weightVersion;
  let res: GenerateResponse;
  try {
    const pending = deps.engine.generate(p.engineBody, signal);
    stageRecord(deps, p);
    res = settleStop(await pending, p.stop);
    p.finish = res.meta_info.finish_reason;
    if (res.meta_info.finish_reason?.type === 'abort') throw engineAborted(deps, res);
  } catch (err) {
    if (signal?.aborted) {
      await commit(deps, buildRecord(deps, p, null, 'aborted', 'client disconnected', null));
      return null;
    }
    deps.metrics.engineErrors.inc({ kind: 'generate' });
    throw err;
  } finally {
    deps.gate.leave();
  }
  const message = assistantMessage(deps.parser.parse(res.text, { startsInThinking: p.startsInThinking, tools: p.tools }));
  const fr = finishReason(res, message.tool_calls !== undefined);
  const usage = { prompt_tokens: p.promptIds.length, completion_tokens: res.output_ids.length, total_tokens: p.promptIds.length + res.output_ids.length };
  const body = {
    id: `chatcmpl-${p.id}`,
    object: 'chat.completion',
    created: Math.floor(p.ctx.startedAt / 1000),
    model: p.model ?? deps.modelName,
    // `refusal` is a required field of the SDK's message type (OpenAI sends null); the record keeps the parsed message.
    choices: [{ index: 0, message: { ...message, refusal: null }, finish_reason: fr, logprobs: null }],
    usage,
  };
  const recordId = await commit(deps, buildRecord(deps, p, res, 'ok', null, message));
  return { recordId, body };
}
