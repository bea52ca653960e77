import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError, formatIssue, resolveConfig, type ReefConfig } from './index.js';
import { SAMPLED_REMOVED } from './resolve.js';
import { testKey } from '../../test/helpers/api-keys.js';

const BASE = '/srv/reef';
const KEY = testKey('config-test');
/** The smallest valid config: only the model paths have no default. */
const minimal = () => ({ cluster: { rollout: { model_path: '/models/policy' }, prm: { model_path: '/models/prm' } } });

async function errorsOf(raw: unknown, overrides: string[] = []): Promise<string[]> {
  try {
    await resolveConfig(raw, { baseDir: BASE, overrides });
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).code).toBe('REEF_ERR_CONFIG_INVALID');
    return (err as ConfigError).issues.map(formatIssue);
  }
  throw new Error('expected the config to be rejected');
}

const ok = (raw: unknown, overrides: string[] = []): Promise<ReefConfig> => resolveConfig(raw, { baseDir: BASE, overrides });

const withStage = (stage: string, config: Record<string, unknown>) => ({ ...minimal(), pipeline: { [stage]: { config } } });

describe('errors name the full path', () => {
  const cases: { name: string; raw: unknown; overrides?: string[]; line: string }[] = [
    { name: 'stage key in recipe.config', raw: { ...minimal(), recipe: { config: { prm_url: 'http://127.0.0.1:23001' } } }, line: 'recipe.config.prm_url belongs at pipeline.record2record.config.prm_url' },
    { name: 'unknown stage key', raw: withStage('record2record', { prm_urll: 'http://x:1' }), line: 'pipeline.record2record.config.prm_urll: unknown key; did you mean prm_url?' },
    { name: 'invalid stage value', raw: withStage('record2record', { prm_timeout_s: -3 }), line: 'pipeline.record2record.config.prm_timeout_s: expected a positive number, got -3' },
    { name: 'key in record2task', raw: withStage('record2task', { window: 3 }), line: 'pipeline.record2task.config.window: unknown key (pipeline.record2task.config takes no keys)' },
    { name: 'stage key in another stage', raw: withStage('record2task', { batch_size: 3 }), line: 'pipeline.record2task.config.batch_size belongs at pipeline.task2batch.config.batch_size' },
    { name: 'stage key without config:', raw: { ...minimal(), pipeline: { task2batch: { batch_size: 8 } } }, line: 'pipeline.task2batch.batch_size belongs at pipeline.task2batch.config.batch_size' },
    { name: 'unknown top-level key', raw: { ...minimal(), clusterr: {} }, line: 'clusterr: unknown key; did you mean cluster?' },
    { name: 'unknown key far from any', raw: { ...minimal(), reef: { colour: 'red' } }, line: 'reef.colour: unknown key' },
    { name: 'wrong type', raw: { ...minimal(), reef: { port: 'http' } }, line: 'reef.port: expected a port number (0-65535), got "http"' },
    { name: 'enum', raw: { ...minimal(), training: { backend: 'ddp' } }, line: 'training.backend: expected one of fsdp2, tp, got "ddp"' },
    { name: 'required', raw: { cluster: { prm: { replicas: 0 } } }, line: 'cluster.rollout.model_path: required (expected a non-empty string)' },
    { name: 'prm model needed with replicas', raw: { cluster: { rollout: { model_path: '/m' } } }, line: 'cluster.prm.model_path: required when cluster.prm.replicas > 0 (use replicas: 0 for an external PRM)' },
    { name: 'default max tokens', raw: { ...minimal(), reef: { default_max_tokens: 0 } }, line: 'reef.default_max_tokens: expected a positive integer, got 0' },
    { name: 'durability', raw: { ...minimal(), reef: { durability: 'disk' } }, line: 'reef.durability: expected one of power, process, got "disk"' },
    { name: 'retention age', raw: { ...minimal(), reef: { retention: { max_age_days: 0 } } }, line: 'reef.retention.max_age_days: expected a positive number, got 0' },
    { name: 'retention size', raw: { ...minimal(), reef: { retention: { max_size_mb: -5 } } }, line: 'reef.retention.max_size_mb: expected a positive number, got -5' },
    { name: 'redaction builtin', raw: { ...minimal(), reef: { redaction: { builtin: ['email', 'ssn'] } } }, line: 'reef.redaction.builtin[1]: expected one of email, phone, card, api_key, got "ssn"' },
    { name: 'redaction pattern that does not compile', raw: { ...minimal(), reef: { redaction: { patterns: [{ name: 'emp', regex: 'EMP-\\d{6}' }, { name: 'bad', regex: '(EMP' }] } } }, line: 'reef.redaction.patterns[1].regex: expected a regular expression (JavaScript syntax): Invalid regular expression: /(EMP/gu: Unterminated group, got "(EMP"' },
    { name: 'redaction pattern that matches nothing', raw: { ...minimal(), reef: { redaction: { patterns: [{ name: 'any', regex: 'x*' }] } } }, line: 'reef.redaction.patterns[0].regex: matches the empty string, so it would mask nothing' },
    { name: 'redaction pattern name', raw: { ...minimal(), reef: { redaction: { patterns: [{ name: 'has space', regex: 'x' }] } } }, line: 'reef.redaction.patterns[0].name: expected a name of letters, digits and _ (at most 40, a letter first), got "has space"' },
    { name: 'redaction apply_to', raw: { ...minimal(), reef: { redaction: { apply_to: 'sglang' } } }, line: 'reef.redaction.apply_to: expected one of openai, all, got "sglang"' },
    { name: 'api key item', raw: { ...minimal(), reef: { api_keys: [{ key: KEY, key_env: 'K' }] } }, line: 'reef.api_keys[0]: set exactly one of key and key_env' },
    // Names the store would refuse on every request, and a key no client could present.
    { name: 'default scenario the store refuses', raw: { ...minimal(), reef: { default_scenario: 'Prod' } }, line: 'reef.default_scenario: expected a scenario name (lower-case letters, digits, ".", "_" and "-", starting with a letter or digit, at most 64), got "Prod"' },
    { name: 'key scenario the store refuses', raw: { ...minimal(), reef: { api_keys: [{ key: KEY, scenarios: ['alpha', '_x'] }] } }, line: 'reef.api_keys[0].scenarios[1]: expected a scenario name (lower-case letters, digits, ".", "_" and "-", starting with a letter or digit, at most 64), got "_x"' },
    { name: 'key with whitespace around it', raw: { ...minimal(), reef: { api_keys: [{ key: `${KEY}\n` }] } }, line: 'reef.api_keys[0].key: must not begin or end with whitespace' },
    { name: 'key a client cannot send in a header', raw: { ...minimal(), reef: { api_keys: [{ key: `clé-secrète-${KEY}` }] } }, line: 'reef.api_keys[0].key: must be printable ASCII (characters a client can send in a header)' },
    { name: 'key shorter than 32 characters', raw: { ...minimal(), reef: { api_keys: [{ key: KEY }, { key: 'sk-short' }] } }, line: 'reef.api_keys[1].key: must be at least 32 characters, got 8: use a random one, e.g. `openssl rand -hex 32`' },
    { name: 'rate limit of zero', raw: { ...minimal(), reef: { api_keys: [{ key: KEY, requests_per_minute: 0 }] } }, line: 'reef.api_keys[0].requests_per_minute: expected a positive integer, got 0' },
    { name: 'headers timeout past the request timeout', raw: { ...minimal(), reef: { limits: { request_timeout_s: 10, headers_timeout_s: 20 } } }, line: 'reef.limits.headers_timeout_s: must not be more than reef.limits.request_timeout_s (10), which covers the headers too' },
    { name: 'unknown limit', raw: { ...minimal(), reef: { limits: { max_connection: 5 } } }, line: 'reef.limits.max_connection: unknown key; did you mean max_connections?' },
    { name: 'num_gpus too small', raw: { ...minimal(), cluster: { ...minimal().cluster, num_gpus: 3 } }, line: 'cluster.num_gpus: the layout needs 6 GPUs, got 3' },
    { name: 'unknown recipe module', raw: { ...minimal(), recipe: { implementation: 'recipes.nope.recipe:X' } }, line: 'recipe.implementation: no module recipes.nope.recipe' },
    { name: 'unknown recipe export', raw: { ...minimal(), recipe: { implementation: 'recipes.openclawrl.recipe:Nope' } }, line: 'recipe.implementation: module recipes.openclawrl.recipe has no export Nope' },
    { name: 'malformed recipe name', raw: { ...minimal(), recipe: { implementation: '../../etc' } }, line: 'recipe.implementation: expected module.path:ExportName, got "../../etc"' },
    { name: 'prm_url that is no URL', raw: withStage('record2record', { prm_url: 'http://127.0.0.1:230011', prm_tokenizer_path: '/t' }), line: `pipeline.record2record.config.prm_url: expected an http(s) URL or '', got "http://127.0.0.1:230011"` },
    { name: 'tokenizer needed for sglang PRM', raw: withStage('record2record', { prm_url: 'http://127.0.0.1:23001' }), line: 'pipeline.record2record.config.prm_tokenizer_path: required when prm_url is set and prm_api is sglang' },
    { name: 'computed key set by hand', raw: { ...minimal(), training: { resolved: {} } }, line: 'training.resolved: unknown key' },
  ];
  it.each(cases)('$name', async ({ raw, overrides, line }) => {
    const lines = await errorsOf(raw, overrides);
    expect(lines.some((l) => l.startsWith(line))).toBe(true);
  });
});

