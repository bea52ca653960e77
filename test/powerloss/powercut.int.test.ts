import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cutPower, powercutEnv, watchedPids } from '../helpers/powercut.js';

/**
 * The power-loss emulation's model (test/helpers/powercut/powercut.c), one rule per file: a writer
 * under the library does each kind of write, the cut puts the durable image in place, and what is
 * left is what the model says a power cut leaves.
 */

const WRITER = `
const fs = require('node:fs');
const d = process.argv[1];
const put = (name, text, sync) => { const fd = fs.openSync(d + '/' + name, 'w'); fs.writeSync(fd, text); if (sync) fs.fsyncSync(fd); return fd; };
const syncDir = (p) => { const fd = fs.openSync(p, 'r'); fs.fsyncSync(fd); fs.closeSync(fd); };
fs.closeSync(put('listed-only', 'data never fsynced', false));
let fd = put('synced', 'durable', true);
fs.writeSync(fd, ' and then not');
fs.closeSync(fd);
fs.closeSync(put('.tmp1', 'renamed, then the directory fsynced', true));
fs.renameSync(d + '/.tmp1', d + '/renamed');
syncDir(d);
fs.closeSync(put('never', 'not fsynced, not listed', false));
fs.closeSync(put('.tmp2', 'renamed, the directory not fsynced', true));
fs.renameSync(d + '/.tmp2', d + '/renamed-unsynced');
fs.closeSync(put('store-shm', 'a WAL index', true));
fs.mkdirSync(d + '/sub');
fs.closeSync(put('sub/deep', 'in a new directory', true));
process.stdout.write('done\\n');
setInterval(() => {}, 1000);
`;

describe('the power-loss emulation (fsync granularity)', () => {
  const base = mkdtempSync(join(tmpdir(), 'reef-powercut-'));
  afterAll(() => rmSync(base, { recursive: true, force: true }));

  it('keeps what was fsynced as it was at the fsync, names a directory fsync listed, and nothing else', async () => {
    const dir = join(base, 'watched');
    const shadow = join(base, 'durable');
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir);
    const child = spawn(process.execPath, ['-e', WRITER, dir], { env: { ...process.env, ...powercutEnv(dir, shadow) }, stdio: ['ignore', 'pipe', 'inherit'], detached: true });
    await new Promise<void>((resolve, reject) => {
      child.stdout!.on('data', (d: Buffer) => d.toString().includes('done') && resolve());
      child.on('exit', (code) => reject(new Error(`writer exited ${code}`)));
    });
    expect(watchedPids(shadow)).toContain(child.pid);
    // Before the cut every file is there, as the page cache has it.
    expect(readFileSync(join(dir, 'synced'), 'utf8')).toBe('durable and then not');
    expect(readFileSync(join(dir, 'never'), 'utf8')).not.toBe('');

    const cut = await cutPower([child], dir, shadow);
    expect(child.signalCode).toBe('SIGKILL');
    const read = (p: string) => readFileSync(join(dir, p), 'utf8');
    expect(readdirSync(dir).sort()).toEqual(['.tmp2', 'listed-only', 'renamed', 'sub', 'synced']);
    expect(read('synced')).toBe('durable');
    expect(read('renamed')).toBe('renamed, then the directory fsynced');
    expect(read('.tmp2')).toBe('renamed, the directory not fsynced');
    expect(read('listed-only')).toBe('');
    expect(read('sub/deep')).toBe('in a new directory');
    expect(statSync(join(dir, 'sub')).isDirectory()).toBe(true);
    expect(cut.dropped.sort()).toEqual(['never', 'renamed-unsynced', 'store-shm']);
  });
});
