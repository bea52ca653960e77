/**
 * Resolves `recipe.implementation` (`recipes.openclawrl.recipe:OpenClawRLRecipe`) to the recipe
 * class: the dotted module path is a file under the code root (the repository when run from
 * source, `dist/` when compiled), the part after `:` an export of it.
 */
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { STAGE_NAMES, type RecipeClass } from './types.js';

/** This file is `<root>/cluster/config/…`, so the root is two levels up (repo root or dist/). */
const CODE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

const cache = new Map<string, Promise<RecipeClass>>();

/** Loads (once) the recipe class named by `spec`; rejects with a message for `recipe.implementation`. */
export function loadRecipe(spec: string): Promise<RecipeClass> {
  let p = cache.get(spec);
  if (p === undefined) {
    p = importRecipe(spec);
    cache.set(spec, p);
    p.catch(() => cache.delete(spec));
  }
  return p;
}

async function importRecipe(spec: string): Promise<RecipeClass> {
  const [modulePath, exportName] = spec.split(':') as [string, string];
  const base = join(CODE_ROOT, ...modulePath.split('.'));
  // From source (tests) only the .ts file exists; compiled code finds the .js one.
  const file = [`${base}.js`, `${base}.ts`].find((f) => existsSync(f));
  if (file === undefined) throw new Error(`no module ${modulePath} (looked for ${base}.js)`);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (err) {
    throw new Error(`cannot import ${modulePath}: ${(err as Error).message}`);
  }
  if (!Object.hasOwn(mod, exportName)) throw new Error(`module ${modulePath} has no export ${exportName}`);
  const recipe = mod[exportName];
  const problem = recipeProblem(recipe);
  if (problem !== null) throw new Error(`${spec} is not a recipe: ${problem}`);
  return recipe as RecipeClass;
}

function isZodObject(v: unknown): boolean {
  return typeof v === 'object' && v !== null && (v as { _zod?: { def?: { type?: string } } })._zod?.def?.type === 'object';
}

function recipeProblem(r: unknown): string | null {
  if ((typeof r !== 'function' && typeof r !== 'object') || r === null) return 'not a class';
  const rec = r as Partial<RecipeClass>;
  if (typeof rec.stages !== 'object' || rec.stages === null) return 'no static stages';
  for (const name of STAGE_NAMES) {
    const stage = rec.stages[name];
    if (stage === undefined || !isZodObject(stage.configSchema)) return `stages.${name} has no configSchema`;
  }
  if (!isZodObject(rec.configSchema)) return 'no static configSchema';
  if (!Array.isArray(rec.trainingOptions?.options) || typeof rec.trainingOptions?.resolve !== 'function') return 'no static trainingOptions';
  return null;
}