describe('names and origins a keyless gateway answers browsers from', () => {
  it('takes host names and IP literals, and origins as a browser writes them', async () => {
    const cfg = await ok({ ...minimal(), reef: { allowed_hosts: ['reef.internal', 'my-box', '10.0.0.5', '[fd00::1]'], allowed_origins: ['http://localhost:3000', 'https://ui.example.com'] } });
    expect(cfg.reef.allowed_hosts).toEqual(['reef.internal', 'my-box', '10.0.0.5', '[fd00::1]']);
    expect(cfg.reef.allowed_origins).toEqual(['http://localhost:3000', 'https://ui.example.com']);
  });

  it.each([
    [{ allowed_hosts: ['reef.internal', 'http://reef.internal'] }, 'reef.allowed_hosts[1]: expected a host name without scheme or port (reef.example.com, 10.0.0.5, [fd00::1]), got "http://reef.internal"'],
    [{ allowed_hosts: ['reef.internal:8600'] }, 'reef.allowed_hosts[0]: expected a host name without scheme or port (reef.example.com, 10.0.0.5, [fd00::1]), got "reef.internal:8600"'],
    [{ allowed_hosts: 'reef.internal' }, 'reef.allowed_hosts: expected a list of host names, got "reef.internal"'],
    // Compared as written with the browser's Origin, which never ends in / nor names the default port.
    [{ allowed_origins: ['http://localhost:3000/'] }, 'reef.allowed_origins[0]: expected an origin as a browser sends it (http://localhost:3000: scheme and host in lower case, a port unless the default, no path or trailing /), got "http://localhost:3000/"'],
    [{ allowed_origins: ['http://localhost:3000', 'https://ui.example.com:443'] }, 'reef.allowed_origins[1]: expected an origin as a browser sends it (http://localhost:3000: scheme and host in lower case, a port unless the default, no path or trailing /), got "https://ui.example.com:443"'],
    [{ allowed_origins: ['localhost:3000'] }, 'reef.allowed_origins[0]: expected an origin as a browser sends it (http://localhost:3000: scheme and host in lower case, a port unless the default, no path or trailing /), got "localhost:3000"'],
    [{ allowed_origins: [3000] }, 'reef.allowed_origins[0]: expected an origin as a browser sends it (http://localhost:3000: scheme and host in lower case, a port unless the default, no path or trailing /), got 3000'],
  ])('refuses %j naming the entry', async (reef, line) => {
    expect(await errorsOf({ ...minimal(), reef })).toEqual([line]);
  });
});

