import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { request } from 'undici';
import { waitFor } from '../helpers/wait.js';

/**
 * Engine processes for the conformance tests: start, wait until ready (failing fast with the log
 * tail if the child dies), stop with SIGTERM then SIGKILL.
 */
export interface EngineChild {
  child: ChildProcess;
  baseUrl: string;
  /** Everything the child wrote to stdout and stderr so far. */
  output(): string;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves with the exit code (null when killed). */
  stop(graceMs?: number): Promise<number | null>;
}

function track(child: ChildProcess): { output: () => string } {
  let out = '';
  const keep = (d: Buffer) => { out = (out + d.toString()).slice(-20_000); };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  return { output: () => out };
}

function stopper(child: ChildProcess) {
  return async (graceMs = 15_000): Promise<number | null> => {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    try {
      return await exited;
    } finally {
      clearTimeout(timer);
    }
  };
}

function alive(child: ChildProcess, what: string, output: () => string): void {
  if (child.exitCode !== null || child.signalCode !== null) {
    throw new Error(`${what} exited (${child.exitCode ?? child.signalCode}) before it was ready:\n${output().slice(-4000)}`);
  }
}

/** Start a child that prints `{"event":"ready","url":...}` on stdout when it serves (the hf engine). */
export async function startWithReadyLine(cmd: string, args: string[], env: NodeJS.ProcessEnv, timeoutMs: number): Promise<EngineChild> {
  const child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const { output } = track(child);
  const stop = stopper(child);
  try {
    const baseUrl = await waitFor(() => {
      alive(child, cmd, output);
      const line = output().split('\n').find((l) => l.startsWith('{"event": "ready"') || l.startsWith('{"event":"ready"'));
      return line ? (JSON.parse(line) as { url: string }).url : null;
    }, { what: `${args.join(' ')} to print its ready line`, timeoutMs, intervalMs: 100 });
    return { child, baseUrl, output, stop };
  } catch (err) {
    await stop(2000);
    throw err;
  }
}

/** Start a child and poll `GET baseUrl/health` until 200 (SGLang). */
export async function startWithHealth(cmd: string, args: string[], env: NodeJS.ProcessEnv, baseUrl: string, timeoutMs: number): Promise<EngineChild> {
  const child = spawn(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const { output } = track(child);
  const stop = stopper(child);
  try {
    await waitFor(async () => {
      alive(child, cmd, output);
      const res = await request(baseUrl + '/health', { headersTimeout: 2000 }).catch(() => null);
      if (!res) return false;
      await res.body.dump();
      return res.statusCode === 200;
    }, { what: `${baseUrl}/health to answer 200`, timeoutMs, intervalMs: 1000 });
    return { child, baseUrl, output, stop };
  } catch (err) {
    await stop(5000);
    throw err;
  }
}

/** Run a command to completion; `ok` is false when it cannot start or exits non-zero. */
export function runQuietly(cmd: string, args: string[], env?: NodeJS.ProcessEnv, timeoutMs = 30_000): { ok: boolean; output: string } {
  const r = spawnSync(cmd, args, { env, timeout: timeoutMs, encoding: 'utf8' });
  return { ok: !r.error && r.status === 0, output: `${r.stdout ?? ''}${r.stderr ?? ''}${r.error ? String(r.error) : ''}` };
}
