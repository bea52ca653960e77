import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import YAML from 'yaml';
import { resolveConfig, type ReefConfig } from '../../cluster/config/index.js';
import { distEntry, repoRoot, tinyModelDir } from '../../cluster/paths.js';
import { startGateway, type Gateway, type GatewayOptions } from '../../actors/gateway/index.js';
import { startFakeEngine, type FakeEngine, type FakeEngineOptions } from '../helpers/fake-engine.js';

/**
 * A real gateway (fastify on port 0, SQLite store in a temp dir, tokenizer pool on the tiny model)
 * in front of the fake engine, for the gateway's integration tests.
 */

export const CPU_EXAMPLE = join(repoRoot(), 'recipes/openclawrl/examples/cpu/serve.yaml');

function newestMtime(dir: string): number {
  let newest = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) newest = Math.max(newest, newestMtime(p));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.test.ts')) newest = Math.max(newest, statSync(p).mtimeMs);
  }
  return newest;
}

/** Tokenizer workers and spawned gateways run from dist/: rebuild it when the sources are newer. */
export function ensureBuilt(): void {
  if (!existsSync(join(tinyModelDir(), 'tokenizer.json'))) {
    throw new Error(`no tiny model at ${tinyModelDir()}: PYTHONPATH=python_shim .venv/bin/python -m reef_shim.tiny_model --out .cache/tiny-model`);
  }
  const main = distEntry('actors/gateway/main');
  const root = repoRoot();
  // Only what the gateway runs: other actors' work in progress must not force a rebuild per file.
  const newest = Math.max(...['actors/gateway', 'actors/runtime', 'cluster', 'recipes'].map((d) => newestMtime(join(root, d))));
  if (existsSync(main) && statSync(main).mtimeMs >= newest) return;
  try {
    execFileSync(join(root, 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: root, stdio: 'pipe' });
  } catch {
    // tsc emits even when an unrelated part of the tree fails to typecheck.
  }
  if (!existsSync(main)) throw new Error(`build did not produce ${main}`);
}

export interface ApiKeyRaw {
  key?: string;
  key_env?: string;
  scenarios?: string[] | null;
  max_concurrency?: number;
  requests_per_minute?: number | null;
  tokens_per_minute?: number | null;
}

/** The CPU example's raw YAML tree with the data dir, keys and `reef.limits` replaced. */
export function rawConfig(dataDir: string, apiKeys: ApiKeyRaw[] = [], limits: Record<string, unknown> = {}): Record<string, unknown> {
  const raw = YAML.parse(readFileSync(CPU_EXAMPLE, 'utf8')) as Record<string, Record<string, unknown>>;
  raw.reef = { ...raw.reef, data_dir: dataDir, api_keys: apiKeys, limits };
  return raw;
}

export async function testConfig(dataDir: string, apiKeys: ApiKeyRaw[] = [], limits: Record<string, unknown> = {}): Promise<ReefConfig> {
  return resolveConfig(rawConfig(dataDir, apiKeys, limits), { baseDir: dirname(CPU_EXAMPLE) });
}

export interface Stack {
  engine: FakeEngine;
  gw: Gateway;
  url: string;
  dataDir: string;
  close(): Promise<void>;
}

export async function startStack(opts: { engine?: FakeEngineOptions; apiKeys?: ApiKeyRaw[]; limits?: Record<string, unknown>; tokenizerThreads?: number; inlinePrepareBytes?: number; log?: (line: string) => void; rollback?: GatewayOptions['rollback'] } = {}): Promise<Stack> {
  ensureBuilt();
  const dataDir = mkdtempSync(join(tmpdir(), 'reef-gw-'));
  const engine = await startFakeEngine(opts.engine ?? {});
  const config = await testConfig(dataDir, opts.apiKeys, opts.limits);
  let gw: Gateway;
  try {
    gw = await startGateway({ config, engineUrl: engine.url, listen: { host: '127.0.0.1', port: 0 }, tokenizerThreads: opts.tokenizerThreads ?? 1, ...(opts.inlinePrepareBytes !== undefined ? { inlinePrepareBytes: opts.inlinePrepareBytes } : {}), ...(opts.log ? { log: opts.log } : {}), ...(opts.rollback ? { rollback: opts.rollback } : {}) });
  } catch (err) {
    await engine.close();
    rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  return {
    engine,
    gw,
    url: gw.url,
    dataDir,
    async close() {
      await engine.close();
      await gw.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export const CHAT = { model: 'tiny', messages: [{ role: 'user', content: 'Hello there' }] };

export async function postChat(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
}

/** Reads an SSE body event by event, calling `onEvent` with each `data:` payload as it arrives. */
export async function readSse(res: Response, onEvent?: (data: string) => void | Promise<void>): Promise<string[]> {
  const events: string[] = [];
  const reader = res.body!.getReader();
  const dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let sep: number;
    while ((sep = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        events.push(data);
        await onEvent?.(data);
      }
    }
  }
  return events;
}

/** Asserts the OpenAI error body shape; returns the error. */
export function openAIError(body: unknown): { message: string; type: string; param: string | null; code: string } {
  const e = (body as { error?: Record<string, unknown> })?.error;
  if (!e || typeof e.message !== 'string' || typeof e.type !== 'string' || typeof e.code !== 'string' || !(e.param === null || typeof e.param === 'string')) {
    throw new Error(`not an OpenAI error body: ${JSON.stringify(body)}`);
  }
  return e as { message: string; type: string; param: string | null; code: string };
}
