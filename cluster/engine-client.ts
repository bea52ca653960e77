import { readFileSync } from 'node:fs';
import { StringDecoder } from 'node:string_decoder';
import { Agent, type Dispatcher } from 'undici';
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

/** Output tokens `[start, end)` that weights `version` produced (SGLang 0.5.23, srt/utils/weight_versions.py:17-20). */
export interface WeightVersionSpan {
  version: string;
  start: number;
  end: number;
}

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
    /** On the last event only, from SGLang 0.5.23; absent from older ones and the hf engine. */
    weight_versions?: WeightVersionSpan[];
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
  /**
   * Longest wait for an answer's headers (a non-streamed generation sends them when it is done)
   * and between two pieces of its body. @default 300_000
   */
  requestTimeoutMs?: number;
  /** The setting that `requestTimeoutMs` came from, named in REEF_ERR_ENGINE_TIMEOUT. @default `requestTimeoutMs` */
  timeoutSetting?: string;
  /** @default 64 */
  connections?: number;
  /** Name used in errors. @default the URL */
  name?: string;
  /**
   * Sent as `Authorization: Bearer` on the admin routes (weight updates, memory release and resume),
   * never on generation: the engines of a stack refuse those routes without it.
   * @default the stack's (`REEF_ENGINE_ADMIN_KEY_FILE`), none outside a stack
   */
  adminKey?: string | null;
}

export const ENGINE_ADMIN_KEY_ENV = 'REEF_ENGINE_ADMIN_KEY_FILE';
export const ENGINE_ADMIN_KEY_FILE = 'engine-admin.key';

/** The stack's engine admin key, from the file `REEF_ENGINE_ADMIN_KEY_FILE` names; null outside a stack. */
export function engineAdminKey(env: NodeJS.ProcessEnv = process.env): string | null {
  const path = env[ENGINE_ADMIN_KEY_ENV];
  if (path === undefined || path === '') return null;
  let key: string;
  try {
    key = readFileSync(path, 'utf8').trim();
  } catch (err) {
    throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${ENGINE_ADMIN_KEY_ENV}: cannot read the engine admin key ${path}: ${(err as Error).message}` }, { cause: err });
  }
  if (key === '') throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${ENGINE_ADMIN_KEY_ENV}: ${path} is empty` });
  return key;
}

export { generateBody } from './generate-body.js';

