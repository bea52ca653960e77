import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { lineChart } from '../harness/svg.js';
import { SqliteStore } from '../../../actors/gateway/store/sqlite-store.js';
import { armOf, armOptions, hintCounts, judgedTurns, runArm, runStatePaths, SCENARIO, type Arm, type ArmOptions, type ArmSummary } from './experiment.js';
import { spread, twoProportionP, wilson, type Spread } from './stats.js';

/**
 * The experiment's full table: the control arm (training off), RL only, OPD only and both, each over
 * several seeds, one after another on this machine. Each seed's held-out `before` evaluation is
 * made once (by its first arm) and reused by the others: it depends on the base weights and the
 * seed only. A finished arm whose summary matches what would run is kept, so an interrupted table
 * picks up where it stopped.
 */

export const ARM_FLAGS: Record<Arm, string[]> = {
  control: ['--control'],
  rl: ['--w-rl', '1', '--w-opd', '0'],
  opd: ['--w-rl', '0', '--w-opd', '1'],
  both: ['--w-rl', '1', '--w-opd', '1'],
};

export interface AblationOptions {
  seeds: number[];
  arms: Arm[];
  out: string;
  /** Flags given to every arm (`--sessions`, `--lr`, ...), as `npm run demo` takes them. */
  shared: string[];
  /** Run every arm again, even one whose summary is there. @default false */
  fresh: boolean;
  /**
   * Run nothing: the table of the arms already finished, each with the seeds it has (`--kept`),
   * for a table cut short or still running elsewhere. @default false
   */
  keptOnly?: boolean;
  log: (line: string) => void;
  signal?: AbortSignal;
}

export function ablationOptions(argv: readonly string[], log: (line: string) => void): AblationOptions {
  const o: AblationOptions = { seeds: [1, 2, 3], arms: ['control', 'rl', 'opd', 'both'], out: resolve('results', 'smollm2-ablation'), shared: [], fresh: false, log };
  for (let i = 0; i < argv.length; i++) {
    const eq = argv[i]!.indexOf('=');
    const flag = eq < 0 ? argv[i]! : argv[i]!.slice(0, eq);
    if (flag === '--fresh' && eq < 0) {
      o.fresh = true;
      continue;
    }
    if (flag === '--kept' && eq < 0) {
      o.keptOnly = true;
      continue;
    }
    const mine = flag === '--seeds' || flag === '--arms' || flag === '--out';
    if (!mine) {
      if (['--seed', '--w-rl', '--w-opd', '--control', '--before-from'].includes(flag)) throw new Error(`${flag} is set per arm by the table; use --seeds and --arms`);
      o.shared.push(argv[i]!);
      // A flag's separate value goes along with it (flags without a value are the two switches).
      if (eq < 0 && flag !== '--no-greedy' && i + 1 < argv.length) o.shared.push(argv[++i]!);
      continue;
    }
    const value = eq < 0 ? argv[++i] : argv[i]!.slice(eq + 1);
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--out') o.out = resolve(value);
    else if (flag === '--seeds') {
      o.seeds = value.split(',').map((s) => Number(s.trim()));
      if (o.seeds.length === 0 || o.seeds.some((s) => !Number.isInteger(s) || s < 0) || new Set(o.seeds).size !== o.seeds.length) throw new Error(`--seeds: expected distinct non-negative integers such as 1,2,3, got ${value}`);
    } else {
      const arms = value.split(',').map((s) => s.trim());
      const bad = arms.filter((a) => !(a in ARM_FLAGS));
      if (arms.length === 0 || bad.length > 0) throw new Error(`--arms: ${bad.join(', ') || 'none'} not among control, rl, opd, both`);
      o.arms = [...new Set(arms)] as Arm[];
    }
  }
  // Validated now, once per arm, so a typo fails before the first hour of runs.
  for (const arm of o.arms) armOptions([...o.shared, ...ARM_FLAGS[arm], '--seed', String(o.seeds[0])], () => {});
  if (o.fresh && o.keptOnly) throw new Error('--fresh runs every arm again and --kept runs none: give one of them');
  return o;
}

/** The settings a kept summary must share with the arm that would run. */
function sameRun(s: ArmSummary, o: ArmOptions): boolean {
  return s.arm === armOf(o) && s.seed === o.seed && s.sessions === o.sessions && s.lr === o.lr && s.batch_size === o.batchSize && s.heldout.n === o.evalSamples &&
    s.heldout.max_tokens === o.maxTokens && s.model_dir === o.modelDir && JSON.stringify(s.training_options.filter((t) => !/^--openclawrl-w-(rl|opd)=|^--lr=/.test(t))) === JSON.stringify(o.trainOptions);
}