describe('non-loopback host needs an api key', () => {
  it.each(['0.0.0.0', '10.1.2.3', '::', 'reef.example.com'])('%s without keys is an error naming reef.api_keys', async (host) => {
    const lines = await errorsOf({ ...minimal(), reef: { host } });
    expect(lines).toEqual([`reef.api_keys: at least one key is required when reef.host (${host}) is not a loopback address`]);
  });
  it.each(['127.0.0.1', '127.9.9.9', '::1', '[::1]', 'localhost'])('%s is loopback', async (host) => {
    expect((await ok({ ...minimal(), reef: { host } })).reef.host).toBe(host);
  });
  it('a key_env key is enough', async () => {
    const cfg = await ok({ ...minimal(), reef: { host: '0.0.0.0', api_keys: [{ key_env: 'REEF_KEY' }] } });
    expect(cfg.reef.api_keys).toEqual([{ key: null, key_env: 'REEF_KEY', scenarios: null, max_concurrency: 64, requests_per_minute: null, tokens_per_minute: null }]);
  });
});

describe('API key length', () => {
  it('takes 32 characters and refuses 31, naming the entry and nothing of the key', async () => {
    const lines = await errorsOf({ ...minimal(), reef: { api_keys: [{ key: KEY }, { key: KEY.slice(0, 31) }] } });
    expect(lines).toEqual(['reef.api_keys[1].key: must be at least 32 characters, got 31: use a random one, e.g. `openssl rand -hex 32`']);
    expect((await ok({ ...minimal(), reef: { api_keys: [{ key: KEY.slice(0, 32) }] } })).reef.api_keys[0]?.key).toHaveLength(32);
  });
  it('an empty key is reported once, as empty', async () => {
    expect(await errorsOf({ ...minimal(), reef: { api_keys: [{ key: '' }] } })).toEqual(['reef.api_keys[0].key: expected a non-empty string, got ""']);
  });
});

describe('hyphen and underscore spellings', () => {
  it.each([
    ['stage key', { 'prm-timeout-s': 30 }, (c: ReefConfig) => c.pipeline.record2record.config.prm_timeout_s, 30],
    ['mixed', { 'prm_max-tokens': 64 }, (c: ReefConfig) => c.pipeline.record2record.config.prm_max_tokens, 64],
  ])('%s', async (_n, config, get, want) => {
    expect(get(await ok(withStage('record2record', config)))).toBe(want);
  });
  it('at every level', async () => {
    const cfg = await ok({ reef: { 'data-dir': 'state', 'api-keys': [{ 'key-env': 'K', 'max-concurrency': 2 }] }, cluster: { rollout: { 'model-path': '/m' }, prm: { model_path: '/p', 'extra-args': ['--x'] }, 'prm-actors': 5 } });
    expect(cfg.reef.data_dir).toBe('/srv/reef/state');
    expect(cfg.reef.api_keys[0]).toMatchObject({ key_env: 'K', max_concurrency: 2 });
    expect(cfg.cluster.prm.extra_args).toEqual(['--x']);
    expect(cfg.cluster.prm_actors).toBe(5);
  });
  it('both at once is an error naming both spellings', async () => {
    const lines = await errorsOf(withStage('record2record', { 'prm-url': 'http://a:1', prm_url: 'http://b:1', prm_tokenizer_path: '/t' }));
    expect(lines).toEqual(['pipeline.record2record.config.prm_url: both "prm-url" and "prm_url" are set; use one spelling']);
  });
});

