import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { claimRunFile, clearRunFile, processStartMs, readRunFile, reusedRunFile, runFilePath, type RunFile, writeRunFile } from './run-file.js';

const dirs: string[] = [];
afterEach(() => {
  while (dirs.length > 0) rmSync(dirs.pop()!, { recursive: true, force: true });
});

function runDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'reef-run-'));
  dirs.push(dir);
  return dir;
}

/** After this process started, as a stack's own `startedAt` is. */
const STARTED = Date.now();
const starting = (pid: number): RunFile => ({ pid, state: 'starting', control: null, startedAt: STARTED, configPath: '/c/serve.yaml', gateway: 'http://127.0.0.1:8600' });

/** A pid that certainly belonged to a process that has exited. */
function deadPid(): number {
  return spawnSync(process.execPath, ['-e', '0']).pid!;
}

describe('run file', () => {
  it.each([[0], [-1], ['123'], [null], [1.5]])('treats a file whose pid is %j as no stack, signalling nothing', (pid) => {
    const dir = runDir();
    writeFileSync(runFilePath(dir), JSON.stringify({ ...starting(process.pid), pid }));
    expect(readRunFile(dir)).toBeNull();
    claimRunFile(dir, starting(process.pid));
    expect(readRunFile(dir)).toEqual(starting(process.pid));
  });

  it.skipIf(processStartMs(process.pid) === null)('takes over the file of a killed stack whose pid another process has since taken', () => {
    const dir = runDir();
    // A process started now, named by a file a stack wrote a minute ago: the pid was reused.
    const other = spawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      const old = { ...starting(other.pid!), state: 'running' as const, control: 'tcp://127.0.0.1:1', startedAt: Date.now() - 60_000 };
      writeFileSync(runFilePath(dir), JSON.stringify(old));
      expect(readRunFile(dir)).toBeNull();
      expect(reusedRunFile(dir)).toMatchObject({ rf: { pid: other.pid } });
      claimRunFile(dir, starting(process.pid));
      expect(readRunFile(dir)).toEqual(starting(process.pid));
      expect(other.exitCode).toBeNull(); // nothing signalled it
    } finally {
      other.kill();
    }
  });

  it('is claimed by one stack only: a second claim fails while the first one lives', () => {
    const dir = runDir();
    claimRunFile(dir, starting(process.pid));
    expect(readRunFile(dir)).toEqual(starting(process.pid));
    expect(() => claimRunFile(dir, starting(process.ppid))).toThrow(expect.objectContaining({ code: 'REEF_ERR_ALREADY_RUNNING', message: expect.stringContaining(`pid ${process.pid}, control none yet: still starting`) }));
    expect(readRunFile(dir)?.pid).toBe(process.pid);
  });

  it('takes over the file of a stack that was killed', () => {
    const dir = runDir();
    writeFileSync(runFilePath(dir), JSON.stringify({ ...starting(deadPid()), state: 'running', control: 'tcp://127.0.0.1:1' }));
    expect(readRunFile(dir)).toBeNull();
    claimRunFile(dir, starting(process.pid));
    expect(readRunFile(dir)).toEqual(starting(process.pid));
  });

  // clearRunFile removed the file whoever owned it: a `reef up` that failed because another stack
  // was running deleted that stack's file, and `reef status|down` lost it.
  it('is cleared only by its own stack', () => {
    const dir = runDir();
    writeRunFile(dir, { ...starting(process.ppid), state: 'running', control: 'tcp://127.0.0.1:1' });
    clearRunFile(dir);
    expect(readRunFile(dir)?.pid).toBe(process.ppid);
    clearRunFile(dir, process.ppid);
    expect(existsSync(runFilePath(dir))).toBe(false);
  });

  it('reads a file written before `state` existed as a running stack', () => {
    const dir = runDir();
    writeFileSync(runFilePath(dir), JSON.stringify({ pid: process.pid, control: 'tcp://127.0.0.1:1', startedAt: STARTED, configPath: '/c', gateway: 'http://g' }));
    expect(readRunFile(dir)).toMatchObject({ state: 'running', control: 'tcp://127.0.0.1:1' });
  });
});