export interface ArmRow {
  arm: Arm;
  seeds: number[];
  habit_before: Spread | null;
  habit_after: Spread | null;
  /** Replies pooled over seeds: k of n with the habit, and the Wilson interval. */
  pooled_before: { k: number; n: number; ci95: [number, number] };
  pooled_after: { k: number; n: number; ci95: [number, number] };
  pooled_p: number;
  /** 1 − after/before on the pooled rates. */
  relative_fall: number | null;
  answer_before: Spread | null;
  answer_after: Spread | null;
  exact_kept: { base_correct: number; still_correct: number; rate: number | null };
  greedy_before: Spread | null;
  greedy_after: Spread | null;
  tokens_before: Spread | null;
  tokens_after: Spread | null;
  distinct2_before: Spread | null;
  distinct2_after: Spread | null;
  kl: Spread | null;
  sessions_to_adaptation: Array<number | null>;
  wall_s: Spread | null;
}

const num = (x: unknown): number | null => (typeof x === 'number' && Number.isFinite(x) ? x : null);

export function armRow(arm: Arm, runs: readonly ArmSummary[]): ArmRow {
  const get = (side: 'before' | 'after', key: string) => spread(runs.map((r) => num(r.heldout[side][key])));
  const pooled = (side: 'before' | 'after') => {
    const k = runs.reduce((a, r) => a + Math.round((num(r.heldout[side].habit_rate) ?? 0) * r.heldout.n), 0);
    const n = runs.reduce((a, r) => a + r.heldout.n, 0);
    return { k, n, ci95: wilson(k, n) };
  };
  const pb = pooled('before');
  const pa = pooled('after');
  const kept = runs.reduce((a, r) => ({ base: a.base + (r.heldout.exact_match_kept?.base_correct ?? 0), still: a.still + (r.heldout.exact_match_kept?.still_correct ?? 0) }), { base: 0, still: 0 });
  return {
    arm,
    seeds: runs.map((r) => r.seed),
    habit_before: get('before', 'habit_rate'),
    habit_after: get('after', 'habit_rate'),
    pooled_before: pb,
    pooled_after: pa,
    pooled_p: twoProportionP(pb.k, pb.n, pa.k, pa.n),
    relative_fall: pb.k > 0 ? 1 - pa.k / pa.n / (pb.k / pb.n) : null,
    answer_before: get('before', 'answer_rate'),
    answer_after: get('after', 'answer_rate'),
    exact_kept: { base_correct: kept.base, still_correct: kept.still, rate: kept.base > 0 ? kept.still / kept.base : null },
    greedy_before: get('before', 'greedy_accuracy'),
    greedy_after: get('after', 'greedy_accuracy'),
    tokens_before: get('before', 'mean_tokens'),
    tokens_after: get('after', 'mean_tokens'),
    distinct2_before: get('before', 'distinct_2'),
    distinct2_after: get('after', 'distinct_2'),
    kl: spread(runs.map((r) => r.heldout.kl_to_base?.mean_kl ?? null)),
    sessions_to_adaptation: runs.map((r) => r.sessions_to_adaptation),
    wall_s: spread(runs.map((r) => r.wall_time_s)),
  };
}

const pct = (x: number | null | undefined) => (x === null || x === undefined ? '-' : `${(x * 100).toFixed(1)}%`);
const ms = (s: Spread | null, f: (x: number) => string = pct) => (s === null ? '-' : s.n > 1 ? `${f(s.mean)} ± ${f(s.sd)}` : f(s.mean));

