import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ReefError } from '../../runtime/errors.js';
import { SCENARIO_RE, SCENARIO_RULE } from '../../runtime/scenario-name.js';
import { canSee, type Principal } from '../auth.js';
import { sendError, sendReefError } from '../http-errors.js';
import { logprobToJson } from '../store/json-numbers.js';
import type { AgentRecord, RecordStore } from '../store/types.js';
import { type DeletionDeps, registerDeletionRoutes } from './deletion.js';
import { registerJudgedRoutes } from './judged.js';
import { scenarioOf } from './openai.js';
import type { DiskGuard, ScenarioCap } from '../limits.js';

/** The Reef HTTP API (records, reports, scenarios, status, releases). */

export interface ReefRouteDeps {
  store: RecordStore;
  defaultScenario: string;
  /** Everything `/reef/status` shows beyond the store (gateway, correlation, training). */
  status: () => Promise<Record<string, unknown>> | Record<string, unknown>;
  /** Releases of a scenario, newest first (from the trainer-controller's state). */
  releases?: (scenario: string) => Promise<unknown[]>;
  /** Puts an earlier release back into the engine; `keyId` is who asked (auth.ts Principal.id), for the log and the release. */
  rollback?: (scenario: string, body: unknown, keyId: string) => Promise<unknown>;
  /** Bounds how many scenarios there are (`reef.limits.max_scenarios`). @default null (unbounded) */
  scenarios?: ScenarioCap | null;
  /** Refuses writes when the data dir's disk is nearly full. @default null */
  disk?: DiskGuard | null;
  /** Deletion on request and lineage (routes/deletion.ts); absent: those routes are not served. @default null */
  deletion?: Omit<DeletionDeps, 'rollback'> | null;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

const CLIENT_ID_RE = /^[\x21-\x7e]{1,128}$/;
/** Receipts one report may reference: a session's turns are tens to hundreds. */
export const MAX_REFERENCES = 10_000;

/** Checks a report body; returns the first problem as [param, message], or null. */
export function checkReport(body: unknown): [string | null, string] | null {
  if (!isPlainObject(body)) return [null, 'request body must be a JSON object'];
  const { score, feedback, references, metadata, agent_record_id: clientId, scenario } = body;
  // Checked here rather than left to the header fallback: a report filed under another scenario
  // than the one named would train the wrong policy, and its references would not resolve.
  if (scenario !== undefined && scenario !== null && (typeof scenario !== 'string' || !SCENARIO_RE.test(scenario))) {
    return ['scenario', `scenario must be a scenario name (${SCENARIO_RULE}), got ${JSON.stringify(scenario)}`];
  }
  if (typeof score !== 'number' || !Number.isFinite(score)) return ['score', `score must be a finite number, got ${JSON.stringify(score) ?? String(score)}`];
  if (feedback !== undefined && feedback !== null && typeof feedback !== 'string' && !isPlainObject(feedback)) return ['feedback', 'feedback must be a string or an object'];
  if (references !== undefined && references !== null) {
    if (!Array.isArray(references) || references.some((r) => typeof r !== 'string')) return ['references', 'references must be an array of receipt ids (strings)'];
    // Each one is looked up inside the report's write transaction: a 64 MiB body of them held the
    // store's write lock, and the event loop, for seconds.
    if (references.length > MAX_REFERENCES) return ['references', `references may name at most ${MAX_REFERENCES} receipts, got ${references.length}`];
    // One pass with a set: searching the list for each entry held the event loop for a minute on
    // 50,000 references, a 1.3 MB body, and every chat completion with it.
    const seen = new Set<string>();
    for (const r of references as string[]) {
      if (seen.has(r)) return ['references', `reference ${r} appears twice`];
      seen.add(r);
    }
  }
  if (metadata !== undefined && metadata !== null && !isPlainObject(metadata)) return ['metadata', 'metadata must be an object'];
  // It goes back in the x-reef-agent-record-id header, which carries printable ASCII only; checked
  // here, before the report is stored, so that no stored report answers every retry with a 500.
  if (clientId !== undefined && clientId !== null && (typeof clientId !== 'string' || !CLIENT_ID_RE.test(clientId))) return ['agent_record_id', 'agent_record_id must be 1 to 128 printable ASCII characters, without spaces'];
  return null;
}

/** A listing's `limit` and `order`, or the problem (its first word the parameter's name). */
function pageQuery(query: { limit?: string; order?: string }): { limit: number; order: 'asc' | 'desc' } | string {
  const limit = query.limit === undefined ? 50 : Number(query.limit);
  if (!Number.isInteger(limit) || limit < 1 || limit > 1000) return 'limit must be an integer from 1 to 1000';
  const order = query.order ?? 'asc';
  // Any other value read as asc handed a client asking for the newest items the oldest ones.
  if (order !== 'asc' && order !== 'desc') return `order must be asc or desc, got ${JSON.stringify(order)}`;
  return { limit, order };
}

/**
 * A record as JSON: token payloads become plain arrays, top-K rows become [ids, logprobs] pairs.
 * Logprobs are written as `reef export` writes them (store/json-numbers.ts).
 */
export function recordJson(r: AgentRecord, judgment: unknown): Record<string, unknown> {
  const K = r.topK;
  const topk = Array.from({ length: r.outputIds.length }, (_, t) => ({
    ids: Array.from(r.topkIds.subarray(t * K, (t + 1) * K)),
    logprobs: Array.from(r.topkLogprobs.subarray(t * K, (t + 1) * K), logprobToJson),
  }));
  const { promptIds, outputIds, logprobs, topkIds: _ids, topkLogprobs: _lps, ...summary } = r;
  return { ...summary, promptIds: Array.from(promptIds), outputIds: Array.from(outputIds), logprobs: Array.from(logprobs, logprobToJson), topk, judgment: judgment ?? null };
}

export function registerReefRoutes(app: FastifyInstance, deps: ReefRouteDeps, principalOf: (req: FastifyRequest) => Principal): void {
  const guard = (request: FastifyRequest, reply: FastifyReply, scenario: string): boolean => {
    if (canSee(principalOf(request), scenario)) return true;
    // Scenarios a key may not use are invisible to it: answer as if they did not exist.
    sendError(reply, 'REEF_ERR_NOT_FOUND', `scenario ${scenario} not found`);
    return false;
  };
  const fail = (reply: FastifyReply, err: unknown) => {
    if (err instanceof ReefError) return sendReefError(reply, err);
    throw err;
  };

  app.post('/reef/report', async (request, reply) => {
    const problem = checkReport(request.body);
    if (problem) return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', problem[1], { param: problem[0] });
    const b = request.body as Record<string, unknown>;
    const scenario = typeof b.scenario === 'string' ? b.scenario : scenarioOf(request, deps.defaultScenario);
    if (!canSee(principalOf(request), scenario)) return sendReefError(reply, new ReefError('REEF_ERR_FORBIDDEN', { scenario }));
    const full = deps.disk?.check() ?? null;
    if (full !== null) return sendError(reply, full.code, full.message, { retryAfterS: 30 });
    try {
      const { report, created } = await deps.store.putReport({
        scenario,
        score: b.score as number,
        feedback: (b.feedback ?? null) as string | Record<string, unknown> | null,
        references: (b.references ?? []) as string[],
        metadata: (b.metadata ?? null) as Record<string, unknown> | null,
        clientId: (b.agent_record_id ?? null) as string | null,
        keyId: principalOf(request).id,
      });
      return reply.code(created ? 201 : 200).header('x-reef-agent-record-id', report.clientId ?? report.id).send({ ...report, agent_record_id: report.clientId ?? report.id, created });
    } catch (err) {
      return fail(reply, err);
    }
  });

  app.get('/reef/scenarios', async (request) => {
    const p = principalOf(request);
    return { data: (await deps.store.listScenarios()).filter((s) => canSee(p, s.name)) };
  });

  app.post('/reef/scenarios', async (request, reply) => {
    const b = request.body;
    if (!isPlainObject(b) || typeof b.name !== 'string') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', 'body must be {"name": string, "description"?: string}', { param: 'name' });
    // Refused rather than dropped: the scenario would exist without it, and a retry with the
    // description fixed would then get a 409.
    if (b.description !== undefined && b.description !== null && typeof b.description !== 'string') {
      return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `description must be a string, got ${JSON.stringify(b.description)}`, { param: 'description' });
    }
    if (!canSee(principalOf(request), b.name)) return sendReefError(reply, new ReefError('REEF_ERR_FORBIDDEN', { scenario: b.name }));
    const capped = deps.scenarios?.admit(b.name) ?? null;
    if (capped !== null) return sendReefError(reply, capped, 'name');
    try {
      return reply.code(201).send(await deps.store.createScenario(b.name, typeof b.description === 'string' ? b.description : null));
    } catch (err) {
      return fail(reply, err);
    }
  });

