import { EngineRequestError, type GenerateResponse } from '../../cluster/engine-client.js';
import { ReefError } from '../runtime/errors.js';
import { assistantMessage, buildRecord, commit, engineAborted, finishReason, settleStop, stageRecord, type ChatDeps, type Prepared } from './chat.js';
import { errorBody } from './http-errors.js';
import { callId } from './parsers/index.js';
import { partialTagSuffix } from './parsers/tool-json.js';
import type { StreamDelta } from './ports.js';

/** Where SSE events go; the route adapts a Node response to it. */
export interface SseSink {
  /** Writes one `data:` event; resolves once the socket took it (backpressure). */
  send(data: unknown): Promise<void>;
  /**
   * Writes `events`, then `data: [DONE]`, and ends the response with them in one write, so that
   * they leave together.
   */
  sendDone(events?: readonly unknown[]): Promise<void>;
  /** Aborted when the client goes away. */
  readonly signal: AbortSignal;
  /**
   * Told the assistant message the record keeps, once the stream ended well, before its commit:
   * a route that answers in another shape (the Responses API) stores the conversation with it.
   */
  recorded?(message: ReturnType<typeof assistantMessage>): void;
}

/**
 * Streams a completion as OpenAI chunks while the engine generates. The receipt chunk
 * (`choices: []`, `reef.agent_record_id`) is sent only after the record committed, just before
 * `[DONE]`. A client that leaves mid-stream gets its record written as `aborted`; an engine that
 * fails mid-stream gets an SSE error event and a `failed` record.
 */
