import { spawnSync } from 'node:child_process';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../cluster/paths.js';

const script = join(repoRoot(), 'scripts', 'setup.sh');
const bin = mkdtempSync(join(tmpdir(), 'reef-setup-gpu-'));
afterAll(() => rmSync(bin, { recursive: true, force: true }));

/** scripts/setup.sh's preamble (its arguments and the choice of lock, before the npm step) run alone,
 * with `uname` answering `system machine` and the venv it would build printed at the end. */
function preamble(args: string[], system: string, machine: string) {
  const text = readFileSync(script, 'utf8');
  const uname = join(bin, 'uname');
  writeFileSync(uname, `#!/bin/sh\ncase "$1" in -m) echo ${machine};; *) echo ${system};; esac\n`);
  chmodSync(uname, 0o755);
  const body = `${text.slice(0, text.indexOf('# --- npm'))}\necho "lock=$lock prefix=$venv_prefix"`;
  return spawnSync('bash', ['-c', body, script, ...args], { encoding: 'utf8', env: { ...process.env, PATH: `${bin}:${process.env.PATH}` } });
}

describe('scripts/setup.sh --gpu', () => {
  it('keeps the CPU lock without the flag, on any machine', () => {
    const r = preamble([], 'Darwin', 'arm64');
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toBe('lock=python_shim/requirements.lock prefix=venv\n');
  });

  it('refuses a machine the GPU lock cannot install on, before installing anything', () => {
    const r = preamble(['--gpu'], 'Darwin', 'arm64');
    expect(r.status).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toContain('setup.sh --gpu: python_shim/requirements-gpu.lock installs only on Linux x86_64');
    expect(r.stderr).toContain('this machine is Darwin arm64');
  });

  it('refuses an argument it does not know', () => {
    const r = preamble(['--cpu'], 'Linux', 'x86_64');
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("unknown argument '--cpu'");
  });
});