  type PageRequest = FastifyRequest<{ Params: { s: string }; Querystring: { after?: string; limit?: string; order?: string } }>;
  /** A scenario's rows, a page of them, as `{data, next}`: records and reports are paged alike. */
  const paged = async <T>(request: PageRequest, reply: FastifyReply, list: (o: { scenario: string; after: string | null; limit: number; order: 'asc' | 'desc' }) => Promise<{ items: T[]; next: string | null }>, show: (row: T) => unknown = (row) => row) => {
    const { s } = request.params;
    if (!guard(request, reply, s)) return reply;
    const q = pageQuery(request.query);
    if (typeof q === 'string') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', q, { param: q.split(' ')[0]! });
    try {
      const page = await list({ scenario: s, after: request.query.after ?? null, ...q });
      return { data: page.items.map(show), next: page.next };
    } catch (err) {
      return fail(reply, err);
    }
  };

  app.get<{ Params: { s: string }; Querystring: { after?: string; limit?: string; order?: string } }>('/reef/scenarios/:s/records', (request, reply) =>
    paged(request, reply, (o) => deps.store.list(o)));

  // The audit of reports: who filed what (keyId), oldest first by default, paged as records are.
  app.get<{ Params: { s: string }; Querystring: { after?: string; limit?: string; order?: string } }>('/reef/scenarios/:s/reports', (request, reply) =>
    paged(request, reply, (o) => deps.store.listReports(o), (r) => ({ ...r, agent_record_id: r.clientId ?? r.id })));

