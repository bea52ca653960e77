import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import YAML from 'yaml';
import { startGateway, type Gateway } from '../../actors/gateway/index.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/index.js';
import { resolveConfig } from '../../cluster/config/index.js';
import { distEntry, repoRoot, tinyModelDir } from '../../cluster/paths.js';
import { startFakeEngine, type FakeEngine, type FakeGeneration } from '../helpers/fake-engine.js';

/**
 * A real gateway (port 0, SQLite in a temp dir, the tiny model's tokenizer) in front of the engine
 * double, whose replies a test scripts from the decoded prompt: the example's tests drive the
 * agent loop through the whole HTTP path without a model.
 */

const CPU_EXAMPLE = join(repoRoot(), 'recipes/openclawrl/examples/cpu/serve.yaml');

/** Builds dist/ when `modulePath`'s compiled file is missing or older than its source (children and workers run compiled code). */
export function ensureDist(modulePath: string): string {
  const built = distEntry(modulePath);
  const source = join(repoRoot(), `${modulePath}.ts`);
  if (existsSync(built) && statSync(built).mtimeMs >= statSync(source).mtimeMs) return built;
  try {
    execFileSync(join(repoRoot(), 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: repoRoot(), stdio: 'pipe' });
  } catch {
    // tsc still emits when an unrelated file fails to typecheck.
  }
  if (!existsSync(built)) throw new Error(`build did not produce ${built}`);
  return built;
}

function ensureWorkerBuilt(): void {
  if (!existsSync(join(tinyModelDir(), 'tokenizer.json'))) {
    throw new Error(`no tiny model at ${tinyModelDir()}: PYTHONPATH=python_shim .venv/bin/python -m reef_shim.tiny_model --out .cache/tiny-model`);
  }
  ensureDist('actors/gateway/tokenize/worker');
}

export interface PromptView {
  /** The rendered prompt. */
  text: string;
  /** Contents of the user turns, in order (tool results included, as the template renders them). */
  userTurns: string[];
}

export function promptView(text: string): PromptView {
  const userTurns = text
    .split('<|im_start|>')
    .filter((b) => b.startsWith('user'))
    .map((b) => b.slice('user'.length).replace(/<\|im_end\|>\s*$/, '').trim());
  return { text, userTurns };
}

/** Splits a reply into word pieces, one token each. */
export function pieces(text: string): FakeGeneration {
  return { pieces: text.split(/(?<=\s)/) };
}

export interface GatewayFixture {
  gw: Gateway;
  engine: FakeEngine;
  url: string;
  dataDir: string;
  close(): Promise<void>;
}

export async function startGatewayFixture(respond: (prompt: PromptView) => string): Promise<GatewayFixture> {
  ensureWorkerBuilt();
  const tok = ChatTokenizer.load(tinyModelDir());
  const dataDir = mkdtempSync(join(tmpdir(), 'reef-example-'));
  const engine = await startFakeEngine({ respond: ({ inputIds }) => pieces(respond(promptView(tok.decode(inputIds ?? [])))) });
  const raw = YAML.parse(readFileSync(CPU_EXAMPLE, 'utf8')) as Record<string, Record<string, unknown>>;
  raw.reef = { ...raw.reef, data_dir: dataDir, api_keys: [] };
  try {
    const config = await resolveConfig(raw, { baseDir: dirname(CPU_EXAMPLE) });
    const gw = await startGateway({ config, engineUrl: engine.url, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: 1 });
    return {
      gw,
      engine,
      url: gw.url,
      dataDir,
      async close() {
        await gw.close();
        await engine.close();
        rmSync(dataDir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await engine.close();
    rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
}
