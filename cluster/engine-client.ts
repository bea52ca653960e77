import { Agent, request } from 'undici';
import { ReefError } from '../actors/runtime/errors.js';
import { generateBody } from './generate-body.js';

/**
 * Client of the engine HTTP API (the SGLang native subset in docs/internals.md), shared by the
 * gateway, the PRM actors and the trainer-controller. One keep-alive pool per engine URL.
 */

export interface SamplingParams {
  max_new_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  stop?: string[] | null;
  stop_token_ids?: number[] | null;
  sampling_seed?: number | null;
  /** Keep generating past end-of-sequence (benchmarks want a fixed length). */
  ignore_eos?: boolean;
}

export interface GenerateRequest {
  /** A typed array is sent as it is (no copy): the gateway's prompt ids are an Int32Array. */
  input_ids?: number[] | Int32Array | null;
  text?: string | null;
  sampling_params: SamplingParams;
  return_logprob?: boolean;
  top_logprobs_num?: number;
  rid?: string | null;
}

export type LogprobEntry = [number, number, string | null];

export interface GenerateResponse {
  text: string;
  output_ids: number[];
  meta_info: {
    id: string;
    finish_reason: { type: 'stop' | 'length' | 'abort'; matched: number | string | null } | null;
    prompt_tokens: number;
    completion_tokens: number;
    output_token_logprobs?: LogprobEntry[];
    output_top_logprobs?: LogprobEntry[][];
    weight_version: string | null;
  };
}

export interface ModelInfo {
  model_path: string;
  tokenizer_path?: string | null;
  is_generation?: boolean;
  weight_version?: string | null;
  max_context_length?: number;
  vocab_size?: number;
}

export interface EngineClientOptions {
  /** @default 300_000 */
  requestTimeoutMs?: number;
  /** @default 64 */
  connections?: number;
  /** Name used in errors. @default the URL */
  name?: string;
}

export { generateBody } from './generate-body.js';

/** A streamed event that reports a failure (`{"error": …}`) rather than output. */
const ERROR_EVENT = /^\{\s*"error"\s*:/;

export class EngineClient {
  readonly baseUrl: string;
  readonly name: string;
  private readonly agent: Agent;
  private readonly timeoutMs: number;

  constructor(baseUrl: string, opts: EngineClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    this.name = opts.name ?? this.baseUrl;
    this.timeoutMs = opts.requestTimeoutMs ?? 300_000;
    this.agent = new Agent({ connections: opts.connections ?? 64, keepAliveTimeout: 30_000, pipelining: 1 });
  }

  /** `body` is sent as JSON; a string or bytes are taken as JSON already serialised. */
  private async call(method: 'GET' | 'POST', path: string, body?: unknown, signal?: AbortSignal) {
    try {
      return await request(this.baseUrl + path, {
        method,
        dispatcher: this.agent,
        headers: body === undefined ? {} : { 'content-type': 'application/json' },
        body: body === undefined ? null : typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
        headersTimeout: this.timeoutMs,
        bodyTimeout: this.timeoutMs,
        signal: signal ?? null,
      });
    } catch (err) {
      if (signal?.aborted) throw err;
      throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.name, reason: (err as Error).message }, { cause: err });
    }
  }

  private async json<T>(method: 'GET' | 'POST', path: string, body?: unknown): Promise<T> {
    const res = await this.call(method, path, body);
    const text = await res.body.text();
    if (res.statusCode >= 500) {
      throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.name, reason: `${path} answered ${res.statusCode}: ${text.slice(0, 300)}` });
    }
    if (res.statusCode >= 400) {
      throw new EngineRequestError(res.statusCode, text, path);
    }
    return (text ? JSON.parse(text) : {}) as T;
  }

  async health(): Promise<boolean> {
    try {
      const res = await this.call('GET', '/health');
      await res.body.dump();
      return res.statusCode === 200;
    } catch {
      return false;
    }
  }

  modelInfo(): Promise<ModelInfo> {
    return this.json('GET', '/model_info');
  }

  /** `req` may be a body already serialised by `generateBody(…, false)` (the gateway's workers do). */
  generate(req: GenerateRequest | Uint8Array): Promise<GenerateResponse> {
    return this.json('POST', '/generate', req instanceof Uint8Array ? req : generateBody(req, false));
  }

  /**
   * Streams a generation. Each yielded chunk is cumulative (SGLang's convention: `output_ids` and
   * the logprob lists hold everything generated so far), so of the events that arrive together
   * only the newest is parsed and yielded: it holds all the others do, and parsing every one of
   * them re-reads the whole output's logprobs each time (quadratic in its length). An engine that
   * fails mid-stream sends an `error` event; such an event is never skipped. Aborting `signal`
   * closes the connection, which makes the engine stop generating.
   */
  async *generateStream(req: GenerateRequest | Uint8Array, signal?: AbortSignal): AsyncGenerator<GenerateResponse> {
    const res = await this.call('POST', '/generate', req instanceof Uint8Array ? req : generateBody(req, true), signal);
    if (res.statusCode >= 400) {
      const text = await res.body.text();
      if (res.statusCode >= 500) throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.name, reason: `/generate answered ${res.statusCode}: ${text.slice(0, 300)}` });
      throw new EngineRequestError(res.statusCode, text, '/generate');
    }
    let buf = '';
    let done = false;
    // After [DONE] the loop reads on to the end of the body (the engine ends it there) instead of
    // leaving early: leaving a stream's async iterator early destroys the stream with an AbortError,
    // whose stack trace cost every streamed request ~40 µs.
    for await (const chunk of res.body) {
      if (done) continue;
      buf += typeof chunk === 'string' ? chunk : (chunk as Buffer).toString('utf8');
      let newest: string | null = null;
      let sep: number;
      while (!done && (sep = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, sep);
        buf = buf.slice(sep + 2);
        for (const line of event.split('\n')) {
          if (!line.startsWith('data:')) continue;
          const data = line.slice(5).trim();
          if (data === '[DONE]') {
            done = true;
            break;
          }
          if (newest !== null && ERROR_EVENT.test(newest)) this.parseEvent(newest);
          newest = data;
        }
      }
      if (newest !== null) yield this.parseEvent(newest);
    }
    if (!done) throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.name, reason: 'stream ended without [DONE]' });
  }

  /** One streamed event's data; an `error` event is thrown as the engine being down. */
  private parseEvent(data: string): GenerateResponse {
    const parsed = JSON.parse(data) as GenerateResponse | { error: unknown };
    if ('error' in parsed) throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.name, reason: JSON.stringify(parsed.error).slice(0, 300) });
    return parsed;
  }

  updateWeightsFromDisk(modelPath: string, weightVersion: string | null): Promise<{ success: boolean; message: string; weight_version?: string | null }> {
    return this.json('POST', '/update_weights_from_disk', { model_path: modelPath, weight_version: weightVersion });
  }

  pauseGeneration(): Promise<unknown> {
    return this.json('POST', '/pause_generation', {});
  }

  continueGeneration(): Promise<unknown> {
    return this.json('POST', '/continue_generation', {});
  }

  flushCache(): Promise<unknown> {
    return this.json('POST', '/flush_cache', {});
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}

/** A 4xx from the engine: the request itself was bad (e.g. prompt past the context length). */
export class EngineRequestError extends Error {
  constructor(readonly statusCode: number, readonly body: string, readonly path: string) {
    super(`engine ${path} answered ${statusCode}: ${body.slice(0, 300)}`);
    this.name = 'EngineRequestError';
  }
}
