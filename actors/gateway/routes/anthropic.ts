import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { releaseBody } from '../../../cluster/generate-body.js';
import { parseJsonBody } from '../body-checks.js';
import { prepare, type ChatDeps, type Prepared } from '../chat.js';
import { sendError } from '../http-errors.js';
import { MessagesRequestError, restate, toChatRequest, type TranslatedRequest } from '../anthropic/request.js';
import { MessagesFraming, toMessage, type MessageContext } from '../anthropic/response.js';
import { admitHook, answerOnce, replyWithError, sharedJson, takeAdmitted, type OpenAIRouteOptions } from './common.js';
import { readSharedBody, serveChat, stream } from './openai.js';

/**
 * The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`. A request
 * is translated into the chat-completions request of the same conversation (anthropic/request.ts)
 * and served by the chat pipeline, admitted as a chat completion is (routes/common.ts `admit`,
 * before its body is read), so its record, receipt, tags, limits and training are the chat path's.
 * Errors, whoever answers them, use Anthropic's body (http-errors.ts). `anthropic-version` and
 * `anthropic-beta` are accepted and not required: this API has one version here.
 */
export function registerAnthropicRoutes(app: FastifyInstance, deps: ChatDeps, opts: OpenAIRouteOptions): void {
  void app.register(async (scope) => {
    // Raw bytes, as for chat completions: the body limit and the admission come before the upload.
    scope.removeContentTypeParser('application/json');
    scope.addContentTypeParser('application/json', (request, payload, done) => readSharedBody(request, payload, done));

    scope.post('/v1/messages', { preParsing: admitHook(deps, opts) }, async (request, reply) => {
      const t = translated(request, reply, true);
      if (t === null) return reply;
      const chat = sharedJson(t.chat);
      return serveChat(deps, request, reply, chat, (p) => (p.stream ? streamMessage(deps, p, reply) : answerOnce(deps, p, reply, (body) => toMessage(body, contextOf(deps, p)))), (r) => ({ ...r, message: restate(r.message, t.origins), param: r.param === null ? null : restate(r.param, t.origins) }));
    });

    // Renders and tokenizes as a generation would, and counts: no engine, no record.
    scope.post('/v1/messages/count_tokens', { preParsing: admitHook(deps, opts, false) }, async (request, reply) => {
      const t = translated(request, reply, false);
      if (t === null) return reply;
      const admitted = takeAdmitted(request);
      try {
        const p = await prepare(deps, sharedJson(t.chat), { scenario: admitted.scenario, keyId: admitted.principal.id, tags: admitted.tags, sessionKey: null, startedAt: Date.now() });
        if (!('id' in p)) return sendError(reply, p.code, restate(p.message, t.origins));
        releaseBody(p.bodyLease);
        return { input_tokens: p.promptIds.length };
      } catch (err) {
        return replyWithError(reply, err);
      } finally {
        admitted.release();
      }
    });
  });
}

/** The request's body as the chat request it stands for; answers (and gives the slot back) and returns null when refused. */
function translated(request: FastifyRequest, reply: FastifyReply, generate: boolean): TranslatedRequest | null {
  const refuse = (code: 'REEF_ERR_BODY' | 'REEF_ERR_INVALID_ARGUMENT', message: string) => {
    takeAdmitted(request).release();
    sendError(reply, code, message);
    return null;
  };
  // text/plain arrives as a string (fastify's text parser): not a request object.
  if (!(request.body instanceof Uint8Array)) return refuse('REEF_ERR_INVALID_ARGUMENT', 'request body must be a JSON object');
  const parsed = parseJsonBody(request.body);
  if ('problem' in parsed) return refuse('REEF_ERR_BODY', parsed.problem);
  try {
    return toChatRequest(parsed.json, generate);
  } catch (err) {
    if (err instanceof MessagesRequestError) return refuse('REEF_ERR_INVALID_ARGUMENT', err.message);
    // A fault of the translation itself: the handler's error answers, and the slot must not stay taken.
    takeAdmitted(request).release();
    throw err;
  }
}

function contextOf(deps: ChatDeps, p: Prepared): MessageContext {
  return { id: p.id, model: p.model ?? deps.modelName, inputTokens: p.promptIds.length, stop: p.stop, finish: () => p.finish };
}

function streamMessage(deps: ChatDeps, p: Prepared, reply: FastifyReply): Promise<FastifyReply> {
  // message_delta carries the output's token count, from the pipeline's usage chunk.
  p.includeUsage = true;
  return stream(deps, p, reply, new MessagesFraming(contextOf(deps, p)));
}
