import type { FastifyInstance, FastifyReply } from 'fastify';
import { prepare, type ChatDeps, type Prepared } from '../chat.js';
import { sendError } from '../http-errors.js';
import { SESSION_DONE_WITHOUT_SESSION } from '../session-headers.js';
import type { Principal } from '../auth.js';
import type { ResponseStore, StoredResponse } from '../store/responses.js';
import { responseEventSink } from '../responses/events.js';
import { outputItems, readResponsesRequest, responseObject, responseOfItem, storedIdOf, type AssistantMessage, type ResponsesRequest } from '../responses/translate.js';
import { answerOnce, chargeTokens, generating, sessionCacheKey, sharedJson, streamTo, type OpenAIRouteOptions } from './common.js';
import { parseJsonBody } from '../body-checks.js';

/**
 * `POST /v1/responses` (the OpenAI Responses API) and its stored responses. A request becomes the
 * chat-completion body that asks the same (responses/translate.ts) and runs through the chat
 * pipeline, so its record, receipt, correlation and training are those of a chat completion.
 *
 * The session tag of its record, first that applies:
 * 1. the client's own (`x-session-id` or `x-reef-tag-session`, else the `session_id` header
 *    OpenClaw's provider library sends);
 * 2. the session of the response named by `previous_response_id`;
 * 3. the session of the newest stored response an input item came from (by the item ids this
 *    gateway gives: a client that resends the whole conversation with its items' ids, as the
 *    OpenAI Agents SDK does, stays in one session);
 * 4. with `store` (the default), `resp_<id>` of this response itself: it starts a conversation
 *    that later turns continue under 1 to 3;
 * 5. none (`store: false` with nothing above): the judge correlates it by its transcript, as an
 *    untagged chat completion.
 */

/** A chat refusal's param in the Responses API's terms, where the fields differ. */
function responsesParam(param: string | null): string | null {
  if (param === null) return null;
  if (param === 'max_tokens' || param === 'max_completion_tokens') return 'max_output_tokens';
  if (param.startsWith('messages')) return 'input';
  return param;
}

async function sessionOf(store: ResponseStore, principal: Principal, tags: Record<string, string>, req: ResponsesRequest, previous: StoredResponse | null): Promise<string | null> {
  if (tags['session']) return tags['session'];
  if (previous !== null) return previous.session;
  for (let i = req.inputItems.length - 1; i >= 0; i--) {
    const id = responseOfItem(req.inputItems[i]);
    if (id === null) continue;
    const row = await store.getResponse(id, principal.id);
    if (row !== null) return row.session;
  }
  return null;
}

export function registerResponsesCreate(scope: FastifyInstance, deps: ChatDeps, store: ResponseStore): void {
  scope.post('/v1/responses', (request, reply) =>
    generating(deps, request, reply, async (admitted, hold) => {
      const { principal, scenario } = admitted;
      const raw = request.body;
      if (!(raw instanceof Uint8Array)) return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', 'body: request body must be a JSON object');
      const parsed = parseJsonBody(raw);
      if ('problem' in parsed) return sendError(reply, 'REEF_ERR_BODY', parsed.problem);
      const req = readResponsesRequest(parsed.json);
      if ('error' in req) return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', req.error, { param: req.param });

      let previous: StoredResponse | null = null;
      if (req.previousResponseId !== null) {
        const id = storedIdOf(req.previousResponseId);
        previous = id === null ? null : await store.getResponse(id, principal.id);
        // OpenAI's answer, which clients recognise to retry with the whole conversation.
        if (previous === null) return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `Previous response with id '${req.previousResponseId}' not found.`, { param: 'previous_response_id' });
        if (previous.scenario !== scenario) {
          return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `previous response ${req.previousResponseId} belongs to scenario ${JSON.stringify(previous.scenario)}, not ${JSON.stringify(scenario)}: a conversation stays in one scenario`, { param: 'x-reef-scenario' });
        }
      }
      const tags = { ...admitted.tags };
      const session = await sessionOf(store, principal, tags, req, previous);
      if (session !== null) tags['session'] = session;
      // Checked here, not with the other headers: a chain's session is known only now.
      if (tags['session-done'] === 'true' && session === null && !req.store) {
        return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `${SESSION_DONE_WITHOUT_SESSION} (or continue a stored response: previous_response_id)`, { param: 'x-session-done' });
      }

      // Instructions are the request's own: a continuation does not inherit the previous ones.
      const conversation = [...(previous?.conversation ?? []), ...req.messages];
      const messages = req.instructions === null ? conversation : [{ role: 'system', content: req.instructions }, ...conversation];
      const chatBody = { ...req.chat, messages, stream: req.stream, ...(req.stream ? { stream_options: { include_usage: true } } : {}) };
      const ctx = { scenario, keyId: principal.id, tags, sessionKey: sessionCacheKey(scenario, principal.id, session), startedAt: Date.now() };
      const p = await prepare(deps, sharedJson(chatBody), ctx);
      if (!('id' in p)) return sendError(reply, p.code, p.message, { param: responsesParam(p.param) });
      hold(p);
      if (session === null && req.store) p.ctx.tags = { ...tags, session: `resp_${p.id}` };
      const refused = chargeTokens(principal, p, reply, 'max_output_tokens');
      if (refused !== null) return refused;

      const model = p.model ?? deps.modelName;
      const complete = async (message: AssistantMessage, response: Record<string, unknown>) => {
        if (!req.store) return;
        await store.putResponse({
          id: p.id,
          keyId: principal.id,
          scenario,
          previousId: previous?.id ?? null,
          session: p.ctx.tags['session'] ?? null,
          createdAt: p.ctx.startedAt,
          conversation: [...conversation, message],
          inputItems: req.inputItems,
          response,
        });
      };
      if (req.stream) return streamed(deps, p, reply, req, model, complete);
      return once(deps, p, reply, req, model, complete);
    }),
  );
}

