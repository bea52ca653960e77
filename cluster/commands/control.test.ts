import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { parseArgs } from '../args.js';
import { freePort } from '../net.js';
import type { Io } from '../cli.js';
import { pidAlive, type RunFile } from '../run-file.js';
import { processStartMs } from '../run-file.js';
import { STATE_KEY as JUDGE_STATE_KEY } from '../../actors/judge/handler.js';
import { makeBusKeyFile } from '../../actors/runtime/bus-key.js';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { STATE_KEY as TRAINER_STATE_KEY } from '../../actors/trainer-controller/messages.js';
import { downCommand, pipelineOf, scaleCommand, statusCommand } from './control.js';
import { renderPipeline, renderStatus } from './render-status.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  while (cleanups.length > 0) cleanups.pop()!();
});

function tempDataDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'reef-control-'));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

function capture(): Io & { out: string[]; err: string[] } {
  const out: string[] = [];
  const err: string[] = [];
  return { out, err, stdout: (s) => out.push(s), stderr: (s) => err.push(s) };
}

function writeRunFile(dataDir: string, rf: RunFile): void {
  mkdirSync(join(dataDir, 'run'), { recursive: true });
  writeFileSync(join(dataDir, 'run', 'supervisor.json'), JSON.stringify(rf));
}

/** A live process that is not a reef stack, as a reused pid would be. */
function bystander(): ChildProcess {
  const child = spawn('sleep', ['60'], { stdio: 'ignore' });
  cleanups.push(() => child.kill('SIGKILL'));
  return child;
}

describe('reef status / scale / down', () => {
  it('report REEF_ERR_NOT_RUNNING when no stack has a run file', async () => {
    const dataDir = tempDataDir();
    const args = parseArgs(['status', '--data-dir', dataDir]);
    await expect(statusCommand(args, capture())).rejects.toMatchObject({ code: 'REEF_ERR_NOT_RUNNING' });
    await expect(downCommand(args, capture())).rejects.toMatchObject({ code: 'REEF_ERR_NOT_RUNNING' });
  });

  // `reef scale prm "$N"` with N unset passed '', which Number() reads as 0: every PRM stopped.
  it.each([[''], [' '], ['0x2'], ['1e1'], ['-1'], ['1.5'], ['65'], ['1000']])('scale refuses the count %j with usage and exit 2', async (count) => {
    const io = capture();
    await expect(scaleCommand(parseArgs(['scale', '--data-dir', tempDataDir()]), ['prm', count], io)).resolves.toBe(2);
    expect(io.err.join('\n')).toContain('usage: reef scale prm N');
  });

  it('scale refuses extra arguments instead of ignoring them', async () => {
    await expect(scaleCommand(parseArgs(['scale', '--data-dir', tempDataDir()]), ['prm', '2', '3'], capture())).resolves.toBe(2);
  });

  // A stack killed with SIGKILL leaves its run file; once its pid belongs to another process,
  // `down` of a stack "still starting" sent that process SIGTERM.
  it.skipIf(processStartMs(process.pid) === null)('down and status treat a run file whose pid was reused as stale and signal nothing', async () => {
    const dataDir = tempDataDir();
    const other = bystander();
    await new Promise((resolve) => other.once('spawn', resolve));
    const pid = other.pid!;
    writeRunFile(dataDir, { pid, state: 'starting', control: null, startedAt: Date.now() - 3_600_000, configPath: '/x/serve.yaml', gateway: 'http://127.0.0.1:1' });
    const args = parseArgs(['down', '--data-dir', dataDir]);
    const err = await downCommand(args, capture()).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'REEF_ERR_NOT_RUNNING', message: expect.stringContaining(`pid ${pid}, which is now another process`) });
    await expect(statusCommand(args, capture())).rejects.toMatchObject({ code: 'REEF_ERR_NOT_RUNNING' });
    expect(other.exitCode).toBeNull();
    expect(other.signalCode).toBeNull();
    expect(pidAlive(pid)).toBe(true);
  });

  // `down` of a stack whose control socket did not answer failed with REEF_ERR_TIMEOUT and left
  // the stack running.
  it('down sends SIGTERM to a running stack that does not acknowledge down, and waits for it to stop', async () => {
    const dataDir = tempDataDir();
    const stack = bystander();
    await new Promise((resolve) => stack.once('spawn', resolve));
    const exited = new Promise((resolve) => stack.once('exit', (_code, sig) => resolve(sig)));
    writeRunFile(dataDir, { pid: stack.pid!, state: 'running', control: `tcp://127.0.0.1:${await freePort()}`, startedAt: Date.now(), configPath: '/x/serve.yaml', gateway: 'http://127.0.0.1:1' });
    // A running stack has its bus key in the run dir; without one the CLI cannot even ask.
    makeBusKeyFile(join(dataDir, 'run'));
    const io = capture();
    await expect(downCommand(parseArgs(['down', '--data-dir', dataDir]), io, { ackTimeoutMs: 300 })).resolves.toBe(0);
    expect(await exited).toBe('SIGTERM');
    expect(io.out[0]).toMatch(new RegExp(`^reef \\(pid ${stack.pid}\\) did not answer down on tcp://127\\.0\\.0\\.1:\\d+ \\(.*timed out after 300 ms\\); sent it SIGTERM`));
    expect(io.out.at(-1)).toBe('stopped');
  }, 30_000);

  it('down and status say that a stack was killed when its run file names a pid that has exited', async () => {
    const dataDir = tempDataDir();
    const gone = spawnSync(process.execPath, ['-e', '0']).pid!;
    writeRunFile(dataDir, { pid: gone, state: 'running', control: 'tcp://127.0.0.1:1', startedAt: Date.now(), configPath: '/x/serve.yaml', gateway: 'http://127.0.0.1:1' });
    for (const command of [downCommand, statusCommand]) {
      await expect(command(parseArgs(['down', '--data-dir', dataDir]), capture())).rejects.toMatchObject({
        code: 'REEF_ERR_NOT_RUNNING',
        message: expect.stringContaining(`the stack of pid ${gone} (started `),
      });
    }
  });

  it('status shows a stack that is still starting when its pid is the process that wrote the file', async () => {
    const dataDir = tempDataDir();
    writeRunFile(dataDir, { pid: process.pid, state: 'starting', control: null, startedAt: Date.now(), configPath: '/x/serve.yaml', gateway: 'http://127.0.0.1:1' });
    const io = capture();
    await expect(statusCommand(parseArgs(['status', '--data-dir', dataDir]), io)).resolves.toBe(0);
    expect(io.out.join('\n')).toContain(`reef is starting (pid ${process.pid}`);
  });
});

