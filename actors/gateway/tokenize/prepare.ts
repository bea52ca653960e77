import type { GenerateRequest } from '../../../cluster/engine-client.js';
import { generateBody, type IdText } from '../../../cluster/generate-body.js';
import { ReefError, type ErrorCode } from '../../runtime/errors.js';
import { parseJsonBody, parsedBodyProblem } from '../body-checks.js';
import { isTopK, parseChatRequest, stopStrings } from '../openai-schema.js';
import type { ChatTokenizer, EncodedPrompt, RenderOptions, RenderResult } from './chat-tokenizer.js';
import { extendBody, rememberBody, type RememberedBody } from './body-memo.js';
import { checkContextLength, normalizeMessages } from './normalize.js';

/**
 * A chat-completion request, from its raw body to what the gateway sends. This runs on a tokenizer
 * worker: the event loop hands over the body bytes and gets back the prompt ids and the engine's
 * `/generate` body, so an OpenClaw-sized request (40 KB of JSON, 20k+ prompt ids) costs the event
 * loop a copy instead of a parse, a validation, a structured clone of the transcript and a
 * serialisation. The record stores the body bytes themselves (store/types.ts `ChatBody`).
 */

export interface PrepareParams {
  /** The record id, which is also the engine request's `rid`. */
  rid: string;
  /** K of the recorded top-K. */
  topK: number;
  /** max_new_tokens when the client sets none (capped by the context). */
  defaultMaxTokens: number;
  /** The session (`x-reef-tag-session`): its last prompt's id text is reused for the next. */
  sessionKey?: string | null;
}

/**
 * Runs what only later requests need (remembering this body for the next one to extend). The
 * tokenizer workers run it after they have answered, off the request's path; by default it runs at
 * once.
 */
export type Later = (task: () => void) => void;
const atOnce: Later = (task) => task();

export interface PreparedChat {
  ok: true;
  /** In shared memory, like `engineBody`; the session's id text keeps both, so neither may change. */
  promptIds: Int32Array;
  /** The `/generate` body (UTF-8 JSON) with `stream` as the client asked. */
  engineBody: Uint8Array;
  /**
   * Non-null when the body lies in the session's arena (generate-body.ts `BodyArena`): pass it to
   * `releaseBody` once the engine request has ended, so that the next turn can write in place.
   */
  bodyLease: Int32Array | null;
  /** The prompt ends inside an open thinking block, so output starts as reasoning. */
  startsInThinking: boolean;
  /** Tool calls are parsed from the output: the request offered tools, and not `tool_choice: "none"`. */
  tools: boolean;
  model: string | null;
  stream: boolean;
  includeUsage: boolean;
  /**
   * The request's stop strings: SGLang trims a matched one from the last event only, so a stream
   * holds back whatever could be the start of one (chat-stream.ts `settled`). Null: none.
   */
  stop: readonly string[] | null;
  /** The completion budget sent to the engine (what a tokens-per-minute limit charges beside the prompt). */
  maxNewTokens: number;
}

/** A request the gateway refuses: the OpenAI error to answer with (status from the code). */
export interface RefusedChat {
  ok: false;
  code: ErrorCode;
  message: string;
  param: string | null;
}

/**
 * What a tokenizer thread keeps per session (LRU, 64 sessions), and the newest of all. An agent
 * starts every session with the same system prompt and tools, so a session's first turn, or a
 * request without a session, shares most of its body and ids with the newest session's.
 */
class SessionMemo<T> {
  private readonly last = new Map<string, T>();
  private newest: T | null = null;

  own(sessionKey: string | null | undefined): T | undefined {
    return sessionKey ? this.last.get(sessionKey) : undefined;
  }

  /** The session's own, else the newest. */
  nearest(sessionKey: string | null | undefined): T | null {
    return this.own(sessionKey) ?? this.newest;
  }

  put(sessionKey: string | null | undefined, value: T): void {
    this.newest = value;
    if (!sessionKey) return;
    this.last.delete(sessionKey);
    this.last.set(sessionKey, value);
    if (this.last.size > 64) this.last.delete(this.last.keys().next().value as string);
  }
}

/**
 * The id list of each session's last engine body (generate-body.ts `IdText`): the next turn keeps
 * or copies the shared prefix instead of formatting 20k ids again. ~200 KB per session at OpenClaw
 * size.
 */
