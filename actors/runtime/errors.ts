/**
 * The one registry of Reef error codes. Callers match on `code`, never on message text.
 * A retired code is never reused: mark it `retired: true` instead of deleting it.
 * `docs/errors.md` is kept in step by `errors.test.ts`.
 */

export interface ErrorSpec {
  /** Message template; `{name}` placeholders are filled from the params. */
  readonly message: string;
  /** HTTP status when the error reaches an HTTP client, or null when it never does. */
  readonly status: number | null;
  /** Whether the same call may succeed if retried unchanged. */
  readonly retryable: boolean;
  /** OpenAI error body `type` for HTTP responses. */
  readonly type: 'invalid_request_error' | 'authentication_error' | 'permission_error' | 'not_found_error' | 'conflict_error' | 'rate_limit_error' | 'server_error' | 'service_unavailable';
  readonly retired?: boolean;
}

export const ERRORS = {
  REEF_ERR_CONFIG_INVALID: { message: 'invalid config: {details}', status: null, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_CONFIG_FILE: { message: 'cannot read config file {path}: {reason}', status: null, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_BAD_MESSAGE: { message: 'malformed message: {details}', status: 400, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_UNKNOWN_MESSAGE: { message: 'no handler for message type {messageType}', status: 400, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_TIMEOUT: { message: '{what} timed out after {ms} ms', status: 504, retryable: true, type: 'server_error' },
  REEF_ERR_ACTOR_CLOSED: { message: 'actor {actor} is {state}', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_ACTOR_DRAINING: { message: 'actor {actor} is draining and takes no new work', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_HANDLER: { message: 'handler for {messageType} failed: {reason}', status: 500, retryable: false, type: 'server_error' },
  REEF_ERR_BRIDGE_DOWN: { message: 'python shim is not reachable: {reason}', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_SHIM: { message: 'python shim failed: {reason}', status: 500, retryable: false, type: 'server_error' },
  REEF_ERR_PLACEMENT: { message: 'cannot place {bundle}: {reason}', status: null, retryable: false, type: 'server_error' },
  REEF_ERR_RAY: { message: 'ray: {reason}', status: null, retryable: true, type: 'server_error' },
  REEF_ERR_ENGINE_START: { message: 'engine {engine} failed to start: {reason}', status: null, retryable: true, type: 'server_error' },
  REEF_ERR_ENGINE_DOWN: { message: 'engine {engine} is unavailable: {reason}', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_ENGINE_TIMEOUT: { message: 'engine {engine} did not answer within {seconds} s ({setting})', status: 504, retryable: true, type: 'service_unavailable' },
  REEF_ERR_NOT_FOUND: { message: '{what} not found', status: 404, retryable: false, type: 'not_found_error' },
  REEF_ERR_SUPERVISOR: { message: 'supervisor: {reason}', status: null, retryable: false, type: 'server_error' },
  REEF_ERR_NOT_RUNNING: { message: 'no running reef stack found at {path}', status: null, retryable: false, type: 'not_found_error' },
  REEF_ERR_ALREADY_RUNNING: { message: 'a reef stack is already running (pid {pid}, control {endpoint})', status: null, retryable: false, type: 'conflict_error' },
  REEF_ERR_INVALID_ARGUMENT: { message: '{details}', status: 400, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_UNAUTHORIZED: { message: 'missing or invalid API key: send Authorization: Bearer KEY or x-api-key: KEY', status: 401, retryable: false, type: 'authentication_error' },
  REEF_ERR_FORBIDDEN: { message: 'this API key may not use scenario {scenario}', status: 403, retryable: false, type: 'permission_error' },
  REEF_ERR_RATE_LIMITED: { message: 'too many concurrent requests for this API key (limit {limit})', status: 429, retryable: true, type: 'rate_limit_error' },
  REEF_ERR_BODY: { message: '{details}', status: 400, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_TOO_LARGE: { message: 'request body is larger than {limit} bytes', status: 413, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_ENGINE_FAILED: { message: 'engine {engine} failed mid-generation: {reason}', status: 502, retryable: true, type: 'server_error' },
  REEF_ERR_CONFLICT: { message: '{what} conflicts with an existing one: {details}', status: 409, retryable: false, type: 'conflict_error' },
  REEF_ERR_STORE: { message: 'record store: {reason}', status: 500, retryable: false, type: 'server_error' },
  REEF_ERR_STORE_CLOSED: { message: 'record store {path} is closed', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_STORE_BUSY: { message: 'record store {path} is busy: {what} waited {waitedMs} ms ({setting}) for its write lock, which another process (the judge or the trainer-controller, committing) held throughout; nothing was written, retry', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_QUEUE_FULL: { message: 'send queue of {queue} is full ({limit} messages waiting)', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_LIFECYCLE: { message: '{what} cannot go from {from} to {to}', status: null, retryable: false, type: 'server_error' },
  REEF_ERR_TOKENIZER: { message: 'cannot load the tokenizer of {modelDir}: {reason}', status: 500, retryable: false, type: 'server_error' },
  REEF_ERR_CONTEXT_LENGTH: { message: "This model's maximum context length is {contextLength} tokens. However, you requested {requested} tokens ({promptTokens} in the messages, {maxTokens} in the completion). Please reduce the length of the messages or completion.", status: 400, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_CHAT_TEMPLATE: { message: 'chat template failed: {reason}', status: 400, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_TRAINER: { message: 'trainer: {reason}', status: null, retryable: false, type: 'server_error' },
  REEF_ERR_TRAINER_RANK: { message: 'trainer rank {rank} failed: {reason}', status: null, retryable: true, type: 'server_error' },
  REEF_ERR_WEIGHT_SYNC: { message: 'weight sync into {engine} failed: {reason}', status: null, retryable: true, type: 'server_error' },
  REEF_ERR_HOST_NOT_ALLOWED: { message: 'Host {host} is not a name this listener answers to without an API key (localhost, 127.0.0.0/8, [::1] and the bind address are): add it to {setting} to allow it', status: 421, retryable: false, type: 'invalid_request_error' },
  REEF_ERR_ORIGIN_NOT_ALLOWED: { message: '{why}: without an API key, this listener answers browsers only from its own origin; add the origin to {setting} to allow it', status: 403, retryable: false, type: 'permission_error' },
  REEF_ERR_RATE_LIMIT: { message: 'rate limit of {limit} {unit} per minute reached ({setting}){detail}; retry in {retryAfterS} s', status: 429, retryable: true, type: 'rate_limit_error' },
  REEF_ERR_DISK_FULL: { message: 'the filesystem of {path} has {freeMb} MiB free, below {setting} ({minMb} MiB): a reply generated now could not be stored', status: 503, retryable: true, type: 'service_unavailable' },
  REEF_ERR_SCENARIO_LIMIT: { message: 'scenario {scenario} would be a new one, and this gateway already has {count} scenarios, the most {setting} allows ({limit})', status: 403, retryable: false, type: 'permission_error' },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERRORS;

export function isErrorCode(code: unknown): code is ErrorCode {
  return typeof code === 'string' && Object.hasOwn(ERRORS, code);
}

function render(template: string, params: Record<string, unknown>): string {
  return template.replace(/\{(\w+)\}/g, (whole, key: string) => (key in params ? String(params[key]) : whole));
}

/** An error with a stable code from the registry. */
export class ReefError extends Error {
  readonly code: ErrorCode;
  readonly retryable: boolean;
  readonly status: number | null;
  /** The request field at fault, for an HTTP error body's `param` (OpenAI's error shape); not sent between actors. */
  readonly param: string | null;

  constructor(code: ErrorCode, params: Record<string, unknown> = {}, options?: { cause?: unknown; message?: string; param?: string }) {
    const spec: ErrorSpec = ERRORS[code];
    super(options?.message ?? render(spec.message, params), options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'ReefError';
    this.code = code;
    this.retryable = spec.retryable;
    this.status = spec.status;
    this.param = options?.param ?? null;
  }

  /** The wire shape of an error reply (every key written, see STYLE.md §3). */
  toReply(requestId: string | null): ErrorReply {
    return { type: 'error', requestId, code: this.code, message: this.message, retryable: this.retryable };
  }

  /** Rebuild an error received on the wire; unknown codes (from a newer peer) keep their text. */
  static fromReply(reply: ErrorReply): ReefError {
    const code = isErrorCode(reply.code) ? reply.code : 'REEF_ERR_HANDLER';
    const err = new ReefError(code, {}, { message: reply.message });
    (err as { retryable: boolean }).retryable = reply.retryable;
    return err;
  }
}

export interface ErrorReply {
  type: 'error';
  requestId: string | null;
  code: string;
  message: string;
  retryable: boolean;
}
