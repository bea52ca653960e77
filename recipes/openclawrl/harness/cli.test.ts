import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { isMainModule, parseCli } from './cli.js';

const dir = mkdtempSync(join(tmpdir(), 'reef-harness-cli-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('harness CLI', () => {
  it.each([
    [['--sesions', '5'], /Unknown option '--sesions'/],
    [['--sessions'], /argument missing/],
    [['extra'], /positional argument/],
    [['--api-key', 'k'.repeat(40)], /--api-key: a key on the command line can be read by every user of this machine .*--api-key-env NAME/],
  ])('refuses %j as an argument error', async (argv, msg) => {
    await expect(parseCli(argv, {})).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    await expect(parseCli(argv, {})).rejects.toThrow(msg);
  });

  it('knows it is the main module through a symlink and in a directory named with # and a space', () => {
    // Node runs the main module from its real path: process.argv[1] keeps the path as typed.
    const real = join(dir, 'real dir#1');
    mkdirSync(real);
    writeFileSync(join(real, 'cli.js'), '');
    symlinkSync(real, join(dir, 'link'));
    const url = pathToFileURL(join(real, 'cli.js')).href;
    expect(isMainModule(join(real, 'cli.js'), url)).toBe(true);
    expect(isMainModule(join(dir, 'link', 'cli.js'), url)).toBe(true);
    expect(isMainModule(join(dir, 'other.js'), url)).toBe(false);
    expect(isMainModule(undefined, url)).toBe(false);
  });
});
