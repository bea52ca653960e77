import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { layoutFromConfig, loadConfig } from '../../cluster/config/index.js';
import { repoRoot } from '../../cluster/paths.js';
import { parseCli } from '../../recipes/openclawrl/harness/cli.js';

const EXAMPLE = join(repoRoot(), 'recipes/openclawrl/examples/openclawrl');
const SERVE = join(EXAMPLE, 'serve.yaml');

describe('the example serve.yaml', () => {
  it('validates and describes the reference 7-GPU layout', async () => {
    const cfg = await loadConfig(SERVE);
    expect(layoutFromConfig(cfg)).toEqual({ trainer: { gpus: 4 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 1 }, student: { gpus: 1 }, cpusPerBundle: 4, colocate: false });
    expect(cfg.cluster.num_gpus).toBe(7);
    expect([cfg.cluster.rollout.engine, cfg.cluster.prm.engine, cfg.cluster.student?.engine]).toEqual(['sglang', 'sglang', 'sglang']);
    expect(cfg.cluster.rollout.model_path).toBe(join(homedir(), 'models/Qwen3-4B-Thinking-2507'));
    expect(cfg.cluster.student?.model_path).toBe(join(homedir(), 'models/Qwen3-32B'));
    const judge = cfg.pipeline.record2record.config as Record<string, unknown>;
    expect(judge.prm_timeout_s).toBe(3600);
    expect(cfg.pipeline.task2batch.config).toMatchObject({ prm_record_file: join(EXAMPLE, 'results/prm_records.jsonl'), batch_size: 16 });
  });
});

describe('run.sh', () => {
  const RUN = join(EXAMPLE, 'run.sh');

  it('brings the scripted student up without the student engine, and the override validates', async () => {
    const override = /scripted\) UP_ARGS=\((--[^)]+)\)/.exec(readFileSync(RUN, 'utf8'))?.[1];
    expect(override).toBe('--cluster.student=null');
    const cfg = await loadConfig(SERVE, [override!]);
    expect(cfg.cluster.student).toBeNull();
    expect(layoutFromConfig(cfg)).toMatchObject({ trainer: { gpus: 4 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 1 } });
  });

  it('refuses an unknown STUDENT before it sets up or starts anything', () => {
    // Regression: any value but llm ran the scripted student.
    const r = spawnSync('bash', [RUN], { env: { ...process.env, STUDENT: 'LLM' }, encoding: 'utf8', timeout: 30_000 });
    expect(r.status).toBe(2);
    expect(r.stderr).toContain("STUDENT must be llm or scripted, got 'LLM'");
    expect(r.stdout).toBe('');
  });
});

describe('harness CLI arguments', () => {
  it('takes the gateway and prm_record_file from the config', async () => {
    const o = (await parseCli(['-c', SERVE, '--out', '/tmp/x']))!;
    expect(o.run).toMatchObject({ gateway: 'http://127.0.0.1:8600', apiKey: null, scenario: 'homework', sessions: 72, outputDir: '/tmp/x', prmRecordFile: join(EXAMPLE, 'results/prm_records.jsonl'), maxTurns: 8 });
    expect(o.run.problems).toHaveLength(72);
    expect(o.student).toEqual({ kind: 'scripted', requireSteps: true });
  });

  it('builds an LLM student and reads the key from the environment', async () => {
    const o = (await parseCli(['--gateway', 'http://g:1', '--student', 'llm', '--student-url', 'http://s:2', '--student-timeout-s', '60', '--api-key-env', 'K', '--sessions', '5'], { K: 'secret' }))!;
    expect(o.student).toEqual({ kind: 'llm', url: 'http://s:2', model: null, timeoutMs: 60_000 });
    expect(o.run).toMatchObject({ gateway: 'http://g:1', apiKey: 'secret', sessions: 5, prmRecordFile: null });
    expect(o.run.problems).toHaveLength(5);
  });

  it.each([
    [['--student', 'llm'], /needs --student-url/],
    [['--student', 'robot'], /scripted or llm/],
    [['--sessions', '0'], /--sessions/],
    [['--temperature', 'hot'], /--temperature/],
    [['--api-key-env', 'NOPE'], /NOPE is not set/],
  ])('rejects %j', async (argv, msg) => {
    await expect(parseCli(argv, {})).rejects.toThrow(msg);
  });

  it('answers --help with null', async () => {
    expect(await parseCli(['--help'])).toBeNull();
  });
});