/** A streamed event that reports a failure (`{"error": …}`) rather than output. */
const ERROR_EVENT = /^\{\s*"error"\s*:/;
const JSON_HEADERS = { 'content-type': 'application/json' };
/** How much of a refusal's body is kept for its error message. */
const ERROR_BODY_CHARS = 4096;

/** Why `signal` aborted, as the Error a cut-off request rejects with. */
function abortError(signal: AbortSignal | null, fallback: string): Error {
  const reason: unknown = signal?.reason;
  return reason instanceof Error ? reason : new Error(fallback);
}

/**
 * The response to one streamed `/generate`, as undici hands it over: the newest data event not yet
 * taken, and how the response ended. Events are cumulative, so one slot holds all that is news;
 * the engine's socket is read on at its own pace, whatever the consumer's.
 */
class StreamedGeneration implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | null = null;
  private status = 0;
  private refusalBody = '';
  private buf = '';
  /** A character can be split between two reads of the socket; decoding each read alone would mangle it. */
  private readonly decoder = new StringDecoder('utf8');
  /** The last read ended in `\r`: a `\n` starting the next one belongs to the same line end. */
  private pendingCR = false;
  /** What was left unread at the end of a response that had no [DONE]: it says what went wrong. */
  private tail = '';
  private newest: string | null = null;
  /** `[DONE]` arrived: nothing after it is read. */
  private done = false;
  /** The response is over, or the consumer left. */
  private ended = false;
  private failure: unknown = null;
  private wake: (() => void) | null = null;
  /** A request still queued for a connection has no controller yet: it is cut off when it starts. */
  private readonly onAbort = () => {
    if (this.controller !== null) this.controller.abort(this.abortReason());
    else {
      this.failure ??= this.abortReason();
      this.notify();
    }
  };

  constructor(private readonly engine: string, private readonly signal: AbortSignal | null, private readonly timedOut: (err: Error) => ReefError | null) {
    signal?.addEventListener('abort', this.onAbort, { once: true });
    // A signal that fired already fires no more: its caller (a client gone while its request was
    // prepared) would otherwise wait for a connection before being let go.
    if (signal?.aborted) this.onAbort();
  }

  private abortReason(): Error {
    return abortError(this.signal, 'the stream was aborted');
  }

  /** The newest event's data, null at the end, or undefined when nothing is there yet; throws how the stream failed. */
  take(): string | null | undefined {
    const event = this.newest;
    if (event !== null) {
      this.newest = null;
      return event;
    }
    if (this.failure !== null) throw this.failure;
    if (this.done) return null;
    if (this.ended) {
      // An engine (or a proxy before it) that answers a stream with a plain JSON error, 200 or not.
      if (ERROR_EVENT.test(this.tail)) throw engineFailure(this.engine, this.tail);
      throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.engine, reason: `stream ended without [DONE]${this.tail ? `; it ended with: ${this.tail.slice(0, 200)}` : ''}` });
    }
    return undefined;
  }

  /** Resolves when there is something new to take. */
  arrival(): Promise<void> {
    return new Promise((resolve) => {
      this.wake = resolve;
    });
  }

  /** The consumer is done: a response still going (it left before [DONE]) is cut off. */
  leave(): void {
    if (!this.done && !this.ended) this.controller?.abort(new Error('the reader of the stream left'));
    this.finish();
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.signal?.aborted) controller.abort(this.abortReason());
    else if (this.ended) controller.abort(new Error('the reader of the stream left'));
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number): void {
    this.status = statusCode;
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.status >= 400) {
      if (this.refusalBody.length < ERROR_BODY_CHARS) this.refusalBody += this.decoder.write(chunk);
      return;
    }
    if (this.done || this.failure !== null) return;
    this.buf += this.lines(this.decoder.write(chunk));
    let sep: number;
    while ((sep = this.buf.indexOf('\n\n')) >= 0) {
      const event = this.buf.slice(0, sep);
      this.buf = this.buf.slice(sep + 2);
      // An event's data is all its `data:` lines, joined by line ends (SSE), not each line alone.
      let data: string | null = null;
      for (const line of event.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const value = line.slice(5).trim();
        data = data === null ? value : `${data}\n${value}`;
      }
      if (data === null) continue;
      if (data === '[DONE]') {
        this.done = true;
        this.buf = '';
        return this.notify();
      }
      // Taken after the events before it, and before any after it.
      if (ERROR_EVENT.test(data)) {
        this.failure = engineFailure(this.engine, data);
        return this.notify();
      }
      this.newest = data;
    }
    this.notify();
  }

  /**
   * `text` with its line ends as `\n`: SSE also allows `\r\n` and `\r` (servers built on
   * sse-starlette end every line with `\r\n`), and read as they are no event ever ended.
   */
  private lines(text: string): string {
    if (this.pendingCR) {
      text = `\r${text}`;
      this.pendingCR = false;
    }
    if (!text.includes('\r')) return text;
    if (text.endsWith('\r')) {
      this.pendingCR = true;
      text = text.slice(0, -1);
    }
    return text.replace(/\r\n?/g, '\n');
  }

  onResponseEnd(): void {
    if (this.status >= 400) {
      this.failure ??= refusal(this.engine, '/generate', this.status, this.refusalBody.slice(0, ERROR_BODY_CHARS));
    } else if (!this.done) {
      this.tail = (this.buf + this.decoder.end()).trim().slice(0, ERROR_BODY_CHARS);
    }
    this.finish();
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    // Before a response, the engine could not be reached (or the request was aborted); after it
    // started, the error is the stream's own. After [DONE] the generation is whole: a connection
    // that breaks before the response's own end (no last chunk) takes nothing from it.
    if (!this.done) this.failure ??= this.timedOut(err) ?? (this.status === 0 && !this.signal?.aborted ? new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.engine, reason: err.message }, { cause: err }) : err);
    this.finish();
  }

  private finish(): void {
    this.ended = true;
    this.signal?.removeEventListener('abort', this.onAbort);
    this.notify();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }
}

