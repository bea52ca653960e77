/**
 * Two small SVG charts for the example's report, written by hand so the example needs no plotting
 * dependency: a line chart of rates over sessions and a stacked bar chart of counts per batch.
 */

export interface Series {
  name: string;
  color: string;
  /** y values in [0, 1], one per x = 1..n. */
  values: number[];
}

const W = 760;
const H = 380;
const M = { left: 56, right: 150, top: 44, bottom: 48 };
const PW = W - M.left - M.right;
const PH = H - M.top - M.bottom;

export function escapeXml(s: string): string {
  return s.replace(/[<>&"']/g, (c) => ({ '<': '&lt;', '>': '&gt;', '&': '&amp;', '"': '&quot;', "'": '&apos;' })[c]!);
}

const fmt = (n: number) => (Math.round(n * 100) / 100).toString();

function frame(title: string, body: string[]): string {
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`,
    `<text x="${M.left}" y="24" font-size="15" font-weight="600">${escapeXml(title)}</text>`,
    ...body,
    '</svg>',
    '',
  ].join('\n');
}

/** Ticks every `step` up to `max`, `step` chosen so there are at most ~10. */
function ticks(max: number): number[] {
  const raw = Math.max(1, max / 10);
  const step = [1, 2, 5, 10, 20, 25, 50, 100, 200, 500, 1000].find((s) => s >= raw) ?? Math.ceil(raw);
  const out: number[] = [];
  for (let t = 0; t <= max; t += step) out.push(t);
  return out;
}

/** Rates (0..1) per session as lines; an optional dashed marker at one session. */
export function lineChart(opts: { title: string; xLabel: string; series: Series[]; marker: { x: number; label: string } | null }): string {
  const n = Math.max(1, ...opts.series.map((s) => s.values.length));
  const x = (i: number) => M.left + (n === 1 ? PW / 2 : ((i - 1) / (n - 1)) * PW);
  const y = (v: number) => M.top + (1 - v) * PH;
  const body: string[] = [];
  for (const p of [0, 0.25, 0.5, 0.75, 1]) {
    body.push(`<line x1="${M.left}" x2="${M.left + PW}" y1="${fmt(y(p))}" y2="${fmt(y(p))}" stroke="#e5e5e5"/>`);
    body.push(`<text x="${M.left - 8}" y="${fmt(y(p) + 4)}" text-anchor="end">${p * 100}%</text>`);
  }
  for (const t of [1, ...ticks(n).filter((t) => t > 1)]) {
    body.push(`<text x="${fmt(x(t))}" y="${M.top + PH + 18}" text-anchor="middle">${t}</text>`);
  }
  body.push(`<line x1="${M.left}" x2="${M.left + PW}" y1="${M.top + PH}" y2="${M.top + PH}" stroke="#333"/>`);
  body.push(`<text x="${M.left + PW / 2}" y="${H - 10}" text-anchor="middle">${escapeXml(opts.xLabel)}</text>`);
  if (opts.marker) {
    const mx = fmt(x(opts.marker.x));
    body.push(`<line x1="${mx}" x2="${mx}" y1="${M.top}" y2="${M.top + PH}" stroke="#555" stroke-dasharray="4 4"/>`);
    body.push(`<text x="${fmt(x(opts.marker.x) + 4)}" y="${M.top + 12}" fill="#555">${escapeXml(opts.marker.label)}</text>`);
  }
  for (const [k, s] of opts.series.entries()) {
    const pts = s.values.map((v, i) => `${fmt(x(i + 1))},${fmt(y(v))}`).join(' ');
    body.push(`<polyline fill="none" stroke="${s.color}" stroke-width="2" points="${pts}"><title>${escapeXml(s.name)}</title></polyline>`);
    const ly = M.top + 10 + k * 20;
    body.push(`<line x1="${M.left + PW + 16}" x2="${M.left + PW + 40}" y1="${ly}" y2="${ly}" stroke="${s.color}" stroke-width="3"/>`);
    body.push(`<text x="${M.left + PW + 46}" y="${ly + 4}">${escapeXml(s.name)}</text>`);
  }
  return frame(opts.title, body);
}

export interface Stack {
  name: string;
  color: string;
}

/** One stacked bar per label; `values[i][j]` is stack j of bar i. */
export function stackedBars(opts: { title: string; xLabel: string; labels: string[]; stacks: Stack[]; values: number[][]; empty: string }): string {
  const body: string[] = [];
  if (opts.labels.length === 0) {
    body.push(`<text x="${W / 2}" y="${H / 2}" text-anchor="middle" fill="#777">${escapeXml(opts.empty)}</text>`);
    return frame(opts.title, body);
  }
  const max = Math.max(1, ...opts.values.map((row) => row.reduce((a, b) => a + b, 0)));
  const yt = ticks(max);
  const top = Math.max(max, yt.at(-1)!);
  const y = (v: number) => M.top + (1 - v / top) * PH;
  for (const t of yt) {
    body.push(`<line x1="${M.left}" x2="${M.left + PW}" y1="${fmt(y(t))}" y2="${fmt(y(t))}" stroke="#e5e5e5"/>`);
    body.push(`<text x="${M.left - 8}" y="${fmt(y(t) + 4)}" text-anchor="end">${t}</text>`);
  }
  const slot = PW / opts.labels.length;
  const bw = Math.max(2, Math.min(40, slot * 0.7));
  const every = Math.ceil(opts.labels.length / 20);
  for (const [i, label] of opts.labels.entries()) {
    const bx = M.left + i * slot + (slot - bw) / 2;
    let acc = 0;
    for (const [j, st] of opts.stacks.entries()) {
      const v = opts.values[i]?.[j] ?? 0;
      if (v <= 0) continue;
      body.push(`<rect x="${fmt(bx)}" y="${fmt(y(acc + v))}" width="${fmt(bw)}" height="${fmt(y(acc) - y(acc + v))}" fill="${st.color}"><title>${escapeXml(`${label}: ${st.name} ${v}`)}</title></rect>`);
      acc += v;
    }
    if (i % every === 0) body.push(`<text x="${fmt(bx + bw / 2)}" y="${M.top + PH + 18}" text-anchor="middle">${escapeXml(label)}</text>`);
  }
  body.push(`<line x1="${M.left}" x2="${M.left + PW}" y1="${M.top + PH}" y2="${M.top + PH}" stroke="#333"/>`);
  body.push(`<text x="${M.left + PW / 2}" y="${H - 10}" text-anchor="middle">${escapeXml(opts.xLabel)}</text>`);
  for (const [k, st] of opts.stacks.entries()) {
    const ly = M.top + 10 + k * 20;
    body.push(`<rect x="${M.left + PW + 16}" y="${ly - 6}" width="24" height="12" fill="${st.color}"/>`);
    body.push(`<text x="${M.left + PW + 46}" y="${ly + 4}">${escapeXml(st.name)}</text>`);
  }
  return frame(opts.title, body);
}