type Complete = (message: AssistantMessage, response: Record<string, unknown>) => Promise<void>;

function once(deps: ChatDeps, p: Prepared, reply: FastifyReply, req: ResponsesRequest, model: string, complete: Complete): Promise<FastifyReply> {
  return answerOnce(deps, p, reply, async (answer) => {
    const body = answer as { choices: [{ message: AssistantMessage & { refusal?: unknown }; finish_reason: string }]; usage: { prompt_tokens: number; completion_tokens: number } };
    const { refusal: _refusal, ...message } = body.choices[0].message;
    const status = body.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed';
    const response = responseObject(req, { id: p.id, createdAt: p.ctx.startedAt, model, status, output: outputItems(p.id, message, status), usage: { prompt: body.usage.prompt_tokens, completion: body.usage.completion_tokens } });
    // Stored before the answer goes out: a client may continue from it at once.
    await complete(message, response);
    return response;
  });
}

function streamed(deps: ChatDeps, p: Prepared, reply: FastifyReply, req: ResponsesRequest, model: string, complete: Complete): Promise<FastifyReply> {
  return streamTo(deps, p, reply, (sse) =>
    responseEventSink(sse, {
      responseId: p.id,
      snapshot: (status, output, usage) => responseObject(req, { id: p.id, createdAt: p.ctx.startedAt, model, status, output, usage }),
      complete,
    }),
  );
}

/** GET and DELETE of stored responses, and their input items: reached by the key that made them only. */
export function registerResponsesStore(app: FastifyInstance, opts: OpenAIRouteOptions, store: ResponseStore): void {
  const find = async (apiId: string, keyId: string): Promise<StoredResponse | null> => {
    const id = storedIdOf(apiId);
    return id === null ? null : store.getResponse(id, keyId);
  };
  const notFound = (reply: FastifyReply, apiId: string) => sendError(reply, 'REEF_ERR_NOT_FOUND', `Response with id '${apiId}' not found.`, { param: 'response_id' });

  app.get<{ Params: { id: string } }>('/v1/responses/:id', async (request, reply) => {
    const row = await find(request.params.id, opts.principalOf(request).id);
    return row === null ? notFound(reply, request.params.id) : row.response;
  });
  app.get<{ Params: { id: string }; Querystring: { order?: string } }>('/v1/responses/:id/input_items', async (request, reply) => {
    const row = await find(request.params.id, opts.principalOf(request).id);
    if (row === null) return notFound(reply, request.params.id);
    const order = request.query.order ?? 'desc';
    if (order !== 'asc' && order !== 'desc') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `order must be asc or desc, got ${JSON.stringify(order)}`, { param: 'order' });
    // Items without an id of their own get one that is stable for the stored response.
    const items = row.inputItems.map((item, i) => ({ id: `in_${row.id}_${i}`, ...(item as Record<string, unknown>) }));
    if (order === 'desc') items.reverse();
    return { object: 'list', data: items, first_id: items[0]?.id ?? null, last_id: items[items.length - 1]?.id ?? null, has_more: false };
  });
  app.delete<{ Params: { id: string } }>('/v1/responses/:id', async (request, reply) => {
    const id = storedIdOf(request.params.id);
    const deleted = id !== null && (await store.deleteResponse(id, opts.principalOf(request).id));
    return deleted ? { id: request.params.id, object: 'response', deleted: true } : notFound(reply, request.params.id);
  });
}
