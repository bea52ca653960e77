import { describe, expect, it } from 'vitest';
import { ConfigError, formatIssue, resolveConfig } from '../../cluster/config/index.js';
import { OpenClawRLRecipe, Record2RecordStage, Record2TaskStage, Task2BatchStage } from './recipe.js';
import { stepRewardOptions } from './stages.js';

describe('OpenClaw-RL stage schemas', () => {
  it('defaults follow ARCHITECTURE.md §3', () => {
    expect(Record2RecordStage.defaults).toEqual({
      prm_url: '',
      prm_tokenizer_path: '',
      prm_api: 'sglang',
      prm_model: null,
      prm_api_key_env: null,
      prm_m: 3,
      prm_temperature: 0.6,
      prm_max_tokens: 8192,
      prm_timeout_s: 120,
      prm_concurrency: 8,
      prm_max_hint_candidates: 3,
      session_ttl_s: 900,
      max_open_sessions: 4096,
    });
    expect(Record2TaskStage.defaults).toEqual({});
    expect(Task2BatchStage.defaults).toEqual({ batch_size: 16, prm_record_file: null, max_staleness: 2, group_size: 8, group_timeout_s: 600, outcome_coef: 1, prm_coef: 1, outcome_discount: 1 });
    expect(OpenClawRLRecipe.stages).toEqual({ record2record: Record2RecordStage, record2task: Record2TaskStage, task2batch: Task2BatchStage });
  });

  const issuesOf = (config: unknown) => {
    const r = Record2RecordStage.configSchema.safeParse(config);
    return r.success ? [] : r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`);
  };

  it.each([
    [{}, []],
    [{ prm_url: 'http://127.0.0.1:23001', prm_tokenizer_path: '/t' }, []],
    [{ prm_url: 'http://127.0.0.1:23001' }, ['prm_tokenizer_path: required when prm_url is set and prm_api is sglang']],
    [{ prm_url: 'https://api.example.com', prm_api: 'openai' }, ['prm_model: required when prm_api is openai', 'prm_api_key_env: required when prm_api is openai']],
    [{ prm_url: 'https://api.example.com', prm_api: 'openai', prm_model: 'judge', prm_api_key_env: 'JUDGE_KEY' }, []],
    // The loader appends what it got (cluster/config/issues.ts); the message must not say it too.
    [{ prm_url: 'localhost:23001', prm_tokenizer_path: '/t' }, ["prm_url: expected an http(s) URL or ''"]],
    // Passed a prefix check, then failed every PRM call as an invalid URL: a mistyped port, a space.
    [{ prm_url: 'http://127.0.0.1:230011', prm_tokenizer_path: '/t' }, ["prm_url: expected an http(s) URL or ''"]],
    [{ prm_url: 'http://prm host:23001', prm_tokenizer_path: '/t' }, ["prm_url: expected an http(s) URL or ''"]],
    // The PRM client appends /generate or /v1/chat/completions to the URL's text.
    [{ prm_url: 'http://h:23001/x?key=1', prm_tokenizer_path: '/t' }, ["prm_url: expected an http(s) URL or '' without a query or fragment (Reef appends the PRM's paths to it)"]],
    [{ prm_url: 'http://h:23001/#x', prm_tokenizer_path: '/t' }, ["prm_url: expected an http(s) URL or '' without a query or fragment (Reef appends the PRM's paths to it)"]],
    [{ prm_url: 'http://[::1]:23001/prefix/', prm_tokenizer_path: '/t' }, []],
    [{ prm_api: 'openai' }, []],
    [{ prm_temperature: 3, prm_m: 0 }, ['prm_m: expected a positive integer', 'prm_temperature: expected a number in [0, 2]']],
    // "No timeout" written as a huge one: past Node's longest timer, every PRM call timed out at once.
    [{ prm_timeout_s: 2_147_483 }, []],
    [{ prm_timeout_s: 1e9 }, ['prm_timeout_s: expected at most 2147483 (about 24.8 days, the longest timer Node keeps)']],
  ])('record2record %j', (config, want) => {
    expect(issuesOf(config)).toEqual(want);
  });

  it('record2task is strict and empty', () => {
    expect(Record2TaskStage.configSchema.safeParse({ x: 1 }).success).toBe(false);
    expect(Record2TaskStage.configSchema.safeParse({}).success).toBe(true);
  });

  it('task2batch step-reward keys: errors name the full key path; the resolved options in ms', async () => {
    const raw = {
      cluster: { rollout: { model_path: '/models/policy' }, prm: { model_path: '/models/prm' } },
      pipeline: { task2batch: { config: { group_size: 0, group_timeout_s: 0, outcome_coef: -1, prm_coef: 'x', outcome_discount: 1.5 } } },
    };
    const err = await resolveConfig(raw, { baseDir: '/srv/reef', overrides: [] }).then(() => null, (e: unknown) => e);
    expect(err).toBeInstanceOf(ConfigError);
    const lines = (err as ConfigError).issues.map(formatIssue);
    for (const line of [
      'pipeline.task2batch.config.group_size: expected a positive integer, got 0',
      'pipeline.task2batch.config.group_timeout_s: expected a positive number, got 0',
      'pipeline.task2batch.config.outcome_coef: expected a number >= 0, got -1',
      'pipeline.task2batch.config.prm_coef: expected a number >= 0, got "x"',
      'pipeline.task2batch.config.outcome_discount: expected a number in [0, 1], got 1.5',
    ]) expect(lines).toContain(line);
    expect(stepRewardOptions(Task2BatchStage.defaults)).toEqual({ groupSize: 8, groupTimeoutMs: 600_000, outcomeCoef: 1, prmCoef: 1, discount: 1 });
  });
});
