import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ReefError } from '../../runtime/errors.js';
import type { Principal } from '../auth.js';
import type { Forgotten } from '../forget-rpc.js';
import { sendError, sendReefError } from '../http-errors.js';
import { type Lineage, lineageOf } from '../lineage.js';
import type { DeletionCounts, DeletionTarget } from '../store/deletion.js';
import type { Release } from '../../trainer-controller/controller.js';

/**
 * A user takes their data back (docs/internals.md, "Deletion on request"):
 * - `DELETE /reef/scenarios/{s}/sessions/{tag}`: the records of one session (`x-reef-tag-session`);
 * - `DELETE /reef/scenarios/{s}/records`: every record of the scenario;
 * - `GET /reef/scenarios/{s}/lineage?session=TAG` or `?record=ID`: which batches and releases
 *   trained on them, and the release a rollback would go back to.
 * Either DELETE takes `?rollback=true`: when the serving weights were trained on the data, the
 * scenario is rolled back to the last release before it (the rollback route's rules apply: a key
 * limited to scenarios may not, since weights are every scenario's).
 */

export interface DeletionDeps {
  /** The store's deletion (sqlite-store.ts deleteRecords) with the actors' forget call bound in. */
  deleteRecords(target: DeletionTarget): Promise<DeletionCounts & { ids: string[]; forgotten: Forgotten | null }>;
  recordIdsOf(target: DeletionTarget): Promise<string[]>;
  batchesOf(ids: readonly string[]): Promise<Map<string, string[]>>;
  /** Every release, oldest first. */
  releases(): Promise<Release[]>;
  /** The rollback route's action; absent where training does not run. */
  rollback?: (scenario: string, body: unknown, keyId: string) => Promise<unknown>;
}

type Guard = (request: FastifyRequest, reply: FastifyReply, scenario: string) => boolean;
type Fail = (reply: FastifyReply, err: unknown) => unknown;

function lineageJson(l: Lineage): Record<string, unknown> {
  return {
    batches: l.batches.map((b) => ({ batch_id: b.batchId, turns: b.turns, release_id: b.release })),
    releases: l.tainted,
    current_release: l.current,
    serving_trained: l.servingTrained,
    rollback_to: l.rollbackTo,
  };
}

const countsJson = (c: DeletionCounts, forgotten: Forgotten | null): Record<string, unknown> => ({
  records: c.records,
  judgments: c.judgments,
  judged_turns: c.judgedTurns,
  reports: c.reports,
  stored_responses: c.responses,
  pending_judgments: c.pendingJudgments + (forgotten?.judge ?? 0),
  unbatched_tasks: forgotten?.trainerController ?? 0,
  chunks: c.chunks,
  pages_vacuumed: c.vacuumed,
  wal_truncated: c.walTruncated,
});

export function registerDeletionRoutes(app: FastifyInstance, deps: DeletionDeps, principalOf: (req: FastifyRequest) => Principal, guard: Guard, fail: Fail): void {
  const remove = async (request: FastifyRequest<{ Querystring: { rollback?: string } }>, reply: FastifyReply, target: DeletionTarget) => {
    if (!guard(request, reply, target.scenario)) return reply;
    const q = request.query.rollback;
    if (q !== undefined && q !== 'true' && q !== 'false') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `rollback must be true or false, got ${JSON.stringify(q)}`, { param: 'rollback' });
    const rollback = q === 'true';
    // Refused before anything is deleted, so the client can ask again without it.
    if (rollback && principalOf(request).scenarios !== null) {
      return sendReefError(reply, new ReefError('REEF_ERR_FORBIDDEN', {}, { message: 'rollback=true changes the weights every scenario is served with, so it needs an API key that is not limited to scenarios; delete without it and ask an operator to roll back' }));
    }
    if (rollback && !deps.rollback) return sendError(reply, 'REEF_ERR_CONFLICT', 'training is not running in this stack, so there is nothing to roll back; delete without rollback=true');
    try {
      // Lineage first: the ids are gone from the records after, and the batches name them.
      const before = await deps.recordIdsOf(target);
      const lineage = lineageOf(await deps.batchesOf(before), await deps.releases());
      const done = await deps.deleteRecords(target);
      // An interrupted earlier run may have found more ids than are left: their lineage counts too.
      const l = done.ids.length > before.length ? lineageOf(await deps.batchesOf(done.ids), await deps.releases()) : lineage;
      let rolledBack: unknown = null;
      if (rollback && l.rollbackTo !== null) {
        try {
          rolledBack = await deps.rollback!(target.scenario, { release_id: l.rollbackTo }, principalOf(request).id);
        } catch (err) {
          // The data is gone by now and a retry finds nothing to trace: the answer says what the
          // rollback should have been, for the rollback route, rather than failing the deletion.
          if (!(err instanceof ReefError)) throw err;
          rolledBack = { error: { code: err.code, message: err.message, retryable: err.retryable }, release_id: l.rollbackTo };
        }
      }
      return {
        scenario: target.scenario,
        session: target.session,
        deleted: countsJson(done, done.forgotten),
        lineage: lineageJson(l),
        rollback: rolledBack,
      };
    } catch (err) {
      return fail(reply, err);
    }
  };

  app.delete<{ Params: { s: string; tag: string }; Querystring: { rollback?: string } }>('/reef/scenarios/:s/sessions/:tag', (request, reply) =>
    remove(request, reply, { scenario: request.params.s, session: request.params.tag }));

  app.delete<{ Params: { s: string }; Querystring: { rollback?: string } }>('/reef/scenarios/:s/records', (request, reply) =>
    remove(request, reply, { scenario: request.params.s, session: null }));

  app.get<{ Params: { s: string }; Querystring: { session?: string; record?: string } }>('/reef/scenarios/:s/lineage', async (request, reply) => {
    const { s } = request.params;
    if (!guard(request, reply, s)) return reply;
    const { session, record } = request.query;
    if ((session === undefined) === (record === undefined) || session === '' || record === '') {
      return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', 'give one of session=TAG or record=ID', { param: session === undefined ? 'session' : 'record' });
    }
    try {
      // A record id is taken as given, deleted or not: the batch rows outlive the records.
      const ids = session !== undefined ? await deps.recordIdsOf({ scenario: s, session }) : [record!];
      const batches = await deps.batchesOf(ids);
      // A record of another scenario is not this one's to show.
      const l = lineageOf(new Map([...batches].map(([id, b]) => [id, b.filter((x) => x.startsWith(`${s}:`))] as const).filter(([, b]) => b.length > 0)), await deps.releases());
      return { scenario: s, ...(session !== undefined ? { session, records: ids.length } : { record }), ...lineageJson(l) };
    } catch (err) {
      return fail(reply, err);
    }
  });
}
