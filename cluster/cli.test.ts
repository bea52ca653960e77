import { describe, expect, it } from 'vitest';
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { testKey } from '../test/helpers/api-keys.js';
import { testConfig } from '../test/helpers/stack.js';
import { main } from './cli.js';

/** Runs the CLI in-process; what it printed and its exit code. */
async function reef(...argv: string[]): Promise<{ code: number; err: string }> {
  let err = '';
  const code = await main(argv, { stdout: () => {}, stderr: (s) => (err += s) });
  return { code, err };
}

describe('reef CLI flags per command', () => {
  it.each([
    [['config', 'check', 'serve.yaml', '--data-dir', '/d'], /reef config does not take --data-dir \(it takes no flags\)/],
    [['up', '--json'], /reef up does not take --json \(it takes --config, --detach\)/],
    [['down', '--out', 'x'], /reef down does not take --out/],
    [['correlate', 'records.jsonl', '--reef.port=1'], /reef correlate reads no config, so --reef\.port=1 would change nothing/],
    // Extra arguments were ignored: `reef down prm` stopped the whole stack, `reef up -c a.yaml
    // b.yaml` started a.yaml alone.
    [['down', 'prm', '--data-dir', '/nonexistent-reef-dir'], /reef down takes no arguments; "prm" would be ignored/],
    [['up', '-c', 'a.yaml', 'b.yaml'], /reef up takes no arguments; "b\.yaml" would be ignored/],
    [['status', 'gateway', '--data-dir', '/nonexistent-reef-dir'], /reef status takes no arguments/],
    // --data-dir won over -c FILE, and overrides went unread.
    [['down', '-c', 'serve.yaml', '--data-dir', '/nonexistent-reef-dir'], /reef down takes -c FILE or --data-dir DIR, not both/],
    [['status', '--data-dir', '/nonexistent-reef-dir', '--reef.data_dir=/x'], /reef status --data-dir reads no config, so --reef\.data_dir=\/x would change nothing/],
    [['export', 'records', 'extra', '--scenario', 's', '--data-dir', '/nonexistent-reef-dir'], /reef export takes at most 1 argument; "extra"/],
  ])('refuses %j before running anything (exit 2)', async (argv, message) => {
    const r = await reef(...argv);
    expect(r.code).toBe(2);
    expect(r.err).toMatch(message);
  });

  it('reports a failed system call by its message, without a stack trace (exit 1)', async () => {
    const cfg = testConfig();
    try {
      const file = join(cfg.dir, 'a-file');
      writeFileSync(file, '');
      const r = await reef('up', '-c', cfg.path, `--reef.data_dir=${file}`);
      expect(r.code).toBe(1);
      // The data dir itself is made (0700) before its run/ dir: mkdir meets the file first.
      expect(r.err).toBe(`reef: EEXIST: file already exists, mkdir '${file}'`);
    } finally {
      rmSync(cfg.dir, { recursive: true, force: true });
    }
  });

  // argv is world-readable (/proc/<pid>/cmdline), and `reef up` passed its overrides on to its
  // detached child and to every actor, where the key stayed readable for the stack's whole life.
  it('refuses an API key given as an override, before anything starts, saying how to give it instead (exit 2)', async () => {
    const cfg = testConfig();
    const key = testKey('cli-literal');
    try {
      // A data dir that cannot be made: had the override been taken, up would fail there (exit 1).
      const file = join(cfg.dir, 'a-file');
      writeFileSync(file, '');
      for (const argv of [['up', '-c', cfg.path, '--detach', `--reef.data_dir=${file}`, `--reef.api_keys[0].key=${key}`], ['config', 'check', cfg.path, `--reef.api_keys=[{key: ${key}}]`]]) {
        const r = await reef(...argv);
        expect(r.code, r.err).toBe(2);
        expect(r.err).toContain('reef.api_keys[0].key: an API key may not be given on the command line');
        expect(r.err).toContain('reef.api_keys[0].key_env');
        expect(r.err).not.toContain(key);
      }
      expect(existsSync(join(cfg.dir, 'data'))).toBe(false);
    } finally {
      rmSync(cfg.dir, { recursive: true, force: true });
    }
  });

  it('lets a command take the flags it reads: status --json finds no stack, and says so (exit 1)', async () => {
    const r = await reef('status', '--json', '--data-dir', '/nonexistent-reef-dir');
    expect(r.code).toBe(1);
    expect(r.err).toMatch(/REEF_ERR_NOT_RUNNING/);
  });
});
