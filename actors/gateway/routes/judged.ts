import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { formattingOf, PLAIN_ANSWER_RULE, type Violation } from '../../../recipes/openclawrl/harness/scoring.js';
import { clip } from '../../../recipes/openclawrl/judge/prompts.js';
import { type Principal } from '../auth.js';
import { sendError } from '../http-errors.js';
import { MAX_SERIES } from '../store/judged-turns.js';
import type { JudgedPoint, RecordStore } from '../store/types.js';

/**
 * What the live page (GET /reef/ui) reads beyond the records: a scenario's judged turns with their
 * votes and hints, its reward and habit curves, and what the asking key may do. Scoped to the
 * key's scenarios exactly as the records are (`guard`).
 */

/** The formatting the paper's student dislikes (bold, lists, headings): the habit the curves follow. */
export const HABIT: readonly Violation[] = PLAIN_ANSWER_RULE.dislikes;

/**
 * How much of a reply is read for habits. The scoring's patterns take time quadratic in a reply
 * crafted for them (16,000 characters of unclosed `__a` took 220 ms), and a reply is the model's
 * output, which a prompt can steer; a habit shows in the first paragraphs anyway.
 */
export const HABIT_CHARS = 2000;

/** The habits a reply shows, as the recipe's scoring reads them (its first HABIT_CHARS); [] for no reply. */
export function habitsOf(reply: string | null): Violation[] {
  return reply === null ? [] : formattingOf(reply.slice(0, HABIT_CHARS)).filter((v) => HABIT.includes(v));
}

/**
 * Habits by judged-turn offset (null: the turn's reply had no text): a turn's reply never changes,
 * and every open page asks for the same few hundred every 5 s, so each reply is read from the
 * store and checked once. Bounded; the oldest entry goes first.
 */
export class HabitCache {
  private readonly map = new Map<number, Violation[] | null>();
  constructor(private readonly max = 20_000) {}
  /** The cached habits, or undefined when the offset is not known yet. */
  get(offset: number): Violation[] | null | undefined {
    return this.map.get(offset);
  }
  /** Checks `reply` (null: none) and keeps the answer for the offset, if it has none yet. */
  put(offset: number, reply: string | null): Violation[] | null {
    const known = this.map.get(offset);
    if (known !== undefined) return known;
    const h = reply === null ? null : habitsOf(reply);
    if (this.map.size >= this.max) this.map.delete(this.map.keys().next().value!);
    this.map.set(offset, h);
    return h;
  }
  get size(): number {
    return this.map.size;
  }
}

/** Texts shown in a listing are cut to this many characters (the record has them whole). */
export const SHOWN_CHARS = 2000;

export interface CurvePoint {
  offset: number;
  at: number;
  /** This turn's own value: its reward, or 1/0 for the habit shown or not. */
  value: number;
  /** The mean over the last `window` points of the curve, this one included (fewer at the start). */
  rolling: number;
}

/**
 * A scenario's curves. Reward: the trained turns (dropped ones have no reward to learn from).
 * Habit: every judged turn whose reply had text, 1 when it used formatting the student dislikes.
 */
export function curves(points: readonly JudgedPoint[], window: number, habitsAt: (offset: number) => Violation[] | null): { reward: CurvePoint[]; habit: CurvePoint[] } {
  const roll = (items: Array<{ offset: number; at: number; value: number }>): CurvePoint[] => {
    let sum = 0;
    return items.map((p, i) => {
      sum += p.value;
      if (i >= window) sum -= items[i - window]!.value;
      return { ...p, rolling: sum / Math.min(i + 1, window) };
    });
  };
  return {
    reward: roll(points.filter((p) => p.decision !== 'dropped').map((p) => ({ offset: p.offset, at: p.createdAt, value: p.reward }))),
    habit: roll(points.flatMap((p) => {
      const h = habitsAt(p.offset);
      return h === null ? [] : [{ offset: p.offset, at: p.createdAt, value: h.length > 0 ? 1 : 0 }];
    })),
  };
}

/** A positive integer query parameter up to `max`, its default when absent, or the problem. */
function intParam(value: string | undefined, name: string, fallback: number, max: number): number | string {
  if (value === undefined) return fallback;
  const n = Number(value);
  return Number.isInteger(n) && n >= 1 && n <= max ? n : `${name} must be an integer from 1 to ${max}`;
}

export interface JudgedRouteDeps {
  store: RecordStore;
  /** Whether this stack can roll back at all (training runs). */
  canRollback: boolean;
}

export function registerJudgedRoutes(
  app: FastifyInstance,
  deps: JudgedRouteDeps,
  principalOf: (req: FastifyRequest) => Principal,
  guard: (request: FastifyRequest, reply: FastifyReply, scenario: string) => boolean,
  fail: (reply: FastifyReply, err: unknown) => unknown,
): void {
  // One per store: offsets name judged turns of this store only.
  const habits = new HabitCache();
  // Who the page speaks for: it shows the rollback action only where the gateway would take it.
  app.get('/reef/key', async (request) => {
    const p = principalOf(request);
    return { id: p.id, scenarios: p.scenarios === null ? null : [...p.scenarios].sort(), rollback: deps.canRollback && p.scenarios === null };
  });

  app.get<{ Params: { s: string }; Querystring: { after?: string; limit?: string; order?: string } }>('/reef/scenarios/:s/judged', async (request, reply) => {
    const { s } = request.params;
    if (!guard(request, reply, s)) return reply;
    const limit = intParam(request.query.limit, 'limit', 20, 1000);
    if (typeof limit === 'string') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', limit, { param: 'limit' });
    const order = request.query.order ?? 'desc';
    if (order !== 'asc' && order !== 'desc') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', `order must be asc or desc, got ${JSON.stringify(order)}`, { param: 'order' });
    try {
      const page = await deps.store.listJudgedTurns({ scenario: s, after: request.query.after ?? null, limit, order });
      const data = page.items.map((t) => ({
        ...t,
        habits: habits.put(t.offset, t.reply) ?? [],
        reply: t.reply === null ? null : clip(t.reply, SHOWN_CHARS),
        nextState: t.nextState === null ? null : { role: t.nextState.role, content: clip(t.nextState.content, SHOWN_CHARS) },
      }));
      return { data, next: page.next };
    } catch (err) {
      return fail(reply, err);
    }
  });

  app.get<{ Params: { s: string }; Querystring: { limit?: string; window?: string } }>('/reef/scenarios/:s/curves', async (request, reply) => {
    const { s } = request.params;
    if (!guard(request, reply, s)) return reply;
    const limit = intParam(request.query.limit, 'limit', 500, MAX_SERIES);
    if (typeof limit === 'string') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', limit, { param: 'limit' });
    const window = intParam(request.query.window, 'window', 10, 1000);
    if (typeof window === 'string') return sendError(reply, 'REEF_ERR_INVALID_ARGUMENT', window, { param: 'window' });
    try {
      const points = await deps.store.judgedSeries(s, limit);
      const unknown = points.filter((p) => habits.get(p.offset) === undefined).map((p) => p.offset);
      if (unknown.length > 0) for (const [offset, text] of await deps.store.judgedReplies(unknown)) habits.put(offset, text);
      return { window, habitRule: HABIT, ...curves(points, window, (o) => habits.get(o) ?? null) };
    } catch (err) {
      return fail(reply, err);
    }
  });
}
