/**
 * A small Prometheus text-format registry: counters and histograms with fixed label sets.
 * Kept in-house because the gateway needs a handful of series and no dependency's registry model.
 */

type Labels = Record<string, string>;

const NEEDS_ESCAPE = /[\\"\n]/;

function escapeLabel(v: string): string {
  return NEEDS_ESCAPE.test(v) ? v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n') : v;
}

/** Labels as the text between the braces, names sorted. Runs several times per request, hence no map/join. */
export function labelKey(labels: Labels): string {
  const keys = Object.keys(labels);
  if (keys.length > 1) keys.sort();
  let out = '';
  for (const k of keys) out += `${out ? ',' : ''}${k}="${escapeLabel(String(labels[k]))}"`;
  return out;
}

/**
 * Which scenarios a scrape may see; a series labelled with another scenario is left out. Scenario
 * names are themselves what a key limited to scenarios may not learn (auth.ts `canSee`).
 */
export type ScenarioFilter = ((scenario: string) => boolean) | null;

/** Series keys of one metric, with the `scenario` label of those that have one. */
class SeriesScenarios {
  private readonly byKey = new Map<string, string>();
  note(key: string, labels: Labels): void {
    if (labels.scenario !== undefined && !this.byKey.has(key)) this.byKey.set(key, labels.scenario);
  }
  hidden(key: string, visible: ScenarioFilter): boolean {
    if (visible === null) return false;
    const s = this.byKey.get(key);
    return s !== undefined && !visible(s);
  }
}

class Counter {
  private readonly values = new Map<string, number>();
  private readonly scenarios = new SeriesScenarios();
  constructor(readonly name: string, readonly help: string) {}
  inc(labels: Labels = {}, by = 1): void {
    const k = labelKey(labels);
    const v = this.values.get(k);
    if (v === undefined) this.scenarios.note(k, labels);
    this.values.set(k, (v ?? 0) + by);
  }
  get(labels: Labels = {}): number {
    return this.values.get(labelKey(labels)) ?? 0;
  }
  render(visible: ScenarioFilter = null): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} counter`];
    for (const [k, v] of this.values) if (!this.scenarios.hidden(k, visible)) lines.push(`${this.name}${k ? `{${k}}` : ''} ${v}`);
    return lines.join('\n');
  }
}

class Gauge {
  private readonly values = new Map<string, () => number>();
  constructor(readonly name: string, readonly help: string) {}
  set(fn: () => number, labels: Labels = {}): void {
    this.values.set(labelKey(labels), fn);
  }
  render(): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} gauge`];
    for (const [k, fn] of this.values) lines.push(`${this.name}${k ? `{${k}}` : ''} ${fn()}`);
    return lines.join('\n');
  }
}

class Histogram {
  private readonly series = new Map<string, { counts: number[]; sum: number; count: number }>();
  private readonly scenarios = new SeriesScenarios();
  constructor(readonly name: string, readonly help: string, readonly buckets: readonly number[]) {}
  observe(value: number, labels: Labels = {}): void {
    const k = labelKey(labels);
    let s = this.series.get(k);
    if (!s) {
      this.series.set(k, (s = { counts: this.buckets.map(() => 0), sum: 0, count: 0 }));
      this.scenarios.note(k, labels);
    }
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]!) s.counts[i]!++;
    s.sum += value;
    s.count++;
  }
  render(visible: ScenarioFilter = null): string {
    const lines = [`# HELP ${this.name} ${this.help}`, `# TYPE ${this.name} histogram`];
    for (const [k, s] of this.series) {
      if (this.scenarios.hidden(k, visible)) continue;
      const pre = k ? `${k},` : '';
      this.buckets.forEach((b, i) => lines.push(`${this.name}_bucket{${pre}le="${b}"} ${s.counts[i]}`));
      lines.push(`${this.name}_bucket{${pre}le="+Inf"} ${s.count}`);
      lines.push(`${this.name}_sum${k ? `{${k}}` : ''} ${s.sum}`);
      lines.push(`${this.name}_count${k ? `{${k}}` : ''} ${s.count}`);
    }
    return lines.join('\n');
  }
}

const LATENCY_S = [0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

export class GatewayMetrics {
  readonly requests = new Counter('reef_http_requests_total', 'HTTP requests by route and status code');
  readonly latency = new Histogram('reef_http_request_duration_seconds', 'HTTP request latency by route', LATENCY_S);
  readonly tokens = new Counter('reef_tokens_total', 'Tokens processed, by kind (prompt, completion)');
  readonly records = new Counter('reef_records_total', 'Records committed, by scenario and status');
  readonly commitLatency = new Histogram('reef_record_commit_seconds', 'Time from record hand-off to durable commit', LATENCY_S);
  readonly engineErrors = new Counter('reef_engine_errors_total', 'Engine calls that failed, by kind');
  readonly inflight = new Gauge('reef_inflight_requests', 'Chat completions being served now');
  /** Chat completions being served now (read by the gauge at scrape time). */
  inflightCount = 0;
  private readonly extra: Array<() => string> = [];

  constructor() {
    this.inflight.set(() => this.inflightCount);
  }

  /** Lets other modules (correlation counters, store stats) add their own series. */
  addSection(render: () => string): void {
    this.extra.push(render);
  }

  /** The text exposition; `visible` leaves out the series of scenarios the scraping key may not see. */
  render(visible: ScenarioFilter = null): string {
    const parts = [this.requests, this.latency, this.tokens, this.records, this.commitLatency, this.engineErrors].map((m) => m.render(visible));
    parts.push(this.inflight.render());
    for (const r of this.extra) parts.push(r());
    return parts.join('\n') + '\n';
  }
}
