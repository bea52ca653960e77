import { isAscii, isUtf8, transcode } from 'node:buffer';
import type { GenerateRequest } from '../../../cluster/engine-client.js';
import { generateBody, type IdText } from '../../../cluster/generate-body.js';
import { ReefError, type ErrorCode } from '../../runtime/errors.js';
import { parsedBodyProblem } from '../body-checks.js';
import { parseChatRequest } from '../openai-schema.js';
import type { ChatTokenizer } from './chat-tokenizer.js';
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

export interface PreparedChat {
  ok: true;
  promptIds: Int32Array;
  /** The `/generate` body (UTF-8 JSON) with `stream` as the client asked. */
  engineBody: Uint8Array;
  /** The prompt ends inside an open thinking block, so output starts as reasoning. */
  startsInThinking: boolean;
  model: string | null;
  stream: boolean;
  includeUsage: boolean;
}

/** A request the gateway refuses: the OpenAI error to answer with (status from the code). */
export interface RefusedChat {
  ok: false;
  code: ErrorCode;
  message: string;
  param: string | null;
}

/**
 * Per session, the id list of its last engine body (generate-body.ts `IdText`), LRU: the next turn
 * copies the shared prefix instead of formatting 20k ids again. ~200 KB per session at OpenClaw
 * size, so 64 sessions per tokenizer thread.
 */
const lastIdText = new Map<string, IdText>();
const LAST_ID_TEXT_SESSIONS = 64;
/**
 * The newest of them. A session's first turn, or a request without a session, has no id text of
 * its own, but an agent starts every session with the same system prompt and tools: ~20k of an
 * OpenClaw prompt's ids are the same as in the last session's.
 */
let newestIdText: IdText | null = null;

function engineBody(req: GenerateRequest, stream: boolean, sessionKey: string | null | undefined): Uint8Array {
  const reuse = (sessionKey ? lastIdText.get(sessionKey) : undefined) ?? newestIdText;
  if (!sessionKey) return generateBody(req, stream, { reuse });
  const { body, idText } = generateBody(req, stream, { reuse, keep: true });
  lastIdText.delete(sessionKey);
  if (idText) lastIdText.set(sessionKey, idText);
  newestIdText = idText ?? newestIdText;
  if (lastIdText.size > LAST_ID_TEXT_SESSIONS) lastIdText.delete(lastIdText.keys().next().value as string);
  return body;
}

const utf8 = new TextDecoder();

/**
 * The body as text, exactly as `TextDecoder` decodes it, faster. Agent transcripts are mostly
 * ASCII with some non-ASCII text spread through them (quotes, accents, emoji), and for those V8's
 * UTF-8 decoder took ~65–95 µs per 38 KB body; converting to UTF-16 natively and reading that takes
 * ~12–25 µs. Only well-formed UTF-8 without a byte-order mark goes that way: for anything else
 * (replacement characters, a BOM to drop) `TextDecoder` itself decides.
 */
export function utf8Text(body: Uint8Array): string {
  const b = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  if (isAscii(b)) return b.toString('latin1');
  if (isUtf8(b) && !(b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf)) {
    const u16 = transcode(b, 'utf8', 'utf16le');
    return u16.toString('utf16le');
  }
  return utf8.decode(body);
}

function refuse(code: ErrorCode, message: string, param: string | null = null): RefusedChat {
  return { ok: false, code, message, param };
}

function parseBody(body: Uint8Array): { json: unknown } | RefusedChat {
  let json: unknown;
  try {
    json = JSON.parse(utf8Text(body));
  } catch (err) {
    return refuse('REEF_ERR_BODY', `request body is not valid JSON: ${(err as Error).message}`);
  }
  const problem = parsedBodyProblem(json);
  return problem === null ? { json } : refuse('REEF_ERR_BODY', problem);
}

export function prepareChat(tokenizer: ChatTokenizer, body: Uint8Array, params: PrepareParams): PreparedChat | RefusedChat {
  const parsedBody = parseBody(body);
  if ('ok' in parsedBody) return parsedBody;
  const parsed = parseChatRequest(parsedBody.json);
  if (!parsed.ok) return refuse('REEF_ERR_INVALID_ARGUMENT', parsed.issue.message, parsed.issue.param);
  const req = parsed.value;
  const tools = req.tools && req.tools.length > 0 ? req.tools : null;

  let ids: Int32Array;
  let text: string;
  try {
    ({ ids, text } = tokenizer.render(normalizeMessages(req.messages), tools));
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
    return refuse((err as ReefError).code, (err as ReefError).message);
  }
  const room = ctxLen - ids.length;
  const stop = req.stop == null ? null : Array.isArray(req.stop) ? req.stop : [req.stop];
  const engineReq: GenerateRequest = {
    input_ids: ids,
    sampling_params: {
      max_new_tokens: Math.min(asked ?? params.defaultMaxTokens, room),
      temperature: req.temperature ?? 1.0,
      top_p: req.top_p ?? 1.0,
      stop,
      ...(req.seed != null ? { sampling_seed: req.seed } : {}),
    },
    return_logprob: true,
    top_logprobs_num: params.topK,
    rid: params.rid,
  };
  return {
    ok: true,
    promptIds: ids,
    engineBody: engineBody(engineReq, req.stream === true, params.sessionKey),
    startsInThinking: text.lastIndexOf('<think>') > text.lastIndexOf('</think>'),
    model: req.model ?? null,
    stream: req.stream === true,
    includeUsage: req.stream_options?.include_usage === true,
  };
}
