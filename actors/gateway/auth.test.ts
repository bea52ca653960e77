import { describe, expect, it } from 'vitest';
import { resolveConfig } from '../../cluster/config/index.js';
import { Authenticator, INVALID_BEARER_BESIDE_X_API_KEY, keyIdOf, MISSING_OR_INVALID_KEY, type Principal } from './auth.js';
import { resolveApiKeys } from './index.js';
import { testKey } from '../../test/helpers/api-keys.js';

const KEY = testKey('sk-env');
const OTHER = testKey('sk-other');

describe('API keys from the environment', () => {
  const config = () =>
    resolveConfig({ cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p' } }, reef: { api_keys: [{ key_env: 'REEF_TEST_KEY', scenarios: ['alpha'] }] } }, { baseDir: '/srv', overrides: [] });

  it('are trimmed as a client key is, so a value written with a newline still matches', async () => {
    const specs = resolveApiKeys(await config(), { REEF_TEST_KEY: `${KEY}\n` });
    expect(specs).toEqual([{ key: KEY, scenarios: ['alpha'], maxConcurrency: 64, requestsPerMinute: null, tokensPerMinute: null }]);
    const auth = new Authenticator(specs);
    expect((auth.authenticate({ authorization: `Bearer ${KEY}` }) as Principal).scenarios).toEqual(new Set(['alpha']));
  });

  it('name the variable when it is unset or blank', async () => {
    const cfg = await config();
    for (const env of [{}, { REEF_TEST_KEY: ' \n' }]) {
      expect(() => resolveApiKeys(cfg, env)).toThrow(/reef\.api_keys\[0\]\.key_env: environment variable REEF_TEST_KEY is not set or is blank/);
    }
  });

  it('refuse two keys of one id, which would share their records\' provenance and their sessions', () => {
    // A birthday search over 32-bit ids: two such keys turn up within ~10^5 tries.
    const seen = new Map<string, string>();
    let pair: [string, string] | null = null;
    for (let i = 0; pair === null; i++) {
      const key = `sk-collide-${i}`;
      const other = seen.get(keyIdOf(key));
      if (other !== undefined) pair = [other, key];
      else seen.set(keyIdOf(key), key);
    }
    const spec = (key: string) => ({ key, scenarios: null, maxConcurrency: 1 });
    expect(() => new Authenticator([spec('sk-other'), spec(pair[0]), spec(pair[1])])).toThrow(/reef\.api_keys\[2\] and reef\.api_keys\[1\] have keys whose ids/);
    const auth = new Authenticator([spec('sk-a'), spec('sk-b')]);
    expect((auth.authenticate({ authorization: 'Bearer sk-a' }) as Principal).id).toBe(keyIdOf('sk-a'));
    expect(new Authenticator([]).authenticate({}) as Principal).toMatchObject({ id: 'open' });
  });

  it('refuse a key given twice (regression: the first entry won, so the other\'s scenario limit was ignored)', async () => {
    const cfg = await resolveConfig(
      { cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p' } }, reef: { api_keys: [{ key: KEY }, { key_env: 'REEF_TEST_KEY', scenarios: ['alpha'] }] } },
      { baseDir: '/srv', overrides: [] },
    );
    expect(() => new Authenticator(resolveApiKeys(cfg, { REEF_TEST_KEY: KEY }))).toThrow(/reef\.api_keys\[1\] has the same key as reef\.api_keys\[0\]/);
    expect(new Authenticator(resolveApiKeys(cfg, { REEF_TEST_KEY: OTHER })).required).toBe(true);
  });

  it('refuse a value with characters other than printable ASCII, which no client can send in a header', async () => {
    const cfg = await config();
    expect(() => resolveApiKeys(cfg, { REEF_TEST_KEY: 'clé' })).toThrow(/holds characters other than printable ASCII/);
  });

  it('refuse a key shorter than the config allows, naming the entry and the variable but saying nothing of the key', async () => {
    const cfg = await config();
    const short = KEY.slice(0, 31);
    let message = '';
    try {
      resolveApiKeys(cfg, { REEF_TEST_KEY: short });
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toContain('reef.api_keys[0].key_env: the key in environment variable REEF_TEST_KEY must be at least 32 characters, got 31');
    expect(message).not.toContain(short.slice(7, 20));
    expect(resolveApiKeys(cfg, { REEF_TEST_KEY: `${short}d` })[0]!.key).toHaveLength(32);
  });
});

describe('credentials in the headers', () => {
  const auth = new Authenticator([
    { key: 'sk-admin', scenarios: null, maxConcurrency: 4 },
    { key: 'sk-alpha', scenarios: ['alpha'], maxConcurrency: 4 },
  ]);
  const who = (headers: Record<string, string>) => {
    const p = auth.authenticate(headers);
    return typeof p === 'string' ? p : p.scenarios === null ? 'admin' : 'alpha';
  };

  it('take the Bearer scheme in any case and spacing, or x-api-key, trimmed', () => {
    for (const authorization of ['Bearer sk-admin', 'bearer sk-admin', 'BEARER   sk-admin  ', ' Bearer\tsk-admin']) expect(who({ authorization }), authorization).toBe('admin');
    expect(who({ 'x-api-key': ' sk-alpha ' })).toBe('alpha');
    // Another scheme (a proxy's Basic) is not a key: x-api-key still is.
    expect(who({ authorization: 'Basic c2stYWRtaW4=', 'x-api-key': 'sk-alpha' })).toBe('alpha');
    for (const headers of [{}, { authorization: 'Bearer' }, { authorization: 'Bearer ' }, { authorization: 'sk-admin' }, { authorization: 'Basic sk-admin' }, { 'x-api-key': ' ' }, { 'x-api-key': 'sk-wrong' }]) {
      expect(who(headers), JSON.stringify(headers)).toBe(MISSING_OR_INVALID_KEY);
    }
  });

  it('use the Bearer key when both headers are sent, and say so when it is the wrong one (regression: the 401 read as if no right key were sent)', () => {
    expect(who({ authorization: 'Bearer sk-alpha', 'x-api-key': 'sk-admin' })).toBe('alpha');
    expect(who({ authorization: 'Bearer sk-admin', 'x-api-key': 'sk-wrong' })).toBe('admin');
    expect(who({ authorization: 'Bearer sk-wrong', 'x-api-key': 'sk-admin' })).toBe(INVALID_BEARER_BESIDE_X_API_KEY);
    expect(who({ authorization: 'Bearer sk-wrong' })).toBe(MISSING_OR_INVALID_KEY);
  });
});
