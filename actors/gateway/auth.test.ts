import { describe, expect, it } from 'vitest';
import { resolveConfig } from '../../cluster/config/index.js';
import { Authenticator } from './auth.js';
import { resolveApiKeys } from './index.js';

describe('API keys from the environment', () => {
  const config = () =>
    resolveConfig({ cluster: { rollout: { model_path: '/m' }, prm: { model_path: '/p' } }, reef: { api_keys: [{ key_env: 'REEF_TEST_KEY', scenarios: ['alpha'] }] } }, { baseDir: '/srv', overrides: [] });

  it('are trimmed as a client key is, so a value written with a newline still matches', async () => {
    const specs = resolveApiKeys(await config(), { REEF_TEST_KEY: 'sk-123\n' });
    expect(specs).toEqual([{ key: 'sk-123', scenarios: ['alpha'], maxConcurrency: 64 }]);
    const auth = new Authenticator(specs);
    expect(auth.authenticate({ authorization: 'Bearer sk-123' })?.scenarios).toEqual(new Set(['alpha']));
  });

  it('name the variable when it is unset or blank', async () => {
    const cfg = await config();
    for (const env of [{}, { REEF_TEST_KEY: ' \n' }]) {
      expect(() => resolveApiKeys(cfg, env)).toThrow(/reef\.api_keys\[0\]\.key_env: environment variable REEF_TEST_KEY is not set or is blank/);
    }
  });

  it('refuse a value with characters other than printable ASCII, which no client can send in a header', async () => {
    const cfg = await config();
    expect(() => resolveApiKeys(cfg, { REEF_TEST_KEY: 'clé' })).toThrow(/holds characters other than printable ASCII/);
  });
});
