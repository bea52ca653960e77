import type { PipelineCounters } from '../../actors/gateway/pipeline-status.js';
import type { RunFile } from '../run-file.js';

/** The pipeline's progress as `reef status` shows it: records in the store, and what the actors persisted. */
export type PipelineSummary = PipelineCounters & { records: number };

/** `reef status` as text: one section each for actors, placement groups, engines and the pipeline. */
export function renderStatus(rf: RunFile, status: Record<string, unknown>, pipeline: PipelineSummary | { error: string } | null = null): string {
  const lines: string[] = [];
  const uptime = Math.round((Date.now() - rf.startedAt) / 1000);
  lines.push(`reef: pid ${rf.pid}, up ${uptime} s, config ${rf.configPath}`);
  lines.push(`gateway: ${rf.gateway}`);
  const shim = status.shim as { pid: number | null; state: string; restarts: number; lastExit?: string | null } | undefined;
  if (shim) lines.push(`shim: pid ${shim.pid ?? '-'}, ${shim.state}, restarts ${shim.restarts}${lastExit(shim)}`);
  const ray = status.ray as { address: string; resources: Record<string, number> } | null;
  if (ray) lines.push(`ray: ${ray.address} (${Object.entries(ray.resources).filter(([k]) => k === 'CPU' || k === 'GPU').map(([k, v]) => `${k} ${v}`).join(', ')})`);

  lines.push('', 'ACTOR                 PID      STATE      RESTARTS');
  for (const a of (status.actors as Array<{ id: string; pid: number | null; state: string; restarts: number; lastExit?: string | null }>) ?? []) {
    lines.push(`${a.id.padEnd(22)}${String(a.pid ?? '-').padEnd(9)}${a.state.padEnd(11)}${a.restarts}${lastExit(a)}`);
  }
  lines.push('', 'PLACEMENT GROUP       STRATEGY     STATE     BUNDLES');
  for (const g of (status.groups as Array<{ name: string; strategy: string; state: string; bundles: Array<{ resources: Record<string, number> }> }>) ?? []) {
    const bundles = g.bundles.map((b) => Object.entries(b.resources).map(([k, v]) => `${k}:${v}`).join(' ')).join(' | ');
    lines.push(`${g.name.padEnd(22)}${g.strategy.padEnd(13)}${g.state.padEnd(10)}${bundles}`);
  }
  lines.push('', 'ENGINE        KIND    HEALTHY  WEIGHTS        URL');
  for (const e of (status.engines as Array<{ name: string; kind: string; healthy?: boolean; weightVersion?: string | null; url?: string }>) ?? []) {
    lines.push(`${e.name.padEnd(14)}${e.kind.padEnd(8)}${String(e.healthy ?? false).padEnd(9)}${String(e.weightVersion ?? 'base').padEnd(15)}${e.url ?? '-'}`);
  }
  if (pipeline !== null) lines.push('', 'PIPELINE', ...renderPipeline(pipeline));
  return lines.join('\n');
}

/** Why a restarted child died last time, after its restart count. */
function lastExit(c: { restarts: number; lastExit?: string | null }): string {
  return c.restarts > 0 && c.lastExit ? ` (last: ${c.lastExit})` : '';
}

/** Whether the agent's turns are being recorded, judged and trained, in three lines. */
export function renderPipeline(p: PipelineSummary | { error: string }): string[] {
  if ('error' in p) return [`(cannot read the record store: ${p.error})`];
  const n = (o: Record<string, number>, k: string) => o[k] ?? 0;
  const j = p.judge;
  const t = p.training.counters;
  const answered = n(j, 'votes_ok');
  return [
    `records   ${p.records} recorded; ${n(p.correlation, 'bound')} turns bound to what came next`,
    `judge     ${n(j, 'judged')} turns judged (${n(j, 'dropped')} dropped: no usable vote); votes ${answered - n(j, 'votes_invalid')} usable, ${n(j, 'votes_invalid')} unreadable, ${n(j, 'votes_failed')} failed`,
    `training  ${p.training.releases} releases (serving ${p.training.weightVersion ?? 'the base weights'}); ${n(t, 'batches')} batches of ${n(t, 'samples')} turns; ${n(t, 'stale')} stale, ${n(t, 'dead_letters')} dead-lettered`,
  ];
}
