import { describe, expect, it } from 'vitest';
import { resolveConfig } from '../../cluster/config/index.js';
import { type ApiKeySpec, Authenticator, INVALID_BEARER_BESIDE_X_API_KEY, keyIdOf, MISSING_OR_INVALID_KEY, type Principal } from './auth.js';
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

describe('replacing the keys (reef keys reload)', () => {
  const A = testKey('reload-a');
  const B = testKey('reload-b');
  const spec = (key: string, over: Partial<ApiKeySpec> = {}): ApiKeySpec => ({ key, scenarios: null, maxConcurrency: 2, ...over });
  const who = (auth: Authenticator, key: string) => auth.authenticate({ 'x-api-key': key });

  it('admits the new keys and refuses a removed one at once; a request admitted before keeps its principal', () => {
    const auth = new Authenticator([spec(A)]);
    const inFlight = who(auth, A) as Principal;
    expect(inFlight.limiter.tryAcquire()).toBe(true);
    auth.replace([spec(B, { scenarios: ['beta'] })]);
    expect(who(auth, A)).toBe(MISSING_OR_INVALID_KEY);
    const b = who(auth, B) as Principal;
    expect([b.id, [...b.scenarios!], b.setting]).toEqual([keyIdOf(B), ['beta'], 'reef.api_keys[0].']);
    // The request admitted under A still has A's principal, and gives its slot back to it.
    expect([inFlight.id, inFlight.scenarios]).toEqual([keyIdOf(A), null]);
    inFlight.limiter.release();
    expect(auth.size).toBe(1);
  });

  it('keeps the slots and buckets of a key whose limits are unchanged, so a reload frees no concurrency', () => {
    const auth = new Authenticator([spec(A, { tokensPerMinute: 100 })]);
    const before = who(auth, A) as Principal;
    expect(before.limiter.tryAcquire()).toBe(true);
    expect(before.limiter.tryAcquire()).toBe(true);
    // Moved to index 1 and given other scenarios: the same key, the same limits.
    auth.replace([spec(B), spec(A, { tokensPerMinute: 100, scenarios: ['alpha'] })]);
    const after = who(auth, A) as Principal;
    expect(after.limiter).toBe(before.limiter);
    expect(after.limiter.tryAcquire()).toBe(false);
    expect(after.tokens).toBe(before.tokens);
    expect([after.setting, [...after.scenarios!]]).toEqual(['reef.api_keys[1].', ['alpha']]);
    // A changed limit is a new limiter, at the new size.
    auth.replace([spec(A, { maxConcurrency: 5 })]);
    expect((who(auth, A) as Principal).limiter.limit).toBe(5);
  });

  it('on a bad set of keys throws naming the entry and keeps the old keys', () => {
    const auth = new Authenticator([spec(A)]);
    expect(() => auth.replace([spec(B), spec(B)])).toThrow(/reef\.api_keys\[1\] has the same key as reef\.api_keys\[0\]/);
    expect((who(auth, A) as Principal).id).toBe(keyIdOf(A));
    expect(who(auth, B)).toBe(MISSING_OR_INVALID_KEY);
  });

  it('cannot turn keys off, nor on for a gateway started without them (its browser guard was chosen at start)', () => {
    const keyed = new Authenticator([spec(A)]);
    expect(() => keyed.replace([])).toThrow(/reef\.api_keys: the gateway started with keys, and a reload cannot turn keys off/);
    expect((who(keyed, A) as Principal).id).toBe(keyIdOf(A));
    const open = new Authenticator([]);
    expect(() => open.replace([spec(A)])).toThrow(/started without keys, and a reload cannot turn keys on/);
    expect((who(open, 'anything') as Principal).id).toBe('open');
  });
});
