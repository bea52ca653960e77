import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';
import { OpenClawRLRecipe } from '../../recipes/openclawrl/recipe.js';
import { repoRoot } from '../paths.js';
import { keyPaths } from './issues.js';
import { SECTIONS } from './schema.js';
import { STAGE_NAMES } from './types.js';

const doc = readFileSync(join(repoRoot(), 'docs/config.md'), 'utf8');

const schemaKeys = [
  ...Object.entries(SECTIONS).flatMap(([name, schema]) => keyPaths(schema, name)),
  ...STAGE_NAMES.flatMap((s) => keyPaths(OpenClawRLRecipe.stages[s].configSchema, `pipeline.${s}.config`)),
];
const flags = OpenClawRLRecipe.trainingOptions.options.map((o) => o.flag);

/** First cells of the reference tables: the keys and flags the doc describes. */
const documented = [...doc.matchAll(/^\| `([^`]+)` \|/gm)].map((m) => m[1]!);

/** The rows of every Markdown table in the doc, by header name, keyed by the first cell's `key`. */
function tableRows(md: string): Map<string, Record<string, string>> {
  const rows = new Map<string, Record<string, string>>();
  // A cell may hold `a` \| `b`: only an unescaped bar ends it.
  const cells = (line: string) => line.trim().replace(/^\||\|$/g, '').split(/(?<!\\)\|/).map((c) => c.trim());
  let header: string[] | null = null;
  for (const line of md.split('\n')) {
    if (!line.trimStart().startsWith('|')) {
      header = null;
      continue;
    }
    const row = cells(line);
    if (header === null) header = row.map((h) => h.toLowerCase());
    else if (!row.every((c) => /^:?-+:?$/.test(c))) {
      const key = /^`([^`]+)`$/.exec(row[0]!)?.[1];
      if (key !== undefined) rows.set(key, Object.fromEntries(header.map((h, i) => [h, row[i] ?? ''])));
    }
  }
  return rows;
}
const rows = tableRows(doc);

interface ZodDef {
  type: string;
  shape?: Record<string, z.ZodType>;
  innerType?: z.ZodType;
  out?: z.ZodType;
  element?: z.ZodType;
  defaultValue?: unknown;
  entries?: Record<string, string>;
}
const defOf = (s: z.ZodType): ZodDef => (s as unknown as { _zod: { def: ZodDef } })._zod.def;

interface KeySpec {
  /** Absent when the schema gives the key no default of its own. */
  default?: { value: unknown };
  /** What is under the wrappers: `object`, `enum`, `number`, `unknown` (an open stage config), … */
  kind: string;
  enumValues?: string[];
  /** Whether `null` is a value the key takes. */
  nullable: boolean;
}

/** The default and kind of every key path (`reef.api_keys[].key`), as keyPaths names them. */
function keySpecs(schema: z.ZodType, prefix: string, out = new Map<string, KeySpec>()): Map<string, KeySpec> {
  let cur = schema;
  let dflt: KeySpec['default'];
  let nullable = false;
  for (;;) {
    const d = defOf(cur);
    if (d.type === 'default' && dflt === undefined) dflt = { value: d.defaultValue };
    if (d.type === 'nullable') nullable = true;
    if (d.type === 'pipe' && d.out) cur = d.out;
    else if (d.innerType && d.type !== 'object') cur = d.innerType;
    else break;
  }
  const d = defOf(cur);
  if (prefix !== '' && !prefix.endsWith('[]')) out.set(prefix, { default: dflt, kind: d.type, enumValues: d.entries && Object.values(d.entries), nullable });
  if (d.type === 'array' && d.element) keySpecs(d.element, `${prefix}[]`, out);
  for (const [key, child] of Object.entries(d.shape ?? {})) keySpecs(child, prefix === '' ? key : `${prefix}.${key}`, out);
  return out;
}

const specs = new Map([
  ...Object.entries(SECTIONS).flatMap(([name, schema]) => [...keySpecs(schema, name)].filter(([k]) => k !== name)),
  ...STAGE_NAMES.flatMap((s) => [...keySpecs(OpenClawRLRecipe.stages[s].configSchema, `pipeline.${s}.config`)]),
]);

/**
 * Keys whose schema default is a placeholder that the loader replaces (resolve.ts), so the doc
 * states the computed value in words.
 */
const COMPUTED_DEFAULTS: Record<string, string> = { 'cluster.num_gpus': 'sum of the layout' };