const idTexts = new SessionMemo<IdText>();

function engineBody(req: GenerateRequest, stream: boolean, sessionKey: string | null | undefined): { body: Uint8Array; lease: Int32Array | null } {
  const own = idTexts.own(sessionKey);
  const reuse = idTexts.nearest(sessionKey);
  if (!sessionKey) return { body: generateBody(req, stream, { reuse, shared: true }), lease: null };
  // Only the session's own last body may be written over; the newest one is another session's.
  const { body, idText, lease } = generateBody(req, stream, { reuse, keep: true, inPlace: own !== undefined });
  if (idText) idTexts.put(sessionKey, idText);
  return { body, lease };
}

/**
 * Each session's last rendered prompt with its ids: the next turn's render shares nearly all of
 * its text, and takes those ids from here instead of looking every piece up again (~40k
 * characters scanned and hashed per OpenClaw turn). Kept per tokenizer: ids hold only in the
 * vocabulary that made them, and two models can render the same text, so a thread with two
 * tokenizers (the gateway has one per thread; tests and embedders may not) must not mix them.
 */
const renderMemos = new WeakMap<ChatTokenizer, SessionMemo<EncodedPrompt>>();
function rendersOf(tokenizer: ChatTokenizer): SessionMemo<EncodedPrompt> {
  let memo = renderMemos.get(tokenizer);
  if (memo === undefined) renderMemos.set(tokenizer, (memo = new SessionMemo<EncodedPrompt>()));
  return memo;
}

function refuse(code: ErrorCode, message: string, param: string | null = null): RefusedChat {
  return { ok: false, code, message, param };
}

/** Each session's last body as parsed (body-memo.ts): a session's next body usually extends it. */
const bodies = new SessionMemo<RememberedBody>();

/** Bodies parsed as the extension of a remembered one, and bodies parsed whole, in this thread. */
export interface PrepareStats {
  bodies: { extended: number; whole: number };
}
const bodyCounts = { extended: 0, whole: 0 };

export function prepareStats(): PrepareStats {
  return { bodies: { ...bodyCounts } };
}

/**
 * The body's JSON, or why it is refused. `body` is kept (`bodies`), so the caller must not change
 * it afterwards.
 */
function parseBody(body: Uint8Array, sessionKey: string | null | undefined, later: Later): { json: unknown } | RefusedChat {
  const prev = bodies.nearest(sessionKey);
  // After the answer (`later`): this body, remembered for the session's next one to extend.
  const keep = (remember: () => RememberedBody | null) =>
    later(() => {
      const remembered = remember();
      if (remembered !== null) bodies.put(sessionKey, remembered);
    });
  const extended = prev ? extendBody(prev, body) : null;
  if (extended !== null) {
    // The remembered members passed these checks with the body they came from.
    for (const m of extended.added) {
      const problem = parsedBodyProblem(m, 3);
      if (problem !== null) return refuse('REEF_ERR_BODY', problem);
    }
    bodyCounts.extended++;
    keep(extended.remember);
    return { json: extended.json };
  }
  bodyCounts.whole++;
  const parsed = parseJsonBody(body);
  if ('problem' in parsed) return refuse('REEF_ERR_BODY', parsed.problem);
  const { json } = parsed;
  keep(() => rememberBody(body, json));
  return { json };
}

/**
 * The tool list a request's template is rendered with: none for an empty list, whose `tools is
 * not none` would open a tools section in some templates (Llama 3's) while `if tools` would not.
 */
export function templateTools(tools: readonly unknown[] | null | undefined): readonly unknown[] | null {
  return tools && tools.length > 0 ? tools : null;
}

/**
 * A request's messages and tools rendered as the gateway renders its prompt. The trainer-controller
 * renders a turn's teacher prompts with it, from the recorded request: a teacher prompt must differ
 * from the turn's own prompt by the hint alone.
 */
export function renderChat(tokenizer: ChatTokenizer, messages: readonly unknown[], tools: readonly unknown[] | null | undefined, opts: RenderOptions = {}): RenderResult {
  return tokenizer.render(normalizeMessages(messages), templateTools(tools), opts);
}

/**
 * The request's `chat_template_kwargs` (`{"enable_thinking": false}` from Qwen3 clients): extra
 * variables of the chat template, as vLLM and SGLang take them. A validated request, or a record's
 * `params`, which keep it, so that a teacher prompt renders as the turn's own did.
 */
