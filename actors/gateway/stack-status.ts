/**
 * The actors, engines and placement of the stack a gateway runs in, for `/reef/status` (and the live
 * page, which polls it): asked of the supervisor, whose `status` asks the shim in turn. Polled by
 * every open page, so one answer serves everyone for `everyMs`, one question is in flight at a time,
 * and a supervisor or shim that does not answer leaves the last answer standing, marked stale.
 */

export interface StackView {
  actors: unknown[];
  engines: unknown[];
  groups: unknown[];
  /** Why the last question went unanswered; null when the figures are fresh. */
  stackError: string | null;
}

export interface StackAnswer {
  actors: ReadonlyArray<Record<string, unknown>>;
  engines: unknown[];
  groups: unknown[];
}

/** An actor as shown: without its mailbox endpoint, which is the bus's business, not an API key holder's. */
function shown(actor: Record<string, unknown>): Record<string, unknown> {
  const { mailbox: _mailbox, ...rest } = actor;
  return rest;
}

export function stackStatus(ask: () => Promise<StackAnswer>, everyMs = 5000, now: () => number = () => performance.now()): () => Promise<StackView> {
  let last: StackView = { actors: [], engines: [], groups: [], stackError: 'not asked yet' };
  let at = Number.NEGATIVE_INFINITY;
  let asking: Promise<StackView> | null = null;
  return () => {
    if (now() - at < everyMs) return Promise.resolve(last);
    asking ??= ask()
      .then(
        (a) => (last = { actors: a.actors.map(shown), engines: a.engines, groups: a.groups, stackError: null }),
        (err: unknown) => (last = { ...last, stackError: `the supervisor did not answer: ${err instanceof Error ? err.message : String(err)}` }),
      )
      .finally(() => {
        at = now();
        asking = null;
      });
    return asking;
  };
}