describe('overrides', () => {
  const cases: { name: string; overrides: string[]; get: (c: ReefConfig) => unknown; want: unknown }[] = [
    { name: 'number', overrides: ['--reef.port=9000'], get: (c) => c.reef.port, want: 9000 },
    { name: 'nested stage key', overrides: ['--pipeline.record2record.config.prm_timeout_s=30'], get: (c) => c.pipeline.record2record.config.prm_timeout_s, want: 30 },
    { name: 'hyphenated path', overrides: ['--pipeline.task2batch.config.batch-size=8'], get: (c) => c.pipeline.task2batch.config.batch_size, want: 8 },
    { name: 'null', overrides: ['--cluster.prm.model_path=null', '--cluster.prm.replicas=0'], get: (c) => c.cluster.prm.model_path, want: null },
    { name: 'flow list', overrides: ['--cluster.rollout.extra_args=[--a, b]'], get: (c) => c.cluster.rollout.extra_args, want: ['--a', 'b'] },
    { name: 'url stays a string', overrides: ['--pipeline.record2record.config.prm_url=http://h:23001', '--pipeline.record2record.config.prm_tokenizer_path=/t', '--cluster.prm.replicas=0'], get: (c) => c.pipeline.record2record.config.prm_url, want: 'http://h:23001' },
    { name: 'into a null section', overrides: ['--cluster.student.model_path=/s'], get: (c) => c.cluster.student, want: { gpus: 1, engine: 'sglang', model_path: '/s', port: 0, extra_args: [] } },
    { name: 'list item', overrides: ['--reef.api_keys[0].max_concurrency=3'], get: (c) => c.reef.api_keys[0]?.max_concurrency, want: 3 },
    { name: 'no default max tokens (the rest of the context)', overrides: ['--reef.default_max_tokens=null'], get: (c) => c.reef.default_max_tokens, want: null },
    { name: 'without dashes', overrides: ['reef.log_level=debug'], get: (c) => c.reef.log_level, want: 'debug' },
  ];
  it.each(cases)('$name', async ({ overrides, get, want }) => {
    const raw = { ...minimal(), reef: { api_keys: [{ key: KEY }] } };
    expect(get(await ok(raw, overrides))).toEqual(want);
  });

  it('accepts the REEF_ACTOR map form', async () => {
    const cfg = await resolveConfig(minimal(), { baseDir: BASE, overrides: { 'reef.port': '9001', 'cluster.prm.gpus': 2, 'reef.default_scenario': 'blue', 'cluster.rollout.extra_args': ['--a'] } });
    expect([cfg.reef.port, cfg.cluster.prm.gpus, cfg.reef.default_scenario, cfg.cluster.rollout.extra_args]).toEqual([9001, 2, 'blue', ['--a']]);
  });

  it('override wins over the file', async () => {
    const cfg = await ok(withStage('task2batch', { batch_size: 32 }), ['--pipeline.task2batch.config.batch_size=4']);
    expect(cfg.pipeline.task2batch.config.batch_size).toBe(4);
  });

  describe('a literal API key is refused, whatever form the override takes', () => {
    const raw = () => ({ ...minimal(), reef: { api_keys: [{ key: KEY }] } });
    const LIT = testKey('on-the-command-line');
    const how = (n: number) => `an API key may not be given on the command line, where every user of this machine can read it (ps, /proc/<pid>/cmdline): write it in the config file (readable by its owner alone), or put it in an environment variable and name that in reef.api_keys[${n}].key_env (also as an override: --reef.api_keys[${n}].key_env=NAME)`;
    it.each([
      [[`--reef.api_keys[0].key=${LIT}`], 'reef.api_keys[0].key', 0],
      [[`--reef.api_keys.0.key=${LIT}`], 'reef.api_keys[0].key', 0],
      [[`--reef.api-keys[0].key=${LIT}`], 'reef.api_keys[0].key', 0],
      [[`reef.api_keys[1].key=${LIT}`], 'reef.api_keys[1].key', 1],
      [[`--reef.api_keys[1]={key: ${LIT}, scenarios: [a]}`], 'reef.api_keys[1].key', 1],
      [[`--reef.api_keys=[{key_env: K}, {key: "${LIT}"}]`], 'reef.api_keys[1].key', 1],
      [[`--reef.api-keys=[{key: ${LIT}}]`], 'reef.api_keys[0].key', 0],
      [[`--reef.api_keys[0].key.x=${LIT}`], 'reef.api_keys[0].key', 0],
    ])('%j', async (overrides, path, n) => {
      const lines = await errorsOf(raw(), overrides);
      expect(lines).toEqual([`${path}: ${how(n)}`]);
      expect(lines.join('\n')).not.toContain(LIT.slice(-16));
    });
    it('in the REEF_ACTOR map form too', async () => {
      await expect(resolveConfig(raw(), { baseDir: BASE, overrides: { 'reef.api_keys[0].key': LIT } })).rejects.toThrow(/reef\.api_keys\[0\]\.key: an API key may not be given on the command line/);
    });
    it('but a key_env, and a key set to null to make room for one, are taken', async () => {
      const cfg = await ok(raw(), ['--reef.api_keys[0].key=null', '--reef.api_keys[0].key_env=REEF_KEY', '--reef.api_keys[1]={key_env: OTHER_KEY}']);
      expect(cfg.reef.api_keys.map((k) => [k.key, k.key_env])).toEqual([[null, 'REEF_KEY'], [null, 'OTHER_KEY']]);
    });
  });

  const bad: { name: string; overrides: string[]; line: string }[] = [
    { name: 'unknown path', overrides: ['--pipeline.record2record.config.prm_urll=x'], line: 'pipeline.record2record.config.prm_urll: unknown key; did you mean prm_url?' },
    { name: 'unknown section', overrides: ['--reef.tls.cert=/c'], line: 'reef.tls: unknown key' },
    { name: 'through a scalar', overrides: ['--reef.port.x=1'], line: 'reef.port: is 8600, not a mapping, so --reef.port.x cannot be set' },
    { name: 'invalid value', overrides: ['--pipeline.record2record.config.prm_timeout_s=-3'], line: 'pipeline.record2record.config.prm_timeout_s: expected a positive number, got -3' },
    { name: 'no value', overrides: ['--reef.port'], line: '--reef.port: expected an override --path.to.key=value' },
  ];
  it.each(bad)('rejects $name', async ({ overrides, line }) => {
    expect(await errorsOf({ ...minimal(), reef: { port: 8600 } }, overrides)).toContain(line);
  });
});