describe('reef status: the pipeline section', () => {
  it('reads what the stack recorded, judged and trained from the record store, read-only', async () => {
    const dataDir = tempDataDir();
    expect(await pipelineOf(dataDir)).toEqual({ error: `no record store at ${join(dataDir, 'records.sqlite')}` });
    const store = SqliteStore.open(join(dataDir, 'records.sqlite'));
    for (let i = 0; i < 3; i++) await store.append(sampleRecord(i));
    await store.putState(JUDGE_STATE_KEY, { correlator: { counters: { bound: 2 } }, counters: { votes_ok: 12, votes_invalid: 2, votes_failed: 1, judged: 2, dropped: 1 } });
    await store.putState(TRAINER_STATE_KEY, { releases: [{ weightVersion: 'v1' }, { weightVersion: 'v2' }], counters: { batches: 2, samples: 32, stale: 3 } });
    await store.close();
    const p = await pipelineOf(dataDir);
    expect(p).toMatchObject({ records: 3, training: { releases: 2, weightVersion: 'v2' } });
    expect(renderPipeline(p)).toEqual([
      'records   3 recorded; 2 turns bound to what came next',
      'judge     2 turns judged (1 dropped: no usable vote); votes 10 usable, 2 unreadable, 1 failed',
      'training  2 releases (serving v2); 2 batches of 32 turns; 3 stale, 0 dead-lettered',
    ]);
  });
});

// A crash-looping actor showed as `failed` with a restart count; why it died was only in the log
// of `reef up` (a file nobody is watching under --detach).
describe('reef status: restarted children', () => {
  it('says why each restarted child died last', () => {
    const rf: RunFile = { pid: 1, state: 'running', control: 'tcp://127.0.0.1:1', startedAt: Date.now(), configPath: '/x/serve.yaml', gateway: 'http://127.0.0.1:8600' };
    const text = renderStatus(rf, {
      shim: { pid: 9, state: 'running', restarts: 1, lastExit: 'exit signal SIGKILL' },
      actors: [
        { id: 'gateway-0', pid: 11, state: 'running', restarts: 0, lastExit: null },
        { id: 'judge-0', pid: null, state: 'failed', restarts: 3, lastExit: 'exit code 1' },
      ],
    }).split('\n');
    expect(text).toContain('shim: pid 9, running, restarts 1 (last: exit signal SIGKILL)');
    expect(text).toContain(`${'gateway-0'.padEnd(22)}${'11'.padEnd(9)}${'running'.padEnd(11)}0`);
    expect(text).toContain(`${'judge-0'.padEnd(22)}${'-'.padEnd(9)}${'failed'.padEnd(11)}3 (last: exit code 1)`);
  });
});