/** The table as Markdown: one row per arm, means ± standard deviations over seeds, pooled rates with intervals. */
export function tableMarkdown(rows: readonly ArmRow[], doubles: { judge: string; student: string } | null, model: string): string {
  const lines = [
    `Model: ${model}. Judge: ${doubles?.judge ?? '-'}. Student: ${doubles?.student ?? '-'}.`,
    '',
    '| arm | seeds | habit before | habit after | pooled before → after (95% CI) | relative fall | p | answer before → after | exact kept (T=0) | mean tokens | distinct-2 | KL to base | sessions to adaptation |',
    '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |',
  ];
  for (const r of rows) {
    const ci = (c: [number, number]) => `[${pct(c[0])}, ${pct(c[1])}]`;
    lines.push([
      '',
      r.arm,
      r.seeds.join(', '),
      ms(r.habit_before),
      ms(r.habit_after),
      `${r.pooled_before.k}/${r.pooled_before.n} ${ci(r.pooled_before.ci95)} → ${r.pooled_after.k}/${r.pooled_after.n} ${ci(r.pooled_after.ci95)}`,
      pct(r.relative_fall),
      r.pooled_p < 0.001 ? '<0.001' : r.pooled_p.toFixed(3),
      `${ms(r.answer_before)} → ${ms(r.answer_after)}`,
      `${r.exact_kept.still_correct}/${r.exact_kept.base_correct}`,
      `${ms(r.tokens_before, (x) => x.toFixed(0))} → ${ms(r.tokens_after, (x) => x.toFixed(0))}`,
      `${ms(r.distinct2_before, (x) => x.toFixed(3))} → ${ms(r.distinct2_after, (x) => x.toFixed(3))}`,
      ms(r.kl, (x) => x.toFixed(4)),
      r.sessions_to_adaptation.map((s) => s ?? '–').join(', '),
      '',
    ].join(' | ').trim());
  }
  return lines.join('\n');
}

/** The issue's targets, read off the table: stated, never tuned to. */
export function targetLines(rows: readonly ArmRow[]): string[] {
  const by = new Map(rows.map((r) => [r.arm, r]));
  const out: string[] = [];
  const both = by.get('both');
  if (both) {
    out.push(`both terms: held-out habit rate falls by at least half, relative: ${both.relative_fall === null ? 'no base habit to fall' : `${pct(both.relative_fall)} → ${both.relative_fall >= 0.5 ? 'met' : 'not met'}`}`);
    const drop = both.answer_before && both.answer_after ? both.answer_before.mean - both.answer_after.mean : null;
    const moved = (d: number) => (d > 0 ? `falls ${(d * 100).toFixed(1)} points` : d < 0 ? `rises ${(-d * 100).toFixed(1)} points` : 'unchanged');
    out.push(`both terms: answer rate falls by at most 5 points: ${drop === null ? '-' : `${pct(both.answer_before!.mean)} → ${pct(both.answer_after!.mean)}, ${moved(drop)} → ${drop <= 0.05 ? 'met' : 'not met'}`}`);
    const adapted = both.sessions_to_adaptation.filter((s): s is number => s !== null);
    out.push(`both terms: sessions to adaptation ≤ 20: ${both.sessions_to_adaptation.map((s) => s ?? 'not reached').join(', ')} → ${adapted.length === both.sessions_to_adaptation.length && adapted.every((s) => s <= 20) ? 'met in every seed' : 'not met in every seed'}`);
  }
  const control = by.get('control');
  if (control) out.push(`control: no significant fall (pooled two-proportion test, p ≥ 0.05 or a rise): p = ${control.pooled_p.toFixed(3)}, ${pct(control.pooled_before.k / control.pooled_before.n)} → ${pct(control.pooled_after.k / control.pooled_after.n)} → ${control.pooled_p >= 0.05 || control.pooled_after.k / control.pooled_after.n >= control.pooled_before.k / control.pooled_before.n ? 'met' : 'not met'}`);
  for (const single of ['rl', 'opd'] as const) {
    const r = by.get(single);
    if (r && both && r.relative_fall !== null && both.relative_fall !== null) out.push(`both vs ${single} only: relative fall ${pct(both.relative_fall)} vs ${pct(r.relative_fall)}`);
  }
  return out;
}

const COLORS: Record<Arm, string> = { control: '#6c757d', rl: '#f08c00', opd: '#1971c2', both: '#2a9d4b' };

/** The rolling habit (or pass) rate over sessions, per arm, averaged over its seeds. */
export function curvesSvg(byArm: ReadonlyMap<Arm, readonly ArmSummary[]>, key: 'habit' | 'pass'): string {
  const series = [...byArm.entries()].map(([arm, runs]) => {
    const len = Math.min(...runs.map((r) => r.session_results.rolling.length));
    const values = Array.from({ length: Number.isFinite(len) ? len : 0 }, (_, i) => runs.reduce((a, r) => a + r.session_results.rolling[i]![key], 0) / runs.length);
    return { name: `${arm} (${runs.length} seed${runs.length === 1 ? '' : 's'})`, color: COLORS[arm], values };
  });
  return lineChart({ title: `${key === 'habit' ? 'Habit' : 'Pass'} rate of first replies in sessions (last 10), mean over seeds`, xLabel: 'session', series, marker: null });
}