describe('resolved config', () => {
  it('applies defaults', async () => {
    const cfg = await ok(minimal());
    expect(cfg.reef).toEqual({ host: '127.0.0.1', port: 8600, api_keys: [], allowed_hosts: [], allowed_origins: [], data_dir: '/srv/reef/.reef', durability: 'power', retention: { max_age_days: null, max_size_mb: null, interval_s: 3600 }, redaction: { builtin: ['email', 'phone', 'card', 'api_key'], patterns: [], apply_to: 'openai' }, default_scenario: 'default', default_max_tokens: 1024, log_level: 'info',
      limits: {
        request_timeout_s: 120, headers_timeout_s: 30, body_idle_timeout_s: 30, keep_alive_timeout_s: 75, engine_timeout_s: 300, max_connections: 1024,
        body_bytes: 64 * 1024 * 1024, reef_body_bytes: 4 * 1024 * 1024, reef_concurrency: 8, page_bytes: 8 * 1024 * 1024, max_scenarios: 1000,
        min_free_disk_mb: 256, store_lock_wait_ms: 5000, keyless_max_concurrency: 256, keyless_requests_per_minute: null, keyless_tokens_per_minute: null,
        auth_failures_per_minute: 30, auth_failure_addresses: 10_000,
      },
    });
    expect(cfg.cluster).toMatchObject({ ray_address: null, num_gpus: 6, num_cpus: null, trainer: { gpus: 4 }, prm_actors: 2, cpus_per_bundle: 1, placement_timeout_s: 120, student: null });
    expect(cfg.cluster.rollout).toEqual({ gpus: 1, engine: 'sglang', model_path: '/models/policy', port: 0, extra_args: [] });
    expect(cfg.cluster.prm).toEqual({ gpus: 1, engine: 'sglang', model_path: '/models/prm', port: 0, extra_args: [], replicas: 1 });
    expect(cfg.recipe).toEqual({ implementation: 'recipes.openclawrl.recipe:OpenClawRLRecipe', config: {} });
    expect(cfg.pipeline.record2record.config).toMatchObject({ prm_url: '', prm_api: 'sglang', prm_m: 3, prm_temperature: 0.6, prm_max_tokens: 8192, prm_timeout_s: 120, prm_concurrency: 8, prm_max_hint_candidates: 3, session_ttl_s: 900, max_open_sessions: 4096 });
    expect(cfg.pipeline.record2task.config).toEqual({});
    expect(cfg.pipeline.task2batch.config).toEqual({ batch_size: 16, prm_record_file: null, max_staleness: 2, group_size: 8, group_timeout_s: 600, outcome_coef: 1, prm_coef: 1, outcome_discount: 1 });
    expect(cfg.training).toMatchObject({ backend: 'fsdp2', options: [] });
  });

  it('null sections mean defaults', async () => {
    const cfg = await ok({ ...minimal(), reef: null, pipeline: { record2task: null, task2batch: { config: null } } });
    expect(cfg.reef.port).toBe(8600);
    expect(cfg.pipeline.task2batch.config.batch_size).toBe(16);
  });

  it('resolves paths against the config directory', async () => {
    const cfg = await ok({
      reef: { data_dir: '../state' },
      cluster: { rollout: { model_path: './models/policy' }, prm: { model_path: 'Qwen/Qwen3-4B' }, student: { model_path: '/abs/student' } },
      pipeline: { record2record: { config: { prm_tokenizer_path: '/abs/prm-tokenizer' } }, task2batch: { config: { prm_record_file: 'out/prm.jsonl' } } },
    });
    expect(cfg.reef.data_dir).toBe('/srv/state');
    expect(cfg.cluster.rollout.model_path).toBe('/srv/reef/models/policy');
    expect(cfg.cluster.prm.model_path).toBe('Qwen/Qwen3-4B');
    expect(cfg.cluster.student?.model_path).toBe('/abs/student');
    expect(cfg.pipeline.task2batch.config.prm_record_file).toBe('/srv/reef/out/prm.jsonl');
  });

  it('is deeply frozen', async () => {
    const cfg = await ok({ ...minimal(), reef: { api_keys: [{ key: KEY, scenarios: ['a'] }] } });
    const frozen: unknown[] = [cfg, cfg.reef, cfg.reef.api_keys, cfg.reef.api_keys[0], cfg.reef.api_keys[0]?.scenarios, cfg.cluster.rollout.extra_args, cfg.pipeline.record2record.config, cfg.training.resolved, cfg.training.resolved.betas];
    for (const part of frozen) expect(Object.isFrozen(part)).toBe(true);
    expect(() => {
      (cfg.reef as { port: number }).port = 1;
    }).toThrow(TypeError);
  });

  it('num_gpus counts the layout, and is null with a remote cluster', async () => {
    const local = await ok({ cluster: { ...minimal().cluster, trainer: { gpus: 2 }, prm: { model_path: '/p', replicas: 2, gpus: 2 }, student: { model_path: '/s' } } });
    expect(local.cluster.num_gpus).toBe(2 + 1 + 4 + 1);
    const remote = await ok({ cluster: { ...minimal().cluster, ray_address: 'ray://head:10001' } });
    expect(remote.cluster.num_gpus).toBeNull();
    expect(await errorsOf({ cluster: { ...minimal().cluster, ray_address: 'auto', num_gpus: 7 } })).toEqual([
      'cluster.num_gpus: only applies to a local head; remove it or set cluster.ray_address to null',
    ]);
  });

  // The shim ignores it when it joins a cluster (a warning in its own log): num_gpus is refused so,
  // and num_cpus passed the check and changed nothing.
  it('num_cpus, like num_gpus, applies to a local head only', async () => {
    expect(await errorsOf({ cluster: { ...minimal().cluster, ray_address: 'auto', num_cpus: 8 } })).toEqual([
      'cluster.num_cpus: only applies to a local head; remove it or set cluster.ray_address to null',
    ]);
    expect((await ok({ cluster: { ...minimal().cluster, num_cpus: 8 } })).cluster.num_cpus).toBe(8);
  });

  it('collects every error, across sections and stages', async () => {
    const lines = await errorsOf(
      {
        reef: { host: '0.0.0.0', port: -1, log_level: 'loud' },
        cluster: { rollout: { model_path: '/m', gpus: 0 }, prm: { model_path: '/p' } },
        recipe: { config: { batch_size: 4 } },
        pipeline: { record2record: { config: { prm_m: 0, prm_timeout_s: -3 } }, record2task: { config: { x: 1 } } },
        training: { options: ['--lr=fast'] },
      },
      ['--cluster.trainer.gpu=2'],
    );
    expect(lines).toEqual(
      expect.arrayContaining([
        'reef.port: expected a port number (0-65535), got -1',
        'reef.log_level: expected one of debug, info, warn, error, got "loud"',
        'reef.api_keys: at least one key is required when reef.host (0.0.0.0) is not a loopback address',
        'cluster.rollout.gpus: expected a positive integer, got 0',
        'cluster.trainer.gpu: unknown key; did you mean gpus?',
        'recipe.config.batch_size belongs at pipeline.task2batch.config.batch_size',
        'pipeline.record2record.config.prm_m: expected a positive integer, got 0',
        'pipeline.record2record.config.prm_timeout_s: expected a positive number, got -3',
        'pipeline.record2task.config.x: unknown key (pipeline.record2task.config takes no keys)',
        'training.options[0]: --lr: expected a positive number, got "fast"',
      ]),
    );
    expect(lines).toHaveLength(10);
  });

  it('rejects a top level that is not a mapping', async () => {
    expect(await errorsOf(['a'])).toEqual(['expected a mapping at the top level, got a list']);
  });
});

