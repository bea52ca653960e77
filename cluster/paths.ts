import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root, found from this file whether it runs from source or from dist/. */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json')) && existsSync(join(dir, 'python_shim'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) throw new Error('cannot find the Reef repository root above ' + fileURLToPath(import.meta.url));
    dir = parent;
  }
}

/** Compiled entry of a module, e.g. `distEntry('actors/prm/main')`. Children always run from dist/. */
export function distEntry(modulePath: string): string {
  return join(repoRoot(), 'dist', `${modulePath}.js`);
}

/** The Python interpreter of the project venv (`.venv`, made by scripts/setup.sh). */
export function pythonBin(): string {
  const override = process.env.REEF_PYTHON;
  if (override) return override;
  return join(repoRoot(), '.venv', 'bin', 'python');
}

/** Environment for Python children: the shim package on the path, unbuffered output. */
export function pythonEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const shim = join(repoRoot(), 'python_shim');
  const prior = process.env.PYTHONPATH;
  return {
    ...process.env,
    PYTHONPATH: prior ? `${shim}:${prior}` : shim,
    PYTHONUNBUFFERED: '1',
    ...extra,
  };
}

/** Where the tiny test model is built by `scripts/setup.sh`. */
export function tinyModelDir(): string {
  return process.env.REEF_TINY_MODEL ?? join(repoRoot(), '.cache', 'tiny-model');
}

/**
 * Where SmolLM2-135M-Instruct, a real pretrained model (Llama architecture, 49,152-id byte-level BPE,
 * ChatML template), is installed by `scripts/setup.sh` (`python -m reef_shim.smollm2_model`).
 */
export function smolModelDir(): string {
  return process.env.REEF_SMOL_MODEL ?? join(repoRoot(), '.cache', 'smollm2-135m-instruct');
}

export function resolveFrom(base: string, p: string): string {
  return resolve(base, p);
}
