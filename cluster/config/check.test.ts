import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../paths.js';
import { ConfigError, configCheck, layoutFromConfig, loadConfig } from './index.js';

const dir = mkdtempSync(join(tmpdir(), 'reef-config-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function file(name: string, text: string): string {
  const p = join(dir, name);
  writeFileSync(p, text);
  return p;
}

function sink() {
  const out = { stdout: '', stderr: '' };
  return { out, streams: { stdout: { write: (s: string) => (out.stdout += s) }, stderr: { write: (s: string) => (out.stderr += s) } } };
}

const GOOD = `
reef:
  api_keys: [{key: s3cret-0123456789abcdef0123456789abcdef}]
cluster:
  rollout: {model_path: ./policy}
  prm: {model_path: /models/prm}
pipeline:
  record2task: {}
`;

const EXAMPLE = join(repoRoot(), 'recipes/openclawrl/examples/cpu/serve.yaml');

describe('reef config check', () => {
  it('prints the resolved config as JSON and returns 0, masking literal keys', async () => {
    const { out, streams } = sink();
    expect(await configCheck([file('good.yaml', GOOD)], streams)).toBe(0);
    const printed = JSON.parse(out.stdout);
    expect(printed.cluster.rollout.model_path).toBe(join(dir, 'policy'));
    expect(printed.reef.api_keys[0].key).toBe('***');
    expect(out.stdout).not.toContain('s3cret');
    expect(out.stderr).toBe('');
  });

  it('prints every error, one per line, and returns 2', async () => {
    const { out, streams } = sink();
    const p = file('bad.yaml', `${GOOD}recipe:\n  config: {prm_url: "http://127.0.0.1:23001"}\n`);
    const code = await configCheck([p, '--pipeline.record2record.config.prm_timeout_s=-3', '--pipeline.record2record.config.prm_urll=x'], streams);
    expect(code).toBe(2);
    expect(out.stdout).toBe('');
    expect(out.stderr.trimEnd().split('\n').sort()).toEqual([
      'pipeline.record2record.config.prm_timeout_s: expected a positive number, got -3',
      'pipeline.record2record.config.prm_urll: unknown key; did you mean prm_url?',
      'recipe.config.prm_url belongs at pipeline.record2record.config.prm_url',
    ]);
  });

  it.each([[[]], [['a.yaml', 'b.yaml']], [['--detach']]])('usage error for %j', async (argv) => {
    const { out, streams } = sink();
    expect(await configCheck(argv, streams)).toBe(2);
    expect(out.stderr).toMatch(/^usage: reef config check FILE/);
  });

  it('reports a missing file and invalid YAML', async () => {
    const { out, streams } = sink();
    expect(await configCheck([join(dir, 'nope.yaml')], streams)).toBe(2);
    expect(out.stderr).toBe(`${join(dir, 'nope.yaml')}: no such file\n`);
    const dup = file('dup.yaml', 'reef:\n  port: 1\n  port: 2\n');
    await expect(loadConfig(dup)).rejects.toMatchObject({ code: 'REEF_ERR_CONFIG_FILE' });
    await expect(loadConfig(file('tabs.yaml', 'reef: [\n'))).rejects.toBeInstanceOf(ConfigError);
  });

  it('the CPU example validates and gives the 2/1/1 layout on 4 logical GPUs', async () => {
    const { streams } = sink();
    expect(await configCheck([EXAMPLE], streams)).toBe(0);
    const cfg = await loadConfig(EXAMPLE);
    expect(cfg.cluster.rollout.model_path).toBe(join(repoRoot(), '.cache/tiny-model'));
    expect(cfg.cluster).toMatchObject({ num_gpus: 4, prm_actors: 2, student: null, prm: { engine: 'hf', replicas: 1 }, rollout: { engine: 'hf' } });
    expect(layoutFromConfig(cfg)).toEqual({ trainer: { gpus: 2 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 1 }, student: null, cpusPerBundle: 1, colocate: false });
  });

  it('layout carries a student when configured', async () => {
    const cfg = await loadConfig(EXAMPLE, ['--cluster.student.model_path=/s', '--cluster.student.gpus=2', '--cluster.num_gpus=null']);
    expect(layoutFromConfig(cfg).student).toEqual({ gpus: 2 });
    expect(cfg.cluster.num_gpus).toBe(6);
  });
});