export async function streamCompletion(deps: ChatDeps, p: Prepared, sink: SseSink): Promise<{ recordId: string; status: 'ok' | 'aborted' | 'failed' }> {
  const base = { id: `chatcmpl-${p.id}`, object: 'chat.completion.chunk', created: Math.floor(p.ctx.startedAt / 1000), model: p.model ?? deps.modelName };
  const chunk = (delta: StreamDelta | { role: string; content: string } | Record<string, never>, finish: string | null = null) => ({ ...base, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }] });
  const parser = deps.parser.stream({ startsInThinking: p.startsInThinking, tools: p.tools });

  let last: GenerateResponse | null = null;
  let text = '';
  // The ids the client saw; the recorded message must carry the same ones, since the client sends
  // them back with the tool results next turn.
  const streamedCallIds: string[] = [];
  const emit = async (deltas: StreamDelta[]) => {
    for (const d of deltas) {
      if ('tool_calls' in d) streamedCallIds.push(d.tool_calls[0].id);
      if (!sink.signal.aborted) await sink.send(chunk(d));
    }
  };

  // A client that leaves stops the wait for a weight swap, and the engine's generation.
  await deps.gate.enter(sink.signal);
  p.admittedVersion = deps.gate.weightVersion;
  // It runs once the loop below has sent the engine request and waits for an answer.
  stageRecord(deps, p);
  try {
    for await (const event of deps.engine.generateStream(p.engineBody, sink.signal)) {
      const res = event.meta_info.finish_reason == null ? event : settleStop(event, p.stop);
      // Nothing goes out before the engine's first event, so an engine that is down or refuses
      // the request still gets the client a real status (503 with Retry-After, or 400).
      if (last === null) await sink.send(chunk({ role: 'assistant', content: '' }));
      last = res;
      // Chunks are cumulative; only the new suffix is news. Until the last event the engine may
      // still revise the text's tail, and what the client got cannot be taken back: see settled.
      const upto = settled(res.text, p.stop ?? null);
      if (upto > text.length && res.text.startsWith(text)) {
        const delta = res.text.slice(text.length, upto);
        text = res.text.slice(0, upto);
        await emit(parser.push(delta));
      }
    }
    p.finish = last?.meta_info.finish_reason ?? null;
    if (last?.meta_info.finish_reason?.type === 'abort' && !sink.signal.aborted) throw engineAborted(deps, last);
    // Only the last event carries a finish_reason: a stream that ends (even with [DONE]) after one
    // without it was cut short, and answering `stop` would pass a truncated reply off as whole.
    if (last !== null && last.meta_info.finish_reason == null && !sink.signal.aborted) {
      throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: deps.engineName, reason: 'the stream ended before the generation did (its last event has no finish_reason)' });
    }
    if (last && last.text !== text && last.text.startsWith(text)) await emit(parser.push(last.text.slice(text.length)));
    await emit(parser.finish());
  } catch (err) {
    deps.gate.leave();
    if (last === null && !sink.signal.aborted) {
      // Before the first event the client has seen nothing: answer with a status, record nothing
      // (as a non-streamed request would).
      deps.metrics.engineErrors.inc({ kind: 'generate' });
      if (err instanceof ReefError || err instanceof EngineRequestError) throw err;
      throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: deps.engineName, reason: err instanceof Error ? err.message : String(err) }, { cause: err });
    }
    if (sink.signal.aborted) {
      await commit(deps, buildRecord(deps, p, last, 'aborted', 'client disconnected', null));
      return { recordId: p.id, status: 'aborted' };
    }
    deps.metrics.engineErrors.inc({ kind: 'stream' });
    const reason = err instanceof Error ? err.message : String(err);
    await commit(deps, buildRecord(deps, p, last, 'failed', reason, null));
    const e = err instanceof ReefError ? err : new ReefError('REEF_ERR_ENGINE_FAILED', { engine: deps.engineName, reason });
    await sink.send(errorBody(e.code, e.message));
    return { recordId: p.id, status: 'failed' };
  }
  deps.gate.leave();

  const ids = [...streamedCallIds];
  const message = assistantMessage(deps.parser.parse(last?.text ?? '', { startsInThinking: p.startsInThinking, tools: p.tools, newId: () => ids.shift() ?? callId() }));
  const completionTokens = last?.output_ids.length ?? 0;
  if (sink.signal.aborted) {
    await commit(deps, buildRecord(deps, p, last, 'aborted', 'client disconnected', message));
    return { recordId: p.id, status: 'aborted' };
  }
  sink.recorded?.(message);
  // The closing events wait for the commit and leave together with the receipt: sent before it,
  // they cost the client a wake-up (and us a socket write) of their own for nothing it can use
  // earlier, since the answer is complete only with its receipt.
  const closing: unknown[] = [];
  if (last === null) closing.push(chunk({ role: 'assistant', content: '' }));
  closing.push(chunk({}, finishReason(last, streamedCallIds.length > 0)));
  if (p.includeUsage) {
    closing.push({ ...base, choices: [], usage: { prompt_tokens: p.promptIds.length, completion_tokens: completionTokens, total_tokens: p.promptIds.length + completionTokens } });
  }
  let recordId: string;
  try {
    recordId = await commit(deps, buildRecord(deps, p, last, 'ok', null, message));
  } catch (err) {
    // No receipt without a commit; the client learns why instead of seeing the stream just stop.
    const e = err instanceof ReefError ? err : new ReefError('REEF_ERR_STORE', { reason: err instanceof Error ? err.message : String(err) });
    for (const event of closing) void sink.send(event);
    await sink.send(errorBody(e.code, e.message));
    return { recordId: p.id, status: 'failed' };
  }
  closing.push({ ...base, choices: [], reef: { agent_record_id: recordId } });
  await sink.sendDone(closing);
  return { recordId, status: 'ok' };
}

/**
 * How much of a streamed, not yet final text can go to the client. A trailing U+FFFD is a character
 * split across tokens that the detokenizer will replace (emitted, every later event would fail the
 * prefix check and the stream would stop there). A tail that may be the start of a stop string is
 * cut from the final text once the string completes (SGLang trims it only then), so it waits too.
 */
export function settled(text: string, stop: readonly string[] | null): number {
  let end = text.endsWith('\uFFFD') ? text.length - 1 : text.length;
  if (stop !== null) {
    const head = text.slice(0, end);
    let keep = 0;
    for (const s of stop) keep = Math.max(keep, partialTagSuffix(head, s));
    end -= keep;
  }
  return end;
}
