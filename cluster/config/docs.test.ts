import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
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
});
