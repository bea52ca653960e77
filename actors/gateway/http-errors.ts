import type { FastifyReply } from 'fastify';
import { ERRORS, ReefError, type ErrorCode } from '../runtime/errors.js';
import { anthropicErrorBody, anthropicErrorOf, isMessagesPath } from './anthropic/errors.js';

/** The OpenAI error body every Reef HTTP error uses. */
export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: string };
}

export function errorBody(code: ErrorCode, message: string, param: string | null = null): OpenAIErrorBody {
  return { error: { message, type: ERRORS[code].type, param, code } };
}

/**
 * Answers an error in the body of the API the request was made to: the Messages API's
 * (`/v1/messages`, routes/anthropic.ts) gets Anthropic's, whatever answers it (authentication, a
 * rate limit, the body's size, the route), and every other route OpenAI's.
 */
export function sendError(reply: FastifyReply, code: ErrorCode, message: string, opts: { param?: string | null; status?: number; retryAfterS?: number } = {}): FastifyReply {
  const status = opts.status ?? ERRORS[code].status ?? 500;
  if (opts.retryAfterS !== undefined) reply.header('retry-after', String(opts.retryAfterS));
  if (isMessagesPath(reply.request.url)) {
    const a = anthropicErrorOf(status);
    return reply.code(a.status).send(anthropicErrorBody(a.type, code, message));
  }
  return reply.code(status).send(errorBody(code, message, opts.param ?? null));
}

export function sendReefError(reply: FastifyReply, err: ReefError, param: string | null = null): FastifyReply {
  const retryAfterS = err.status === 503 || err.status === 429 ? 1 : undefined;
  return sendError(reply, err.code, err.message, { param: param ?? err.param, ...(retryAfterS === undefined ? {} : { retryAfterS }) });
}