/** A response read whole: its status and its body as text. Aborting `signal` cuts the request off. */
class CollectedAnswer implements Dispatcher.DispatchHandler {
  readonly done: Promise<{ status: number; text: string }>;
  private status = 0;
  private readonly chunks: Buffer[] = [];
  private resolve!: (answer: { status: number; text: string }) => void;
  private reject!: (err: Error) => void;
  private controller: Dispatcher.DispatchController | null = null;
  /**
   * A request still queued for a connection has no controller yet: its caller is let go now (it is
   * cut off when it starts), not held until a connection frees, still counted in flight.
   */
  private readonly onAbort = () => {
    if (this.controller !== null) this.controller.abort(this.abortReason());
    else this.reject(this.abortReason());
  };

  constructor(private readonly signal: AbortSignal | null = null) {
    this.done = new Promise((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    if (signal) {
      signal.addEventListener('abort', this.onAbort, { once: true });
      void this.done.catch(() => {}).finally(() => signal.removeEventListener('abort', this.onAbort));
      // As in StreamedGeneration: a signal that fired already fires no more.
      if (signal.aborted) this.onAbort();
    }
  }

  private abortReason(): Error {
    return abortError(this.signal, 'the request was aborted');
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.signal?.aborted) controller.abort(this.abortReason());
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number): void {
    this.status = statusCode;
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.chunks.push(chunk);
  }

  onResponseEnd(): void {
    this.resolve({ status: this.status, text: Buffer.concat(this.chunks).toString('utf8') });
  }

  onResponseError(_controller: Dispatcher.DispatchController, err: Error): void {
    this.reject(err);
  }
}

/**
 * Only what says the request itself is wrong (400, 413, 422) is the client's. The rest is the
 * engine's state or the setup's: 429 (overloaded), 404 or 405 (a wrong engine URL, a server that
 * is not SGLang), 401/403 (an engine behind a key): the client got a 400 for them, as if its
 * request were at fault, and did not retry.
 */
const REQUEST_FAULTS = new Set([400, 413, 422]);

/**
 * What an engine's refusal means: the request's own fault (e.g. a prompt past the context) for
 * REQUEST_FAULTS, else the engine being down; with the engine's words either way.
 */
function refusal(engine: string, path: string, status: number, text: string): Error {
  return REQUEST_FAULTS.has(status)
    ? new EngineRequestError(status, text, path)
    : new ReefError('REEF_ERR_ENGINE_DOWN', { engine, reason: `${path} answered ${status}: ${text.slice(0, 300)}` });
}

/** A streamed `error` event (or a reply with no output) as the engine being down, its `error` member the reason. */
function engineFailure(engine: string, data: string): ReefError {
  let reason = data;
  try {
    const error = (JSON.parse(data) as { error?: unknown } | null)?.error;
    reason = error === undefined ? `a reply without output: ${data}` : JSON.stringify(error);
  } catch {
    // The event is not JSON: its text is the reason.
  }
  return new ReefError('REEF_ERR_ENGINE_DOWN', { engine, reason: reason.slice(0, 300) });
}

/** Whether a parsed `/generate` answer is a reply (rather than `{error}`, or something else entirely). */
function isReply(parsed: unknown): parsed is GenerateResponse {
  return typeof parsed === 'object' && parsed !== null && !('error' in parsed) && typeof (parsed as { meta_info?: unknown }).meta_info === 'object' && (parsed as { meta_info?: unknown }).meta_info !== null;
}

/**
 * A reply whose tokens came from more than one version of the weights fails, as one a weight swap
 * aborted does. SGLang 0.5.23 says so on a reply's last event: `meta_info.weight_versions`, spans
 * merged where the version repeats, so two spans are two versions, and `weight_version` then the
 * last span's (srt/utils/weight_versions.py:66-87, :90-107). Recorded under that one, the earlier
 * tokens would train as its samples, and no other version is right for the whole record either.
 * Failing leaves nothing trainable without a new record field: the gateway records a stream that
 * fails as `failed`, which the judge skips, and a reply that fails before any answer not at all.
 * Engines without the field (older SGLang, the hf engine) are read as before.
 */
function oneWeightVersion(engine: string, res: GenerateResponse): GenerateResponse {
  const spans = res.meta_info.weight_versions;
  if (!Array.isArray(spans) || new Set(spans.map((s) => s?.version)).size <= 1) return res;
  const read = spans.map((s) => `${s?.version} for tokens [${s?.start}, ${s?.end})`).join(', ');
  throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine, reason: `the reply's tokens came from more than one weight version (${read}): no one version sampled it` });
}

/** An engine's answer that is not JSON (a proxy's error page, a broken engine) is the engine failing, with its words. */
function parseJson(engine: string, path: string, text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine, reason: `${path} answered with what is not JSON: ${text.slice(0, 200)}` });
  }
}

