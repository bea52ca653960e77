import type { RunFile } from '../run-file.js';

/** `reef status` as text: one section each for actors, placement groups and engines. */
export function renderStatus(rf: RunFile, status: Record<string, unknown>): string {
  const lines: string[] = [];
  const uptime = Math.round((Date.now() - rf.startedAt) / 1000);
  lines.push(`reef: pid ${rf.pid}, up ${uptime} s, config ${rf.configPath}`);
  lines.push(`gateway: ${rf.gateway}`);
  const shim = status.shim as { pid: number | null; state: string; restarts: number } | undefined;
  if (shim) lines.push(`shim: pid ${shim.pid ?? '-'}, ${shim.state}, restarts ${shim.restarts}`);
  const ray = status.ray as { address: string; resources: Record<string, number> } | null;
  if (ray) lines.push(`ray: ${ray.address} (${Object.entries(ray.resources).filter(([k]) => k === 'CPU' || k === 'GPU').map(([k, v]) => `${k} ${v}`).join(', ')})`);

  lines.push('', 'ACTOR                 PID      STATE      RESTARTS');
  for (const a of (status.actors as Array<{ id: string; pid: number | null; state: string; restarts: number }>) ?? []) {
    lines.push(`${a.id.padEnd(22)}${String(a.pid ?? '-').padEnd(9)}${a.state.padEnd(11)}${a.restarts}`);
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
  return lines.join('\n');
}