  app.get<{ Params: { s: string; id: string } }>('/reef/scenarios/:s/records/:id', async (request, reply) => {
    const { s, id } = request.params;
    if (!guard(request, reply, s)) return reply;
    const rec = await deps.store.get(id);
    if (!rec || rec.scenario !== s) return sendError(reply, 'REEF_ERR_NOT_FOUND', `record ${id} not found in scenario ${s}`);
    return recordJson(rec, await deps.store.getJudgment(id));
  });

  app.get<{ Params: { s: string } }>('/reef/scenarios/:s/releases', async (request, reply) => {
    const { s } = request.params;
    if (!guard(request, reply, s)) return reply;
    return { data: deps.releases ? await deps.releases(s) : [] };
  });

  app.post<{ Params: { s: string } }>('/reef/scenarios/:s/releases/rollback', async (request, reply) => {
    const { s } = request.params;
    if (!guard(request, reply, s)) return reply;
    // Weights are shared: a rollback changes what every scenario is served, so a key limited to
    // some scenarios may not order one.
    if (principalOf(request).scenarios !== null) {
      return sendReefError(reply, new ReefError('REEF_ERR_FORBIDDEN', {}, { message: 'a rollback changes the weights every scenario is served with, so it needs an API key that is not limited to scenarios' }));
    }
    // A conflict with how the stack runs, not an outage: REEF_ERR_ACTOR_CLOSED (503, retryable) told
    // clients that matched on the code to retry what no retry will change.
    if (!deps.rollback) return sendError(reply, 'REEF_ERR_CONFLICT', 'training is not running in this stack, so there is nothing to roll back');
    // A body without release_id means "the previous release", so a misspelt key or a bare string
    // would otherwise roll every scenario's weights back to a release nobody asked for.
    const b = request.body;
    if (b !== undefined && b !== null) {
      const unknown = isPlainObject(b) ? Object.keys(b).find((k) => k !== 'release_id') : undefined;
      if (!isPlainObject(b) || unknown !== undefined) {
        return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `body must be {"release_id": id | "base" | null}${unknown === undefined ? '' : `, got the unknown key ${JSON.stringify(unknown)}`}`, { param: unknown ?? null });
      }
      if (b.release_id !== undefined && b.release_id !== null && typeof b.release_id !== 'string') {
        return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', 'release_id must be a release id, "base" or null', { param: 'release_id' });
      }
    }
    try {
      return await deps.rollback(s, request.body, principalOf(request).id);
    } catch (err) {
      return fail(reply, err);
    }
  });

  app.get('/reef/status', async () => ({ ...(await deps.status()), store: deps.store.stats() }));
  registerJudgedRoutes(app, { store: deps.store, canRollback: deps.rollback !== undefined }, principalOf, guard, fail);
  if (deps.deletion) registerDeletionRoutes(app, { ...deps.deletion, ...(deps.rollback ? { rollback: deps.rollback } : {}) }, principalOf, guard, fail);
}