/**
 * How long an idle connection to an engine is kept: less than the engine keeps it. SGLang's uvicorn
 * closes one after 5 s without a hint in its answers, and a request written as it closes fails (a
 * 503 to the client, a failed PRM call). undici's own default, 4 s, is for this same reason.
 */
export const ENGINE_KEEP_ALIVE_MS = 4_000;

export class EngineClient {
  readonly baseUrl: string;
  readonly name: string;
  private readonly agent: Agent;
  private readonly timeoutMs: number;
  private readonly timeoutSetting: string;
  /** `baseUrl` split for `dispatch`: the origin, and any path before the API's own. */
  private readonly origin: string;
  private readonly pathPrefix: string;
  private readonly adminHeaders: Record<string, string>;

  constructor(baseUrl: string, opts: EngineClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, '');
    const url = new URL(this.baseUrl);
    this.origin = url.origin;
    this.pathPrefix = url.pathname.replace(/\/+$/, '');
    this.name = opts.name ?? this.baseUrl;
    const adminKey = opts.adminKey === undefined ? engineAdminKey() : opts.adminKey;
    this.adminHeaders = adminKey === null ? JSON_HEADERS : { ...JSON_HEADERS, authorization: `Bearer ${adminKey}` };
    this.timeoutMs = opts.requestTimeoutMs ?? 300_000;
    this.timeoutSetting = opts.timeoutSetting ?? 'requestTimeoutMs';
    this.agent = new Agent({ connections: opts.connections ?? 64, keepAliveTimeout: ENGINE_KEEP_ALIVE_MS, pipelining: 1 });
  }

  /**
   * The whole answer to one request; an engine that cannot be reached, or breaks off its answer,
   * is down. `body` is sent as JSON; a string or bytes are taken as JSON already serialised.
   * A dispatch handler collects the answer: undici's `request` (a response object and a body
   * stream per call) cost the gateway's event loop ~10% of its throughput on short chats.
   */
  private async call(method: 'GET' | 'POST', path: string, body?: unknown, signal?: AbortSignal): Promise<{ status: number; text: string }> {
    const payload = body === undefined ? null : typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body);
    const answer = new CollectedAnswer(signal ?? null);
    this.dispatch(method, path, payload, answer);
    try {
      return await answer.done;
    } catch (err) {
      // Cut off by our own caller: not the engine's failure.
      if (signal?.aborted) throw err;
      throw this.timedOut(err) ?? new ReefError('REEF_ERR_ENGINE_DOWN', { engine: this.name, reason: (err as Error).message }, { cause: err });
    }
  }

  /**
   * A slow engine is not a down one: a busy CPU engine answered a queued non-streamed request after
   * undici's timeout, and a 503 "unavailable" sent its operator looking for a crash.
   */
  private timedOut(err: unknown): ReefError | null {
    const code = (err as { code?: unknown } | null)?.code;
    if (code !== 'UND_ERR_HEADERS_TIMEOUT' && code !== 'UND_ERR_BODY_TIMEOUT') return null;
    return new ReefError('REEF_ERR_ENGINE_TIMEOUT', { engine: this.name, seconds: this.timeoutMs / 1000, setting: this.timeoutSetting }, { cause: err });
  }

  /** One request to the engine, answered to `handler`; a body is JSON. */
  private dispatch(method: 'GET' | 'POST', path: string, body: string | Uint8Array | null, handler: Dispatcher.DispatchHandler): void {
    // Every POST but generation is an admin route; GETs (health, info) are open.
    const headers = body === null ? {} : method === 'POST' && path !== '/generate' ? this.adminHeaders : JSON_HEADERS;
    this.agent.dispatch({ origin: this.origin, path: this.pathPrefix + path, method, headers, body, headersTimeout: this.timeoutMs, bodyTimeout: this.timeoutMs }, handler);
  }

  private async json<T>(method: 'GET' | 'POST', path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const { status, text } = await this.call(method, path, body, signal);
    if (status >= 400) throw refusal(this.name, path, status, text);
    return (text ? parseJson(this.name, path, text) : {}) as T;
  }

  async health(): Promise<boolean> {
    try {
      return (await this.call('GET', '/health')).status === 200;
    } catch {
      return false;
    }
  }

  modelInfo(): Promise<ModelInfo> {
    return this.json('GET', '/model_info');
  }

  /**
   * `req` may be a body already serialised by `generateBody(…, false)` (the gateway's workers do).
   * Aborting `signal` closes the connection, which makes the engine stop generating; the call then
   * rejects with the signal's reason.
   */
  async generate(req: GenerateRequest | Uint8Array, signal?: AbortSignal): Promise<GenerateResponse> {
    const res = await this.json<GenerateResponse | { error: unknown }>('POST', '/generate', req instanceof Uint8Array ? req : generateBody(req, false), signal);
    // A 200 that carries an error, or no reply at all, has no output to read: its callers would
    // fail on the missing meta_info with a TypeError.
    if (!isReply(res)) throw engineFailure(this.name, JSON.stringify(res));
    return oneWeightVersion(this.name, res);
  }

  /**
   * Streams a generation. Each yielded chunk is cumulative (SGLang's convention: `output_ids` and
   * the logprob lists hold everything generated so far), so of the events that arrived since the
   * last one was taken only the newest is parsed and yielded: it holds all the others do, and
   * parsing every one re-reads the whole output's logprobs each time (quadratic in its length). An
   * engine that fails mid-stream sends an `error` event; such an event is never skipped. Aborting
   * `signal` closes the connection, which makes the engine stop generating.
   *
   * The response is read by a dispatch handler (`StreamedGeneration`) rather than undici's
   * `request`, whose response object, body stream and async iteration cost ~0.1 ms per streamed
   * request on this path's event loop, measured in the gateway.
   */
  async *generateStream(req: GenerateRequest | Uint8Array, signal?: AbortSignal): AsyncGenerator<GenerateResponse> {
    const body = req instanceof Uint8Array ? req : generateBody(req, true);
    const s = new StreamedGeneration(this.name, signal ?? null, (err) => this.timedOut(err));
    this.dispatch('POST', '/generate', body, s);
    try {
      for (;;) {
        let event = s.take();
        while (event === undefined) {
          await s.arrival();
          event = s.take();
        }
        if (event === null) return;
        yield this.parseEvent(event);
      }
    } finally {
      s.leave();
    }
  }

  /** One streamed event's data; an `error` event is thrown as the engine being down. */
  private parseEvent(data: string): GenerateResponse {
    const parsed = parseJson(this.name, '/generate', data);
    if (!isReply(parsed)) throw engineFailure(this.name, data);
    return oneWeightVersion(this.name, parsed);
  }

  /**
   * Loads a checkpoint, with `flush_cache: false`: SGLang 0.5.23 flushes only when nothing runs or
   * waits, and a refused flush fails the call after the weights were loaded
   * (srt/managers/scheduler_components/weight_updater.py:137-160), so callers flush afterwards
   * with `flushCache`, which waits for idle.
   */
  updateWeightsFromDisk(modelPath: string, weightVersion: string | null): Promise<{ success: boolean; message: string; weight_version?: string | null }> {
    return this.json('POST', '/update_weights_from_disk', { model_path: modelPath, weight_version: weightVersion, flush_cache: false });
  }

  /**
   * Drops the engine's prefix cache, waiting up to `timeoutS` for it to go idle (SGLang 0.5.23
   * `srt/entrypoints/http_server.py:1025-1040`, `scheduler_components/flush_wrapper.py:22-61`;
   * older releases ignore the wait and refuse at once). Answered in plain text: true when flushed,
   * false when refused; an engine that is gone throws.
   */
  async flushCache(timeoutS: number): Promise<{ flushed: boolean; message: string }> {
    const { status, text } = await this.call('POST', `/flush_cache?timeout=${Math.max(0, timeoutS).toFixed(1)}`, '');
    if (status === 200) return { flushed: true, message: text.trim() };
    if (status === 400) return { flushed: false, message: text.trim() };
    throw refusal(this.name, '/flush_cache', status, text);
  }

  /**
   * SGLang's `/release_memory_occupation` and `/resume_memory_occupation` (every tag: the weights
   * and the KV cache): colocated, the engine gives the GPU to the trainer for its step. The weights
   * do not survive: after resume they must all be sent again.
   */
  async releaseMemory(): Promise<void> {
    await this.json('POST', '/release_memory_occupation', {});
  }

  async resumeMemory(): Promise<void> {
    await this.json('POST', '/resume_memory_occupation', {});
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
