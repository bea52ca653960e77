import { cpSync, existsSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tinyModelDir } from '../../cluster/paths.js';

/**
 * The tiny model's files copied to `out` (a directory that need not exist), for a test to edit. The
 * tiny model dir is a link into the user cache: the files are copied, never the link, or an edit
 * would rewrite the shared model (regression: it did).
 */
export function copyTinyModel(out: string): string {
  cpSync(realpathSync(tinyModelDir()), out, { recursive: true, dereference: true });
  return out;
}

/**
 * A copy of the tiny model that declares a longer context. The tiny model says 4,096 positions, and
 * an OpenClaw-shaped request (20–40k characters of system prompt, a dozen tools) is 15–30k of its
 * tokens; its RoPE has no hard limit, so declaring 32k lets the gateway and the engine take the
 * real shape. Weights, tokenizer and template are the tiny model's own.
 */
export function longContextModel(parentDir: string, contextLength = 32_768): string {
  const out = join(parentDir, `tiny-model-${Math.round(contextLength / 1024)}k`);
  if (existsSync(join(out, 'config.json'))) return out;
  copyTinyModel(out);
  const patch = (file: string, key: string): void => {
    const j = JSON.parse(readFileSync(join(out, file), 'utf8')) as Record<string, unknown>;
    j[key] = contextLength;
    writeFileSync(join(out, file), `${JSON.stringify(j, null, 2)}\n`);
  };
  patch('config.json', 'max_position_embeddings');
  patch('tokenizer_config.json', 'model_max_length');
  return out;
}
