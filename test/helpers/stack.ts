import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { repoRoot, tinyModelDir } from '../../cluster/paths.js';

/**
 * Helpers for end-to-end tests that drive the real `reef` CLI: a temporary serve.yaml based on
 * the CPU example, CLI runs with captured output, and the process tree of a running stack.
 */

/** Builds the tiny test model if this checkout has none yet (set-up builds it; a bare vitest run may not have). */
export function ensureTinyModel(): void {
  if (existsSync(join(tinyModelDir(), 'config.json'))) return;
  execFileSync(join(repoRoot(), '.venv/bin/python'), ['-m', 'reef_shim.tiny_model', '--out', tinyModelDir(), '--quiet'], { env: { ...process.env, PYTHONPATH: join(repoRoot(), 'python_shim') } });
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

export function runReef(args: string[], opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {}): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(repoRoot(), 'bin', 'reef.js'), ...args], { cwd: repoRoot(), env: { ...process.env, ...opts.env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`reef ${args.join(' ')} did not finish in ${opts.timeoutMs ?? 300_000} ms\nstdout: ${stdout}\nstderr: ${stderr}`));
    }, opts.timeoutMs ?? 300_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? 1, stdout, stderr });
    });
  });
}

/** Writes a serve.yaml for a test: the CPU example with a temp data dir and the given changes. */
export function testConfig(patch: (cfg: Record<string, any>) => void = () => {}): { path: string; dir: string } {
  const dir = mkdtempSync(join(tmpdir(), 'reef-e2e-'));
  const cfg = parse(readFileSync(join(repoRoot(), 'recipes/openclawrl/examples/cpu/serve.yaml'), 'utf8')) as Record<string, any>;
  cfg.reef.data_dir = join(dir, 'data');
  cfg.cluster.rollout.model_path = tinyModelDir();
  cfg.cluster.prm.model_path = tinyModelDir();
  cfg.pipeline.record2record.config.prm_tokenizer_path = tinyModelDir();
  patch(cfg);
  const path = join(dir, 'serve.yaml');
  writeFileSync(path, stringify(cfg));
  return { path, dir };
}

/**
 * A `reef up` config for a closed training loop on CPU: one PRM actor judging through the PRM at
 * `prmUrl` (OpenAI API, key from REEF_TEST_PRM_KEY), batches of two, distributed weight sync, and a
 * learning rate large enough that one step visibly changes what the tiny model samples.
 */
export function trainingLoopConfig(opts: { port: number; prmUrl: string; prmModel: string; prmTimeoutS: number; patch?: (cfg: Record<string, any>) => void }): { path: string; dir: string } {
  return testConfig((c) => {
    c.reef.port = opts.port;
    c.cluster.prm = { replicas: 0, gpus: 1, engine: 'hf', model_path: null };
    c.cluster.prm_actors = 1;
    c.pipeline.record2record.config = { prm_url: opts.prmUrl, prm_api: 'openai', prm_model: opts.prmModel, prm_api_key_env: 'REEF_TEST_PRM_KEY', prm_m: 1, prm_timeout_s: opts.prmTimeoutS };
    c.pipeline.task2batch.config = { batch_size: 2, prm_record_file: 'prm-records.jsonl' };
    c.training.options = ['--lr=0.05', '--openclawrl-w-rl=1.0', '--openclawrl-w-opd=1.0'];
    c.training.weight_sync = 'distributed';
    opts.patch?.(c);
  });
}

/** One non-streamed chat turn of `session` through a running gateway: its receipt and reply text. */
export async function sessionChat(baseUrl: string, session: string, messages: unknown[], extra: Record<string, unknown> = {}): Promise<{ id: string; content: string }> {
  const res = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-reef-tag-session': session },
    body: JSON.stringify({ messages, max_tokens: 12, temperature: 1.0, ...extra }),
  });
  if (res.status !== 200) throw new Error(`chat answered ${res.status}: ${await res.text()}`);
  const body = (await res.json()) as { choices: Array<{ message: { content: string | null } }> };
  return { id: res.headers.get('x-reef-agent-record-id')!, content: body.choices[0]!.message.content ?? '' };
}

/** Every live descendant of `pid` (children, grandchildren, …), from one `ps` snapshot. */
export function descendants(pid: number): number[] {
  const out = execFileSync('ps', ['-eo', 'pid=,ppid='], { encoding: 'utf8' });
  const children = new Map<number, number[]>();
  for (const line of out.trim().split('\n')) {
    const [p, pp] = line.trim().split(/\s+/).map(Number) as [number, number];
    if (!children.has(pp)) children.set(pp, []);
    children.get(pp)!.push(p);
  }
  const found: number[] = [];
  const stack = [pid];
  while (stack.length) {
    for (const c of children.get(stack.pop()!) ?? []) {
      found.push(c);
      stack.push(c);
    }
  }
  return found;
}

export function commandOf(pid: number): string | null {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
  } catch {
    return null;
  }
}