/**
 * A kept summary written before arms counted the judge's hints gets them from the arm's store,
 * which stays in its folder until the arm runs again; without the store it is kept as it is.
 */
async function withHints(summary: ArmSummary, dir: string, file: string, log: (l: string) => void): Promise<ArmSummary> {
  const db = join(runStatePaths(dir).dataDir, 'records.sqlite');
  if (!existsSync(db)) return summary;
  let store: SqliteStore;
  try {
    store = SqliteStore.open(db, { readonly: true });
  } catch (err) {
    log(`  the judge's hints of ${file} are not counted: ${(err as Error).message}`);
    return summary;
  }
  try {
    const filled = { ...summary, training: { ...summary.training, hints: hintCounts(await judgedTurns(store, SCENARIO)) } };
    writeFileSync(file, `${JSON.stringify(filled, null, 2)}\n`);
    log(`  counted the judge's hints of ${file} from ${db}`);
    return filled;
  } finally {
    await store.close();
  }
}

export async function runAblation(o: AblationOptions): Promise<{ rows: ArmRow[]; markdown: string }> {
  mkdirSync(o.out, { recursive: true });
  const byArm = new Map<Arm, ArmSummary[]>();
  const t0 = performance.now();
  const total = o.seeds.length * o.arms.length;
  let k = 0;
  for (const seed of o.seeds) {
    let before: string | null = null;
    for (const arm of o.arms) {
      k++;
      o.signal?.throwIfAborted();
      const dir = join(o.out, `${arm}-seed${seed}`);
      const opts = armOptions([...o.shared, ...ARM_FLAGS[arm], '--seed', String(seed), '--out', dir, ...(before ? ['--before-from', before] : [])], o.log);
      const file = join(dir, 'summary.json');
      let summary: ArmSummary | null = null;
      if (!o.fresh && existsSync(file)) {
        const kept = JSON.parse(readFileSync(file, 'utf8')) as ArmSummary;
        if (sameRun(kept, opts)) summary = kept;
      }
      if (summary && !summary.training.hints) summary = await withHints(summary, dir, file, o.log);
      if (summary) o.log(`[${k}/${total}] ${arm}, seed ${seed}: kept from ${file}`);
      else if (o.keptOnly) {
        o.log(`[${k}/${total}] ${arm}, seed ${seed}: not run (--kept), left out of the table`);
        continue;
      } else {
        o.log(`[${k}/${total}] ${arm}, seed ${seed} (${Math.round((performance.now() - t0) / 60_000)} min into the table)`);
        summary = await runArm({ ...opts, ...(o.signal ? { signal: o.signal } : {}) });
      }
      before ??= join(dir, 'heldout-before.json');
      byArm.set(arm, [...(byArm.get(arm) ?? []), summary]);
    }
  }
  const rows = o.arms.filter((a) => byArm.has(a)).map((a) => armRow(a, byArm.get(a)!));
  const any = [...byArm.values()][0]?.[0] ?? null;
  const markdown = [
    tableMarkdown(rows, any?.doubles ?? null, any?.model ?? '-'),
    '',
    ...targetLines(rows).map((l) => `- ${l}`),
    '',
    `Means ± standard deviations over seeds; pooled columns count every held-out reply of every seed (${any?.heldout.n ?? '-'} per run, before and after). Pass (for sessions to adaptation): ${any?.pass_definition ?? '-'}.`,
  ].join('\n');
  writeFileSync(join(o.out, 'table.md'), `${markdown}\n`);
  writeFileSync(join(o.out, 'table.json'), `${JSON.stringify({ rows, targets: targetLines(rows), runs: Object.fromEntries(byArm) }, null, 2)}\n`);
  writeFileSync(join(o.out, 'habit-curves.svg'), curvesSvg(byArm, 'habit'));
  writeFileSync(join(o.out, 'pass-curves.svg'), curvesSvg(byArm, 'pass'));
  o.log('');
  o.log(markdown);
  o.log('');
  o.log(`table: ${join(o.out, 'table.md')} (and table.json); plots: ${join(o.out, 'habit-curves.svg')}, ${join(o.out, 'pass-curves.svg')}; each run in ${o.out}/<arm>-seed<n>/`);
  return { rows, markdown };
}
