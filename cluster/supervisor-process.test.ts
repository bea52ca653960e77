import { afterEach, describe, expect, it } from 'vitest';
import { ManagedProcess, readyOnJsonLine } from './supervisor-process.js';

const procs: ManagedProcess[] = [];
afterEach(async () => {
  while (procs.length > 0) await procs.pop()!.stop();
});

/** Ready on a `{"event":"ready"}` line, as the shim is. */
function managed(command: string, args: string[], readyTimeoutMs: number): { proc: ManagedProcess; restarts: unknown[] } {
  const proc = new ManagedProcess({ id: 'child', command, args, ready: readyOnJsonLine('ready'), readyTimeoutMs, backoff: { initialMs: 50, maxMs: 200 }, log: () => {} });
  const restarts: unknown[] = [];
  proc.on('restart', (info) => restarts.push(info));
  procs.push(proc);
  return { proc, restarts };
}

describe('ManagedProcess start-up failures', () => {
  // `reef up` without the venv (or with a wrong REEF_PYTHON) respawned the missing interpreter
  // for the shim's whole 60 s ready timeout, then said only "shim not ready within 60000 ms (10 restarts)".
  it('gives up at once on a command that cannot be spawned, saying why', async () => {
    const { proc, restarts } = managed('/nonexistent/reef-python', [], 20_000);
    await expect(proc.start()).rejects.toMatchObject({ code: 'REEF_ERR_SUPERVISOR', message: expect.stringContaining('child cannot be started: spawn failed: spawn /nonexistent/reef-python ENOENT') });
    expect(restarts).toEqual([]);
    expect(proc.state).toBe('stopped');
    await expect(proc.waitReady(20_000)).rejects.toMatchObject({ message: expect.stringContaining('cannot be started') });
  });

  it('names what killed the last child when one never gets ready', async () => {
    const { proc, restarts } = managed(process.execPath, ['-e', 'process.exit(3)'], 1_500);
    await expect(proc.start()).rejects.toMatchObject({ message: expect.stringMatching(/child not ready within 1500 ms \(\d+ restarts; the last died of exit code 3\)/) });
    expect(restarts.length).toBeGreaterThan(0);
  });
});
