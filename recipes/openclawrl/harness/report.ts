import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { rollingRates, sessionsToAdaptation, type RollingPoint, type Violation } from './scoring.js';
import { lineChart, stackedBars } from './svg.js';

/**
 * The run's results: per-session lines, the summary (counts, rolling series, adaptation, wall
 * time, each batch's reward split from the recipe's `prm_record_file`), and two SVG plots.
 */

/** One line of `results/sessions.jsonl`. */
export interface SessionResult {
  /** 1-based session index; the conversation is tagged `{scenario}-s{index}`. */
  index: number;
  problem_id: string;
  family: string;
  gold: number;
  passed: boolean;
  bold: boolean;
  list: boolean;
  header: boolean;
  /** The first reply had formatting the session's student dislikes. */
  habit: boolean;
  /** The first reply ends with a final answer (scoring.ts `endsWithAnswer`). */
  answered: boolean;
  violations: Violation[];
  steps: number;
  has_answer: boolean;
  /** Student messages sent (each answered by the agent). */
  turns: number;
  /** How the session ended. */
  ended: 'done' | 'turn-limit' | 'agent-error' | 'student-error';
  saved: boolean;
  first_reply: string;
  tag: string;
  record_ids: string[];
  error: string | null;
  wall_s: number;
}

/** One batch of the prm_record_file: its id and how many of its tasks had reward +1, -1, 0. */
export interface BatchRewards {
  batch: string;
  rewards: { '1': number; '-1': number; '0': number };
}

export interface RunSummary {
  sessions: number;
  passed: number;
  habit: number;
  bold: number;
  list: number;
  ended: Record<string, number>;
  rolling_window: number;
  /** The rolling rates at the first full window (or the last session when fewer) and at the end. */
  rolling_start: RollingPoint | null;
  rolling_end: RollingPoint | null;
  rolling: RollingPoint[];
  sessions_to_adaptation: number | null;
  wall_time_s: number;
  batches: BatchRewards[] | null;
  files: { sessions: string; summary: string; rates_plot: string; rewards_plot: string };
}

const count = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) ? v : 0);

/**
 * Reads the batch lines of a prm_record_file. A line names its batch as `batch` (or `batch_id`)
 * and its split as `rewards` (or `reward_split`): `{"1": n, "-1": n, "0": n}`. A missing file is
 * no batches yet; a line that is not JSON (a write in progress) is skipped. Reef's lines name the
 * controller's history as `run`; when a file holds several (the same config on a new data dir),
 * only the last run's batches count: the others are not this run's.
 */
export function readPrmRecords(path: string): BatchRewards[] {
  if (!existsSync(path)) return [];
  const out: Array<BatchRewards & { run: unknown }> = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    if (line.trim() === '') continue;
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line) as Record<string, unknown>;
    } catch {
      continue;
    }
    // Reef's lines carry the number as `batch` and the id as `batch_id`; prefer the id.
    const batch = typeof rec.batch_id === 'string' ? rec.batch_id : rec.batch;
    const split = (rec.rewards ?? rec.reward_split) as Record<string, unknown> | undefined;
    if (typeof batch !== 'string' || typeof split !== 'object' || split === null) continue;
    out.push({ batch, rewards: { '1': count(split['1']), '-1': count(split['-1']), '0': count(split['0']) }, run: rec.run });
  }
  const last = out.at(-1)?.run;
  return out.filter((b) => b.run === last).map(({ run: _run, ...b }) => b);
}

export function summarize(results: readonly SessionResult[], opts: { wallTimeS: number; batches: BatchRewards[] | null; dir: string; window?: number }): RunSummary {
  const window = opts.window ?? 10;
  const rolling = rollingRates(results.map((r) => ({ accept: r.passed, bold: r.bold, list: r.list, habit: r.habit })), window);
  const ended: Record<string, number> = {};
  for (const r of results) ended[r.ended] = (ended[r.ended] ?? 0) + 1;
  return {
    sessions: results.length,
    passed: results.filter((r) => r.passed).length,
    habit: results.filter((r) => r.habit).length,
    bold: results.filter((r) => r.bold).length,
    list: results.filter((r) => r.list).length,
    ended,
    rolling_window: window,
    rolling_start: rolling[Math.min(window, rolling.length) - 1] ?? null,
    rolling_end: rolling.at(-1) ?? null,
    rolling,
    sessions_to_adaptation: sessionsToAdaptation(results.map((r) => r.passed)),
    wall_time_s: Math.round(opts.wallTimeS * 10) / 10,
    batches: opts.batches,
    files: {
      sessions: join(opts.dir, 'sessions.jsonl'),
      summary: join(opts.dir, 'summary.json'),
      rates_plot: join(opts.dir, 'rates.svg'),
      rewards_plot: join(opts.dir, 'rewards.svg'),
    },
  };
}

export function ratesPlot(s: RunSummary): string {
  const a = s.sessions_to_adaptation;
  return lineChart({
    title: `Pass, habit, bold and list rates (last ${s.rolling_window} sessions)`,
    xLabel: 'session',
    series: [
      { name: 'pass rate', color: '#2a9d4b', values: s.rolling.map((p) => p.pass) },
      { name: 'habit rate', color: '#6a4c93', values: s.rolling.map((p) => p.habit) },
      { name: 'bold rate', color: '#d62828', values: s.rolling.map((p) => p.bold) },
      { name: 'list rate', color: '#f08c00', values: s.rolling.map((p) => p.list) },
    ],
    marker: a === null ? null : { x: a, label: `adapted at session ${a}` },
  });
}

export function rewardsPlot(batches: readonly BatchRewards[]): string {
  return stackedBars({
    title: 'Reward split per training batch',
    xLabel: 'batch',
    labels: batches.map((b) => b.batch.split(':').at(-1) ?? b.batch),
    stacks: [
      { name: 'reward +1', color: '#2a9d4b' },
      { name: 'reward 0', color: '#adb5bd' },
      { name: 'reward -1', color: '#d62828' },
    ],
    values: batches.map((b) => [b.rewards['1'], b.rewards['0'], b.rewards['-1']]),
    empty: 'no batches recorded (prm_record_file not given or still empty)',
  });
}

/** Writes summary.json and both plots into `dir` (sessions.jsonl is appended by the run itself). */
export function writeReport(dir: string, results: readonly SessionResult[], opts: { wallTimeS: number; prmRecordFile: string | null }): RunSummary {
  mkdirSync(dir, { recursive: true });
  const batches = opts.prmRecordFile === null ? null : readPrmRecords(opts.prmRecordFile);
  const summary = summarize(results, { wallTimeS: opts.wallTimeS, batches, dir });
  writeFileSync(summary.files.summary, `${JSON.stringify(summary, null, 2)}\n`);
  writeFileSync(summary.files.rates_plot, ratesPlot(summary));
  writeFileSync(summary.files.rewards_plot, rewardsPlot(batches ?? []));
  return summary;
}

const pct = (v: number | undefined) => (v === undefined ? '  -' : `${Math.round(v * 100)}%`.padStart(4));

/** The learning curve as text: one row per `every` sessions. */
export function curveTable(s: RunSummary, every = 4): string {
  const rows = ['session  pass  habit  bold  list'];
  for (const p of s.rolling) {
    if (p.session % every === 0 || p.session === s.rolling.length) rows.push(`${String(p.session).padStart(7)}  ${pct(p.pass)}  ${pct(p.habit).padStart(5)}  ${pct(p.bold)}  ${pct(p.list)}`);
  }
  return rows.join('\n');
}