/** The doc's default cell as a value: one `literal`, read as YAML reads it (`1e-5`, `''`, `[]`). */
function literal(cell: string): { value: unknown } | null {
  const m = /^`([^`]*)`$/.exec(cell);
  return m === null ? null : { value: parseYaml(m[1]!) };
}

/** Backticked words of a type cell (`hf` \| `sglang`). */
const quoted = (cell: string) => [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1]!).sort();

describe('docs/config.md is in step with the schemas', () => {
  it('documents every key', () => {
    expect(schemaKeys.length).toBeGreaterThan(50);
    expect(schemaKeys.filter((k) => !documented.includes(k))).toEqual([]);
  });

  it('documents every training option', () => {
    expect(flags.filter((f) => !documented.includes(f))).toEqual([]);
  });

  it('documents nothing that does not exist', () => {
    expect(documented.filter((k) => !schemaKeys.includes(k) && !flags.includes(k))).toEqual([]);
  });

  it('reads the tables it checks', () => {
    // A renamed column or rows that no longer parse would let every check below pass on nothing.
    const keyRows = schemaKeys.map((k) => rows.get(k));
    expect(keyRows.filter((r) => r === undefined || typeof r.default !== 'string' || typeof r.type !== 'string')).toEqual([]);
    expect(flags.map((f) => rows.get(f)).filter((r) => r === undefined || typeof r.default !== 'string')).toEqual([]);
    expect([...specs.values()].filter((s) => s.default !== undefined).length).toBeGreaterThan(40);
  });

  it('gives each key the default the schema applies', () => {
    const wrong: string[] = [];
    for (const [key, spec] of specs) {
      const cell = rows.get(key)?.default;
      if (cell === undefined) continue; // a missing row fails 'documents every key'
      const said = literal(cell);
      if (key in COMPUTED_DEFAULTS) {
        if (cell !== COMPUTED_DEFAULTS[key]) wrong.push(`${key}: doc says ${cell}, expected the computed default "${COMPUTED_DEFAULTS[key]}"`);
      } else if (spec.default !== undefined) {
        if (said === null || JSON.stringify(said.value) !== JSON.stringify(spec.default.value)) {
          wrong.push(`${key}: doc says ${cell || '(nothing)'}, the schema's default is ${JSON.stringify(spec.default.value)}`);
        }
      } else if (spec.kind === 'object' || spec.kind === 'unknown') {
        // A mapping without a default of its own is all its keys' defaults.
        if (cell !== '' && cell !== '`{}`') wrong.push(`${key}: a mapping; doc says ${cell}, expected nothing or \`{}\``);
      } else if (!cell.startsWith('required')) {
        wrong.push(`${key}: the schema has no default (the key is required), doc says ${cell || '(nothing)'}`);
      }
    }
    expect(wrong).toEqual([]);
  });

  it('says which keys take null', () => {
    // Sections (`section()`) read null as "all defaults": that is a rule of the doc, not a type.
    const wrong = [...specs]
      .filter(([key, spec]) => rows.has(key) && spec.kind !== 'object' && spec.kind !== 'unknown')
      .filter(([key, spec]) => /\bnull\b/.test(rows.get(key)!.type!) !== spec.nullable)
      .map(([key, spec]) => `${key}: doc type ${rows.get(key)!.type}, ${spec.nullable ? 'takes' : 'does not take'} null`);
    expect(wrong).toEqual([]);
  });

  it('lists the values of each enumerated key', () => {
    const wrong = [...specs]
      .filter(([key, spec]) => spec.enumValues !== undefined && rows.has(key))
      .filter(([key, spec]) => JSON.stringify(quoted(rows.get(key)!.type!)) !== JSON.stringify([...spec.enumValues!].sort()))
      .map(([key, spec]) => `${key}: doc says ${rows.get(key)!.type}, the schema takes ${spec.enumValues!.join(', ')}`);
    expect(wrong).toEqual([]);
  });

  it('gives each training option its default and values', () => {
    const wrong: string[] = [];
    for (const o of OpenClawRLRecipe.trainingOptions.options) {
      const row = rows.get(o.flag);
      if (row === undefined) continue;
      const said = literal(row.default ?? '');
      if (said === null || said.value !== o.default) wrong.push(`${o.flag}: doc says ${row.default}, the default is ${String(o.default)}`);
      const values = defOf(o.schema).entries;
      if (values !== undefined && JSON.stringify(quoted(row.type ?? '')) !== JSON.stringify(Object.values(values).sort())) {
        wrong.push(`${o.flag}: doc says ${row.type}, it takes ${Object.values(values).join(', ')}`);
      }
    }
    expect(wrong).toEqual([]);
  });
});