export function templateKwargs(req: Record<string, unknown>): Record<string, unknown> | null {
  const k = req.chat_template_kwargs;
  return k !== null && typeof k === 'object' && !Array.isArray(k) ? (k as Record<string, unknown>) : null;
}

/** The sampling parameters a request states: a validated request, or a record's `params`. */
export interface RequestSampling {
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
}

/**
 * The distribution the engine samples from for a request: the client's values, else the engine's
 * defaults (temperature 1, top-p 1, top-k -1 = off). The trainer scores a recorded turn under the
 * same distribution (recipes/openclawrl/record2task.ts), so both take it from here: a `top_k` that
 * the record kept but the engine was never sent made the trainer truncate what the engine had not.
 */
export function engineSampling(req: RequestSampling): { temperature: number; top_p: number; top_k: number } {
  const k = req.top_k;
  return {
    temperature: req.temperature ?? 1.0,
    top_p: req.top_p ?? 1.0,
    // A record stored before top_k was checked and sent may hold any value; its engine got none.
    top_k: typeof k === 'number' && Number.isSafeInteger(k) && isTopK(k) ? k : -1,
  };
}

export function prepareChat(tokenizer: ChatTokenizer, body: Uint8Array, params: PrepareParams, later: Later = atOnce): PreparedChat | RefusedChat {
  const parsedBody = parseBody(body, params.sessionKey, later);
  if ('ok' in parsedBody) return parsedBody;
  const parsed = parseChatRequest(parsedBody.json);
  if (!parsed.ok) return refuse('REEF_ERR_INVALID_ARGUMENT', parsed.issue.message, parsed.issue.param);
  const req = parsed.value;
  const tools = templateTools(req.tools);

  let ids: Int32Array;
  let startsInThinking: boolean;
  try {
    const renders = rendersOf(tokenizer);
    const r = renderChat(tokenizer, req.messages, tools, { shared: true, prior: renders.nearest(params.sessionKey), extra: templateKwargs(req) });
    ids = r.ids;
    startsInThinking = tokenizer.endsInsideBlock(r, '<think>', '</think>');
    if (r.encoded !== null) renders.put(params.sessionKey, r.encoded);
  } catch (err) {
    if (err instanceof ReefError) return refuse(err.code, err.message);
    return refuse('REEF_ERR_INVALID_ARGUMENT', `cannot render the chat template: ${(err as Error).message}`);
  }

  const ctxLen = tokenizer.contextLength ?? 32_768;
  const asked = req.max_completion_tokens ?? req.max_tokens ?? null;
  try {
    // With no max_tokens the prompt must leave room for at least one new token.
    checkContextLength(ids.length, asked ?? 1, ctxLen);
  } catch (err) {
    // The messages, as OpenAI names them, unless a prompt that fits asked for too many new tokens.
    const param = asked !== null && ids.length < ctxLen ? (req.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens') : 'messages';
    return refuse((err as ReefError).code, (err as ReefError).message, param);
  }
  const room = ctxLen - ids.length;
  const maxNewTokens = Math.min(asked ?? params.defaultMaxTokens, room);
  const stop = stopStrings(req.stop);
  const sampling = engineSampling(req);
  const engineReq: GenerateRequest = {
    input_ids: ids,
    sampling_params: {
      max_new_tokens: maxNewTokens,
      temperature: sampling.temperature,
      top_p: sampling.top_p,
      // Only when it truncates: a body without top_k stays the bytes it was before top_k was sent.
      ...(sampling.top_k !== -1 ? { top_k: sampling.top_k } : {}),
      stop,
      ...(req.seed != null ? { sampling_seed: req.seed } : {}),
    },
    return_logprob: true,
    top_logprobs_num: params.topK,
    rid: params.rid,
  };
  const built = engineBody(engineReq, req.stream === true, params.sessionKey);
  return {
    ok: true,
    promptIds: ids,
    engineBody: built.body,
    bodyLease: built.lease,
    startsInThinking,
    tools: tools !== null && req.tool_choice !== 'none',
    model: req.model ?? null,
    stream: req.stream === true,
    includeUsage: req.stream_options?.include_usage === true,
    stop,
    maxNewTokens,
  };
}