// YAML `api_keys:` followed by a bare `-` is a list holding null. The entry's own check ran on it
// anyway (to collect every error) and read `.key` of null: a TypeError, not an error naming it.
describe('an api_keys entry that is not a mapping', () => {
  it.each([
    [[null], 'reef.api_keys[0]: expected a mapping, got null'],
    [[{ key: KEY }, 'sk-abc'], 'reef.api_keys[1]: expected a mapping, got "sk-abc"'],
  ])('%j is reported with its path', async (apiKeys, line) => {
    expect(await errorsOf({ ...minimal(), reef: { api_keys: apiKeys } })).toEqual([line]);
  });
});

// The engines Reef starts all listen on 127.0.0.1, and the gateway on reef.host: one port given
// twice passed the check and failed \`reef up\` with EADDRINUSE once the first engine held it.
describe('ports given twice', () => {
  const cluster = (extra: Record<string, unknown>) => ({ ...minimal().cluster, ...extra });
  it.each([
    [{ cluster: cluster({ rollout: { model_path: '/m', port: 23001 }, prm: { model_path: '/p', port: 23001 } }) }, 'cluster.prm.port: 23001 is also cluster.rollout.port; the engines listen on 127.0.0.1, each needs its own port'],
    [{ cluster: cluster({ student: { model_path: '/s', port: 23002 }, prm: { model_path: '/p', port: 23002 } }) }, 'cluster.student.port: 23002 is also cluster.prm.port; the engines listen on 127.0.0.1, each needs its own port'],
    [{ reef: { port: 9000 }, cluster: cluster({ rollout: { model_path: '/m', port: 9000 } }) }, 'reef.port: 9000 is also cluster.rollout.port, where the rollout engine listens on 127.0.0.1'],
    [{ reef: { port: 9000, host: 'localhost' }, cluster: cluster({ rollout: { model_path: '/m', port: 9000 } }) }, 'reef.port: 9000 is also cluster.rollout.port, where the rollout engine listens on 127.0.0.1'],
    [{ reef: { port: 9000, host: '0.0.0.0', api_keys: [{ key: KEY }] }, cluster: cluster({ student: { model_path: '/s', port: 9000 } }) }, 'reef.port: 9000 is also cluster.student.port, where the student engine listens on 127.0.0.1'],
  ])('%j', async (raw, line) => {
    expect(await errorsOf(raw)).toEqual([line]);
  });

  it.each([
    ['port 0 everywhere (each picks a free one)', { reef: { port: 0 } }],
    ['an external PRM, whose engine Reef does not start', { cluster: cluster({ rollout: { model_path: '/m', port: 23001 }, prm: { replicas: 0, port: 23001 } }) }],
    ['no student', { cluster: cluster({ rollout: { model_path: '/m', port: 23001 }, student: null }) }],
    ['a gateway on another address than the engines', { reef: { port: 9000, host: '10.0.0.5', api_keys: [{ key: KEY }] }, cluster: cluster({ rollout: { model_path: '/m', port: 9000 } }) }],
    ['a gateway on another loopback address', { reef: { port: 9000, host: '127.0.0.2' }, cluster: cluster({ rollout: { model_path: '/m', port: 9000 } }) }],
    ['a gateway on IPv6 loopback', { reef: { port: 9000, host: '::1' }, cluster: cluster({ rollout: { model_path: '/m', port: 9000 } }) }],
  ])('accepts %s', async (_what, raw) => {
    await expect(ok({ ...minimal(), ...raw })).resolves.toBeDefined();
  });
});

