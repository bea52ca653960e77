import { STATE_KEY as JUDGE_STATE_KEY } from '../judge/handler.js';
import { STATE_KEY as TRAINER_STATE_KEY } from '../trainer-controller/messages.js';
import { labelKey } from './metrics.js';
import type { RecordStore } from './store/types.js';

/**
 * What the judge and the trainer-controller persist, read back for `/reef/status` and `/metrics`:
 * the correlation counters (tagged, untagged, bound, dropped_unbound, evicted, retries, side, ended), the
 * judge's vote counters, and the training counters. Refreshed in the background, so a scrape never
 * waits on the store and a stopped actor still shows its last persisted figures.
 */

/** A warning the judge's correlator raised (correlate/correlator.ts), as its saved state keeps it. */
export interface CorrelationWarning {
  code: 'untagged-traffic' | 'evictions' | 'unbound-turns';
  message: string;
  /** When it was last raised (ms since the epoch, the correlator's clock), where the state keeps it. */
  at: number | null;
}

export interface PipelineCounters {
  correlation: Record<string, number>;
  /** The warnings raised so far; the judge's log has each in full. */
  correlationWarnings: CorrelationWarning[];
  judge: Record<string, number>;
  training: { releases: number; weightVersion: string | null; counters: Record<string, number> };
}

const EMPTY: PipelineCounters = { correlation: {}, correlationWarnings: [], judge: {}, training: { releases: 0, weightVersion: null, counters: {} } };

function numbers(o: unknown): Record<string, number> {
  const out: Record<string, number> = {};
  if (o && typeof o === 'object') for (const [k, v] of Object.entries(o)) if (typeof v === 'number' && Number.isFinite(v)) out[k] = v;
  return out;
}

const JUDGE_PATHS = ['$.correlator.counters', '$.counters', '$.correlator.warned'];

/**
 * The correlator saves only that it warned (a warning is raised once, the unbound one at most every
 * 5 min), not the words: these say what each means and what to do, as its log line does.
 */
export function warningsOf(warned: unknown): CorrelationWarning[] {
  const w = (warned && typeof warned === 'object' ? warned : {}) as { untagged?: unknown; evictions?: unknown; unboundAt?: unknown };
  const out: CorrelationWarning[] = [];
  if (w.untagged === true) out.push({ code: 'untagged-traffic', at: null, message: 'requests arrive without x-reef-tag-session: they are correlated by transcript, which history rewrites and identical conversations break; send one x-reef-tag-session value per conversation' });
  if (w.evictions === true) out.push({ code: 'evictions', at: null, message: 'more sessions were open than max_open_sessions: the least recently active were evicted and their pending turns dropped; raise max_open_sessions or tag sessions so requests bind' });
  if (typeof w.unboundAt === 'number') out.push({ code: 'unbound-turns', at: w.unboundAt, message: 'more turns were dropped without a next state than bound: sessions expire before any request extends them; check with `reef correlate` and send x-reef-tag-session' });
  return out;
}
/**
 * The release count and the current version, without the releases: a state of version 2 has the
 * count and the newest releases, one of version 1 (no count) every release under `releases`.
 */
const TRAINER_PATHS = ['$.counters', '$.releaseCount', '$.recentReleases[#-1].weightVersion', '$.releases'];

/**
 * Only the counters are read: the judge's state once held every pending turn's id and lease (up
 * to 2,304) and every open session (about 1 MB at 4,096), which went whole through JSON.parse on
 * the gateway's event loop every second, and an old state may still.
 */
export async function readPipelineCounters(store: RecordStore): Promise<PipelineCounters> {
  const [judge, trainer] = await Promise.all([store.getStateFields(JUDGE_STATE_KEY, JUDGE_PATHS), store.getStateFields(TRAINER_STATE_KEY, TRAINER_PATHS)]);
  const [correlation, judgeCounters, warned] = judge?.values ?? [];
  const [trainerCounters, count, current, v1Releases] = trainer?.values ?? [];
  const list = Array.isArray(v1Releases) ? (v1Releases as Array<{ weightVersion?: unknown }>) : [];
  const last = typeof count === 'number' ? current : list.at(-1)?.weightVersion;
  return {
    correlation: numbers(correlation),
    correlationWarnings: warningsOf(warned),
    judge: numbers(judgeCounters),
    training: { releases: typeof count === 'number' ? count : list.length, weightVersion: typeof last === 'string' ? last : null, counters: numbers(trainerCounters) },
  };
}

export class PipelineStatus {
  private snapshot: PipelineCounters = EMPTY;
  private timer: NodeJS.Timeout | null = null;
  /** The saved states' write times at the last read, and when that read was (ms since the epoch). */
  private seen: { judge: number | null; trainer: number | null; at: number } | null = null;

  constructor(private readonly store: RecordStore, private readonly everyMs = 1000) {}

  async start(): Promise<void> {
    await this.refresh();
    this.timer = setInterval(() => void this.refresh(), this.everyMs);
    this.timer.unref();
  }

  async refresh(): Promise<PipelineCounters> {
    try {
      const at = Date.now();
      const [judge, trainer] = await Promise.all([this.store.stateUpdatedAt(JUDGE_STATE_KEY), this.store.stateUpdatedAt(TRAINER_STATE_KEY)]);
      // Write times are in ms: a write in the same ms as the last read's may have come after it.
      const unchanged = (then: number | null, now: number | null, readAt: number) => then === now && (now === null || readAt > now);
      const s = this.seen;
      if (s === null || !unchanged(s.judge, judge, s.at) || !unchanged(s.trainer, trainer, s.at)) {
        this.snapshot = await readPipelineCounters(this.store);
        this.seen = { judge, trainer, at };
      }
    } catch {
      // A closed or busy store keeps the last figures; the next refresh tries again.
    }
    return this.snapshot;
  }

  get current(): PipelineCounters {
    return this.snapshot;
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** Prometheus text for the counters. */
  render(): string {
    const s = this.snapshot;
    const lines: string[] = [];
    const family = (name: string, help: string, values: Record<string, number>) => {
      lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`);
      // Escaped: the names come from saved state, and one quote or newline unescaped made the
      // scraper refuse every series of the scrape.
      for (const [k, v] of Object.entries(values)) lines.push(`${name}{${labelKey({ counter: k })}} ${v}`);
    };
    family('reef_correlation', 'Session correlation counters of the judge (cumulative)', s.correlation);
    family('reef_judge', 'Judge counters: votes, judged and dropped turns, re-dispatches (cumulative)', s.judge);
    family('reef_training', 'Trainer-controller counters (cumulative)', { ...s.training.counters, releases: s.training.releases });
    return lines.join('\n');
  }
}
