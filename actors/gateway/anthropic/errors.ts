import type { ErrorCode } from '../../runtime/errors.js';

/**
 * The Anthropic error body. Its `type` and the HTTP status follow Anthropic's table of errors
 * (docs/errors.md); `details.error_code` carries the Reef code, which the official SDK exposes as
 * `errorCode` (and treats as unknown, so as the bare `type`).
 */
export interface AnthropicErrorBody {
  type: 'error';
  error: { type: AnthropicErrorType; message: string; details: { error_code: ErrorCode } };
}

export type AnthropicErrorType = 'invalid_request_error' | 'authentication_error' | 'permission_error' | 'not_found_error' | 'request_too_large' | 'conflict_error' | 'rate_limit_error' | 'api_error' | 'timeout_error' | 'overloaded_error';

/**
 * The Anthropic status and type of an error Reef answers with `status`. A 503 (engine down, store
 * busy, draining, disk full) is Anthropic's 529 `overloaded_error`: retried by its clients, as the
 * 503 is by OpenAI's. Other 4xx keep their status as `invalid_request_error`, as Anthropic does
 * for the 4xx it does not list; other 5xx are its 500 `api_error`.
 */
export function anthropicErrorOf(status: number): { status: number; type: AnthropicErrorType } {
  switch (status) {
    case 400: return { status, type: 'invalid_request_error' };
    case 401: return { status, type: 'authentication_error' };
    case 403: return { status, type: 'permission_error' };
    case 404: return { status, type: 'not_found_error' };
    case 409: return { status, type: 'conflict_error' };
    case 413: return { status, type: 'request_too_large' };
    case 429: return { status, type: 'rate_limit_error' };
    case 503: return { status: 529, type: 'overloaded_error' };
    case 504: return { status, type: 'timeout_error' };
    default: return status < 500 ? { status, type: 'invalid_request_error' } : { status: 500, type: 'api_error' };
  }
}

export function anthropicErrorBody(type: AnthropicErrorType, code: ErrorCode, message: string): AnthropicErrorBody {
  return { type: 'error', error: { type, message, details: { error_code: code } } };
}

/** Whether a request path is the Messages API's, whose errors use the Anthropic body. */
export function isMessagesPath(url: string): boolean {
  return url === '/v1/messages' || url.startsWith('/v1/messages/') || url.startsWith('/v1/messages?');
}
