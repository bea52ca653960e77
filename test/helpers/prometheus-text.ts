/**
 * A strict reader of the Prometheus text exposition format 0.0.4, for tests: no parser of it is a
 * dependency of this project. It throws on the first line a scraper would refuse or misread, and
 * returns the samples, so that a test can also check what they say.
 */

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const FLOAT = /^[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|Inf|NaN)$/;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

function parseValue(s: string, line: string): number {
  if (!FLOAT.test(s)) throw new Error(`value ${JSON.stringify(s)} is not a float: ${line}`);
  if (s.endsWith('Inf')) return s.startsWith('-') ? -Infinity : Infinity;
  return s === 'NaN' ? Number.NaN : Number(s);
}

/** Reads `{a="x",b="y"}` from `text` at `at` (just past the `{`); returns the labels and the index past `}`. */
function parseLabels(text: string, at: number, line: string): [Record<string, string>, number] {
  const labels: Record<string, string> = {};
  let i = at;
  for (;;) {
    if (text[i] === '}') return [labels, i + 1];
    const eq = text.indexOf('=', i);
    if (eq < 0) throw new Error(`label without a value: ${line}`);
    const name = text.slice(i, eq);
    if (!LABEL_NAME.test(name) || name.startsWith('__')) throw new Error(`label name ${JSON.stringify(name)} is not valid: ${line}`);
    if (name in labels) throw new Error(`label ${name} appears twice: ${line}`);
    if (text[eq + 1] !== '"') throw new Error(`label value is not quoted: ${line}`);
    let v = '';
    let j = eq + 2;
    for (;; j++) {
      const c = text[j];
      if (c === undefined) throw new Error(`label value is not closed: ${line}`);
      if (c === '"') break;
      if (c === '\\') {
        const n = text[++j];
        if (n === '\\') v += '\\';
        else if (n === '"') v += '"';
        else if (n === 'n') v += '\n';
        else throw new Error(`escape \\${n} is not one the format has: ${line}`);
      } else v += c;
    }
    labels[name] = v;
    i = j + 1;
    if (text[i] === ',') i++;
    else if (text[i] !== '}') throw new Error(`expected , or } after label ${name}: ${line}`);
  }
}

function familyOf(name: string, types: Map<string, string>): string {
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (name.endsWith(suffix)) {
      const base = name.slice(0, -suffix.length);
      const t = types.get(base);
      if (t === 'histogram' || (t === 'summary' && suffix !== '_bucket')) return base;
    }
  }
  return name;
}

function seriesKey(name: string, labels: Record<string, string>): string {
  return `${name}${JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1)))}`;
}

/**
 * Parses an exposition and checks it: HELP and TYPE at most once per family and before its samples,
 * a family's samples together, valid names and escapes, no series twice, and each histogram's
 * buckets cumulative in increasing `le` with `+Inf` equal to `_count` and a `_sum`.
 */
export function parsePrometheusText(text: string): Sample[] {
  if (text.length > 0 && !text.endsWith('\n')) throw new Error('the exposition does not end with a newline');
  const helps = new Set<string>();
  const types = new Map<string, string>();
  const closed = new Set<string>();
  const seen = new Set<string>();
  const samples: Sample[] = [];
  let current: string | null = null;
  const enter = (family: string, line: string) => {
    if (family === current) return;
    if (closed.has(family)) throw new Error(`family ${family} continues after another one: ${line}`);
    if (current !== null) closed.add(current);
    current = family;
  };
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    if (line.startsWith('#')) {
      const m = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line);
      if (!m) continue; // a plain comment
      const [, kind, name, rest = ''] = m;
      if (!METRIC_NAME.test(name!)) throw new Error(`metric name ${JSON.stringify(name)} is not valid: ${line}`);
      enter(name!, line);
      if (kind === 'HELP') {
        if (helps.has(name!)) throw new Error(`second HELP for ${name}`);
        if (/\\(?![\\n])/.test(rest)) throw new Error(`HELP has an escape the format does not: ${line}`);
        helps.add(name!);
      } else {
        if (types.has(name!)) throw new Error(`second TYPE for ${name}`);
        if (!TYPES.has(rest)) throw new Error(`unknown type ${JSON.stringify(rest)}: ${line}`);
        if (samples.some((s) => familyOf(s.name, types) === name)) throw new Error(`TYPE for ${name} after its samples`);
        types.set(name!, rest);
      }
      continue;
    }
    const nameEnd = line.search(/[{ ]/);
    if (nameEnd <= 0) throw new Error(`not a sample line: ${JSON.stringify(line)}`);
    const name = line.slice(0, nameEnd);
    if (!METRIC_NAME.test(name)) throw new Error(`metric name ${JSON.stringify(name)} is not valid: ${line}`);
    let labels: Record<string, string> = {};
    let i = nameEnd;
    if (line[i] === '{') [labels, i] = parseLabels(line, i + 1, line);
    if (line[i] !== ' ') throw new Error(`expected a space before the value: ${line}`);
    const parts = line.slice(i + 1).split(' ');
    if (parts.length > 2 || (parts.length === 2 && !/^-?\d+$/.test(parts[1]!))) throw new Error(`trailing text after the value: ${line}`);
    const value = parseValue(parts[0]!, line);
    enter(familyOf(name, types), line);
    const key = seriesKey(name, labels);
    if (seen.has(key)) throw new Error(`series appears twice: ${line}`);
    seen.add(key);
    samples.push({ name, labels, value });
  }
  for (const [family, type] of types) {
    if (type !== 'histogram') continue;
    const groups = new Map<string, { buckets: Array<[number, number]>; sum?: number; count?: number }>();
    for (const s of samples) {
      if (familyOf(s.name, types) !== family) continue;
      const { le, ...rest } = s.labels;
      const g = groups.get(seriesKey('', rest)) ?? { buckets: [] };
      groups.set(seriesKey('', rest), g);
      if (s.name === `${family}_bucket`) {
        if (le === undefined) throw new Error(`${family}_bucket without le`);
        g.buckets.push([parseValue(le, le), s.value]);
      } else if (s.name === `${family}_sum`) g.sum = s.value;
      else if (s.name === `${family}_count`) g.count = s.value;
      else throw new Error(`${s.name} in histogram ${family}`);
    }
    for (const [labels, g] of groups) {
      const at = `${family}${labels}`;
      if (g.sum === undefined || g.count === undefined) throw new Error(`${at} lacks _sum or _count`);
      for (let k = 1; k < g.buckets.length; k++) {
        if (!(g.buckets[k]![0] > g.buckets[k - 1]![0])) throw new Error(`${at}: le not increasing`);
        if (g.buckets[k]![1] < g.buckets[k - 1]![1]) throw new Error(`${at}: buckets not cumulative`);
      }
      const inf = g.buckets.at(-1);
      if (!inf || inf[0] !== Infinity) throw new Error(`${at} has no le="+Inf" bucket`);
      if (inf[1] !== g.count) throw new Error(`${at}: le="+Inf" is ${inf[1]}, _count is ${g.count}`);
    }
  }
  return samples;
}
