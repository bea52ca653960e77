import { STATE_KEY as JUDGE_STATE_KEY } from '../judge/handler.js';
import { STATE_KEY as TRAINER_STATE_KEY } from '../trainer-controller/messages.js';
import type { RecordStore } from './store/types.js';

/**
 * What the judge and the trainer-controller persist, read back for `/reef/status` and `/metrics`:
 * the correlation counters (tagged, untagged, bound, dropped_unbound, evicted, retries, side), the
 * judge's vote counters, and the training counters. Refreshed in the background, so a scrape never
 * waits on the store and a stopped actor still shows its last persisted figures.
 */

export interface PipelineCounters {
  correlation: Record<string, number>;
  judge: Record<string, number>;
  training: { releases: number; weightVersion: string | null; counters: Record<string, number> };
}

const EMPTY: PipelineCounters = { correlation: {}, judge: {}, training: { releases: 0, weightVersion: null, counters: {} } };

function numbers(o: unknown): Record<string, number> {
  const out: Record<string, number> = {};
  if (o && typeof o === 'object') for (const [k, v] of Object.entries(o)) if (typeof v === 'number' && Number.isFinite(v)) out[k] = v;
  return out;
}

export async function readPipelineCounters(store: RecordStore): Promise<PipelineCounters> {
  const [judge, trainer] = await Promise.all([store.getState(JUDGE_STATE_KEY), store.getState(TRAINER_STATE_KEY)]);
  const j = (judge ?? {}) as { correlator?: { counters?: unknown }; counters?: unknown };
  const t = (trainer ?? {}) as { releases?: Array<{ weightVersion: string }>; counters?: unknown };
  return {
    correlation: numbers(j.correlator?.counters),
    judge: numbers(j.counters),
    training: { releases: t.releases?.length ?? 0, weightVersion: t.releases?.at(-1)?.weightVersion ?? null, counters: numbers(t.counters) },
  };
}

export class PipelineStatus {
  private snapshot: PipelineCounters = EMPTY;
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly store: RecordStore, private readonly everyMs = 1000) {}

  async start(): Promise<void> {
    await this.refresh();
    this.timer = setInterval(() => void this.refresh(), this.everyMs);
    this.timer.unref();
  }

  async refresh(): Promise<PipelineCounters> {
    try {
      this.snapshot = await readPipelineCounters(this.store);
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
      for (const [k, v] of Object.entries(values)) lines.push(`${name}{counter="${k}"} ${v}`);
    };
    family('reef_correlation', 'Session correlation counters of the judge (cumulative)', s.correlation);
    family('reef_judge', 'Judge counters: votes, judged and dropped turns, re-dispatches (cumulative)', s.judge);
    family('reef_training', 'Trainer-controller counters (cumulative)', { ...s.training.counters, releases: s.training.releases });
    return lines.join('\n');
  }
}