// The gateway and the trainer-controller load the policy's tokenizer.json from its directory, the
// trainer its config.json, and a PRM actor the PRM tokenizer's: an \`org/name\` kept as a hub id
// passed the check and failed reef up after the engines had loaded.
describe('model paths Reef reads itself take no hub id', () => {
  it.each([
    [{ cluster: { rollout: { model_path: 'Qwen/Qwen3-4B' }, prm: { model_path: '/p' } } }, 'cluster.rollout.model_path: "Qwen/Qwen3-4B" is no directory next to the config file, and Reef reads this model from a directory (a Hugging Face hub id will not do here): download it and give its path'],
    [withStage('record2record', { prm_url: 'http://h:1', prm_tokenizer_path: 'Qwen/Qwen3-4B' }), 'pipeline.record2record.config.prm_tokenizer_path: "Qwen/Qwen3-4B" is no directory next to the config file, and Reef reads this model from a directory (a Hugging Face hub id will not do here): download it and give its path'],
  ])('%j', async (raw, line) => {
    expect(await errorsOf(raw)).toEqual([line]);
  });

  it('engines Reef only starts keep a hub id; a directory next to the config file is that directory', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'reef-models-'));
    try {
      mkdirSync(join(dir, 'org', 'policy'), { recursive: true });
      const cfg = await resolveConfig(
        { cluster: { rollout: { model_path: 'org/policy' }, prm: { model_path: 'Qwen/Qwen3-4B', replicas: 0 }, student: { model_path: 'Qwen/Qwen3-0.6B' } }, pipeline: { record2record: { config: { prm_url: 'http://h:1', prm_tokenizer_path: '/abs/tok' } } } },
        { baseDir: dir },
      );
      expect([cfg.cluster.rollout.model_path, cfg.cluster.prm.model_path, cfg.cluster.student?.model_path, cfg.pipeline.record2record.config.prm_tokenizer_path]).toEqual([join(dir, 'org', 'policy'), 'Qwen/Qwen3-4B', 'Qwen/Qwen3-0.6B', '/abs/tok']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('the PRM settings against the PRM engines Reef starts', () => {
  const stage = (config: Record<string, unknown>) => ({ record2record: { config } });
  it.each([
    ['an external PRM beside engines that would never be called', { cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p' } }, pipeline: stage({ prm_url: 'http://prm:8000', prm_tokenizer_path: '/t' }) },
      'cluster.prm.replicas: 1 PRM engine(s) would start and never be called: pipeline.record2record.config.prm_url names the PRM the judge calls; set replicas to 0, or leave prm_url empty to judge with these engines'],
    ['the OpenAI API of an hf PRM engine, which serves /generate only', { cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p', engine: 'hf' } }, pipeline: stage({ prm_api: 'openai', prm_model: 'prm', prm_api_key_env: 'K' }) },
      'pipeline.record2record.config.prm_api: openai needs /v1/chat/completions, which the hf PRM engine does not serve: use sglang (its /generate), or cluster.prm.engine: sglang'],
    ['the OpenAI API of the PRM engines Reef starts without the key variable the PRM actors send', { cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p' } }, pipeline: stage({ prm_api: 'openai', prm_model: 'prm' }) },
      'pipeline.record2record.config.prm_api_key_env: required when prm_api is openai'],
    ['a hub id for the PRM with no tokenizer directory for the actors', { cluster: { rollout: { model_path: '/m' }, prm: { model_path: 'Qwen/Qwen3-4B' } } },
      'pipeline.record2record.config.prm_tokenizer_path: required: cluster.prm.model_path (Qwen/Qwen3-4B) is a hub id, not a directory here, and the PRM actors read the PRM\'s chat template from a directory'],
  ])('refuses %s', async (_name, raw, line) => {
    expect(await errorsOf(raw)).toEqual([line]);
  });

  it('accepts prm_url naming the PRM engine Reef starts on its fixed port', async () => {
    const cfg = await ok({ cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p', port: 30001 } }, pipeline: stage({ prm_url: 'http://127.0.0.1:30001', prm_tokenizer_path: '/p' }) });
    expect(cfg.pipeline.record2record.config.prm_url).toBe('http://127.0.0.1:30001');
  });
});

describe('recipe-declared schemas without kit messages', () => {
  it.each([
    [{ ...minimal(), recipe: { config: 3 } }, 'recipe.config: expected a mapping, got 3'],
    [{ ...minimal(), pipeline: { record2task: { config: ['x'] } } }, 'pipeline.record2task.config: expected a mapping, got a list'],
  ])('%j', async (raw, line) => {
    expect(await errorsOf(raw)).toEqual([line]);
  });
});

describe('training.enabled', () => {
  it('defaults to true and takes a boolean only', async () => {
    expect((await ok(minimal())).training.enabled).toBe(true);
    expect((await ok(minimal(), ['--training.enabled=false'])).training.enabled).toBe(false);
    expect(await errorsOf({ ...minimal(), training: { enabled: 'no' } })).toEqual(['training.enabled: expected true or false, got "no"']);
  });
});

describe('training.keep_checkpoints', () => {
  it('defaults to 5 and rejects a count below 1, naming the path', async () => {
    expect((await ok(minimal())).training.keep_checkpoints).toBe(5);
    expect((await ok(minimal(), ['--training.keep_checkpoints=2'])).training.keep_checkpoints).toBe(2);
    const errs = await errorsOf({ ...minimal(), training: { keep_checkpoints: 0 } });
    expect(errs.some((e) => e.startsWith('training.keep_checkpoints:'))).toBe(true);
  });
});

describe('training.weight_sync', () => {
  it('auto resolves to distributed for an sglang engine and disk for hf; an explicit choice stays', async () => {
    expect((await ok(minimal())).training.weight_sync).toBe('distributed');
    expect((await ok(minimal(), ['--cluster.rollout.engine=hf'])).training.weight_sync).toBe('disk');
    expect((await ok(minimal(), ['--cluster.rollout.engine=hf', '--training.weight_sync=distributed'])).training.weight_sync).toBe('distributed');
    expect((await ok(minimal(), ['--training.weight-sync=disk'])).training.weight_sync).toBe('disk');
  });

  it('rejects another value, naming the path', async () => {
    expect(await errorsOf({ ...minimal(), training: { weight_sync: 'nccl' } })).toEqual(['training.weight_sync: expected one of auto, disk, distributed, tensor, got "nccl"']);
  });

  it('colocated, auto is tensor, distributed is refused (NCCL refuses two ranks on one GPU), and tensor needs colocate', async () => {
    const one = ['--cluster.colocate=true', '--cluster.trainer.gpus=1'];
    const cfg = await ok(minimal(), one);
    expect([cfg.training.weight_sync, cfg.cluster.colocate]).toEqual(['tensor', true]);
    expect((await ok(minimal(), [...one, '--training.weight_sync=disk'])).training.weight_sync).toBe('disk');
    expect((await errorsOf(minimal(), [...one, '--training.weight_sync=distributed']))[0]).toMatch(/^training\.weight_sync: distributed cannot run with cluster\.colocate: NCCL refuses two ranks on one GPU/);
    expect((await errorsOf(minimal(), ['--training.weight_sync=tensor']))[0]).toMatch(/^training\.weight_sync: tensor .* set cluster\.colocate/);
  });
});

describe('cluster.colocate', () => {
  it('puts the rollout engine on the trainer GPU: the layout counts it once, and both must have one GPU', async () => {
    expect((await ok(minimal(), ['--cluster.colocate=true', '--cluster.trainer.gpus=1'])).cluster.num_gpus).toBe(
      (await ok(minimal(), ['--cluster.trainer.gpus=1'])).cluster.num_gpus! - 1);
    expect(await errorsOf(minimal(), ['--cluster.colocate=true', '--cluster.trainer.gpus=2', '--cluster.rollout.gpus=2'])).toEqual([
      'cluster.trainer.gpus: must be 1 with cluster.colocate (the trainer and the rollout engine share one GPU), got 2',
      'cluster.rollout.gpus: must be 1 with cluster.colocate (the trainer and the rollout engine share one GPU), got 2',
    ]);
  });
});

describe('training.backend', () => {
  it('refuses tp, which the trainer does not implement, at config time rather than at trainer start', async () => {
    expect(await errorsOf({ ...minimal(), training: { backend: 'tp' } })).toEqual(['training.backend: tp is not implemented; use fsdp2 (docs/training.md)']);
  });
});

describe('training.engine_logprobs', () => {
  it('auto is tempered for both engines (SGLang and the hf engine report logits / temperature before truncation); an explicit choice stays', async () => {
    expect((await ok(minimal())).training.engine_logprobs).toBe('tempered');
    expect((await ok(minimal(), ['--cluster.rollout.engine=hf'])).training.engine_logprobs).toBe('tempered');
    expect((await ok(minimal(), ['--training.engine_logprobs=raw'])).training.engine_logprobs).toBe('raw');
    expect((await ok(minimal(), ['--cluster.rollout.engine=hf', '--training.engine_logprobs=tempered'])).training.engine_logprobs).toBe('tempered');
    expect(await errorsOf({ ...minimal(), training: { engine_logprobs: 'processed' } })).toEqual(['training.engine_logprobs: expected one of auto, tempered, raw, sampled, got "processed"']);
  });

  it('refuses the removed sampled, naming tempered instead', async () => {
    const errors = await errorsOf({ ...minimal(), training: { engine_logprobs: 'sampled' } });
    expect(errors).toEqual([`training.engine_logprobs: ${SAMPLED_REMOVED}`]);
    expect(errors[0]).toMatch(/sampled was removed.*use tempered/);
    expect(await errorsOf(minimal(), ['--cluster.rollout.engine=hf', '--training.engine_logprobs=sampled'])).toEqual([`training.engine_logprobs: ${SAMPLED_REMOVED}`]);
  });
});
