import type { ArmResult, EpisodeFigure, SuccessFigure } from './run.js';

/** What `npm run agents` writes to summary.json. */
export interface AgentsSummary {
  command: string;
  date: string;
  commit: string | null;
  model: { dir: string; why: string };
  stand_ins: Record<string, string>;
  settings: Record<string, unknown>;
  arms: Partial<Record<'control' | 'trained', ArmResult>>;
  wall_time_s: number;
}

const num = (x: number | null | undefined, digits = 2) => (typeof x === 'number' ? x.toFixed(digits) : '-');
const pad = (s: string, n: number) => (s.length >= n ? s : s + ' '.repeat(n - s.length));

function successLine(s: SuccessFigure | null): string {
  if (s === null) return 'not measured';
  const tasks = Object.entries(s.per_task).map(([t, v]) => `${t} ${v.successes}/${v.episodes}`).join(', ');
  return `${s.successes}/${s.episodes} (${tasks}; ${s.tool_calls} first replies with a tool call)`;
}

/** Every trained round's steps: p_t, the episode's outcome, r_t and the normalised A_t. */
export function stepTable(episodes: readonly EpisodeFigure[]): string[] {
  const rows = [`  ${pad('round', 6)}${pad('task', 22)}${pad('rollout', 9)}${pad('step', 5)}${pad('p_t', 6)}${pad('outcome', 8)}${pad('r_t', 6)}A_t`];
  for (const e of episodes) {
    for (const s of e.steps) {
      const what = s.tool_calls.length ? s.tool_calls.map((c) => c.name ?? '?').join('+') : 'answer';
      rows.push(`  ${pad(String(e.round), 6)}${pad(e.task, 22)}${pad(e.variant, 9)}${pad(String(s.index), 5)}${pad(s.process === null ? '-' : String(s.process), 6)}${pad(e.outcome === null ? '-' : String(e.outcome), 8)}${pad(num(s.combined), 6)}${s.advantage === null ? `- (${s.index === e.steps.length - 1 ? 'final answer, not judged' : 'not trained'})` : num(s.advantage, 3)}  ${what}`);
    }
  }
  return rows;
}

export function describeAgents(s: AgentsSummary): string {
  const out: string[] = [''];
  for (const [name, arm] of Object.entries(s.arms) as Array<[string, ArmResult]>) {
    out.push(`== arm ${name} (training ${arm.training_enabled ? 'on' : 'off'}): ${arm.batches.length} batch(es), ${arm.releases.length} release(s)`);
    out.push(...stepTable(arm.episodes));
    const byTask = new Map<string, EpisodeFigure[]>();
    for (const e of arm.episodes) byTask.set(e.task, [...(byTask.get(e.task) ?? []), e]);
    out.push(`  outcomes reported: ${[...byTask].map(([t, es]) => `${t} ${es.map((e) => (e.outcome === 1 ? '+1' : String(e.outcome))).join(' ')}`).join('; ')}`);
    out.push(`  bucket counts: ${['groups_complete', 'groups_timed_out', 'step_buckets', 'step_buckets_all_equal', 'steps_all_equal_dropped', 'step_buckets_singleton', 'steps_outcome_missing'].map((k) => `${k} ${arm.counters[k] ?? 0}`).join(', ')}`);
    out.push('  first reply summed logprob under the weights serving each round (good / bad scripted reply):');
    for (const f of arm.first_step_logprob) out.push(`    round ${f.round} ${pad(f.task, 22)} ${num(f.good, 1)} / ${num(f.bad, 1)}  (good − bad ${f.good !== null && f.bad !== null ? num(f.good - f.bad, 1) : '-'})`);
    out.push(`  success, greedy (the model's own, never scripted): before ${successLine(arm.success.before)}; after ${successLine(arm.success.after)}`);
    out.push('');
  }
  out.push('stand-ins:');
  for (const [k, v] of Object.entries(s.stand_ins)) out.push(`  ${k}: ${v}`);
  out.push(`success while rolling out is the script's (half the first steps are the bad one), not the model's; the greedy figures are the model's own.`);
  out.push(`wall time ${s.wall_time_s} s`);
  return out.join('\n');
}
