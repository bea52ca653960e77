/**
 * `training.options`: a list of `--flag=value` / `--flag value` strings, parsed by the recipe's
 * spec into `training.resolved`.
 */
import type { ConfigIssue } from './errors.js';
import { show } from './issues.js';
import { closest } from './keys.js';
import type { TrainingOptionSpec, TrainingOptionsSpec } from './types.js';

const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

function convert(spec: TrainingOptionSpec, text: string): { ok: true; value: number | string } | { ok: false; message: string } {
  // Number('') is 0 and Number('0x10') is 16: only plain decimal text counts as a number.
  const value = spec.kind === 'number' ? (NUMBER.test(text.trim()) ? Number(text) : Number.NaN) : text;
  const r = spec.schema.safeParse(value);
  if (r.success) return { ok: true, value: r.data as number | string };
  return { ok: false, message: `${spec.flag}: ${r.error.issues[0]?.message ?? 'invalid value'}, got ${show(text)}` };
}

/** Parses `options`; every problem is reported with its `training.options[i]` path. */
export function parseTrainingOptions(options: readonly string[], spec: TrainingOptionsSpec): { resolved: object | null; issues: ConfigIssue[] } {
  const byFlag = new Map(spec.options.map((o) => [o.flag, o]));
  const values: Record<string, number | string> = Object.fromEntries(spec.options.map((o) => [o.key, o.default]));
  const seenAt = new Map<string, number>();
  const issues: ConfigIssue[] = [];
  for (let i = 0; i < options.length; i++) {
    // `i` moves on to the value of `--flag value`; where the flag was given is this.
    const at = i;
    const path = `training.options[${at}]`;
    const arg = options[i]!;
    const eq = arg.indexOf('=');
    const flag = eq === -1 ? arg : arg.slice(0, eq);
    const opt = byFlag.get(flag);
    if (opt === undefined) {
      const near = closest(flag, byFlag.keys());
      const hint = near === null ? '' : `; did you mean ${near}?`;
      issues.push({ path, message: flag.startsWith('--') ? `unknown option ${flag}${hint}` : `expected --option=value, got ${show(arg)}` });
      continue;
    }
    let text: string;
    if (eq !== -1) {
      text = arg.slice(eq + 1);
    } else if (i + 1 < options.length && !options[i + 1]!.startsWith('--')) {
      text = options[++i]!;
    } else {
      issues.push({ path, message: `${flag} needs a value` });
      continue;
    }
    const prior = seenAt.get(flag);
    if (prior !== undefined) {
      issues.push({ path, message: `${flag} is already given at training.options[${prior}]` });
      continue;
    }
    seenAt.set(flag, at);
    const r = convert(opt, text);
    if (r.ok) values[opt.key] = r.value;
    else issues.push({ path, message: r.message });
  }
  return { resolved: issues.length === 0 ? spec.resolve(values) : null, issues };
}
