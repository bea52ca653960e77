import { Agent, fetch as undiciFetch } from 'undici';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { testKey } from '../helpers/api-keys.js';
import { CHAT, openAIError, startStack, type Stack } from './harness.js';

/**
 * Failed authentications are bounded per client address (`reef.limits.auth_failures_per_minute`,
 * security review M7): a guesser gets N tries and then 429 for every request, whatever its key,
 * while clients at other addresses are served as before. The whole of 127.0.0.0/8 is loopback on
 * Linux, so a second client address is a socket bound to 127.0.0.2.
 */

const KEY = testKey('throttle-good');
const N = 10;

/** A client whose connections come from `localAddress`. */
function clientAt(localAddress: string) {
  const dispatcher = new Agent({ localAddress });
  return {
    get: (url: string, key: string | null) => undiciFetch(url, { dispatcher, headers: key === null ? {} : { authorization: `Bearer ${key}` } }),
    post: (url: string, key: string) => undiciFetch(url, { dispatcher, method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(CHAT) }),
    close: () => dispatcher.close(),
  };
}

describe('failed authentications per address', () => {
  let s: Stack;
  const guesser = clientAt('127.0.0.1');
  const other = clientAt('127.0.0.2');

  beforeAll(async () => {
    s = await startStack({ apiKeys: [{ key: KEY }], limits: { auth_failures_per_minute: N } });
  });
  afterAll(async () => {
    await guesser.close();
    await other.close();
    await s?.close();
  });

  it('100 wrong keys from one address: N are 401, then 429 with Retry-After; a right key elsewhere still works', async () => {
    const statuses: number[] = [];
    let firstRefusal: { retryAfter: string | null; body: unknown } | null = null;
    for (let i = 0; i < 100; i++) {
      const res = await guesser.get(`${s.url}/v1/models`, testKey(`guess-${i}`));
      statuses.push(res.status);
      const body = await res.json();
      if (res.status === 429 && firstRefusal === null) firstRefusal = { retryAfter: res.headers.get('retry-after'), body };
    }
    // The bucket refills one try every 60/N s: a slow run may let a late guess through as a 401.
    expect(statuses.slice(0, N + 1)).toEqual([...Array<number>(N).fill(401), 429]);
    expect(statuses.every((x) => x === 401 || x === 429)).toBe(true);
    expect(statuses.filter((x) => x === 429).length).toBeGreaterThanOrEqual(80);

    expect(Number(firstRefusal!.retryAfter)).toBeGreaterThanOrEqual(1);
    const e = openAIError(firstRefusal!.body);
    expect(e.code).toBe('REEF_ERR_RATE_LIMIT');
    expect(e.type).toBe('rate_limit_error');
    expect(e.message).toContain('reef.limits.auth_failures_per_minute');

    // Another address is not affected, and its right key is served, chat completions included.
    expect((await other.get(`${s.url}/v1/models`, KEY)).status).toBe(200);
    expect((await other.post(`${s.url}/v1/chat/completions`, KEY)).status).toBe(200);
    expect((await other.get(`${s.url}/v1/models`, 'wrong')).status).toBe(401);

    // From the throttled address a right key is refused too: answering it would tell the guesser
    // which guess was right. Health checks need no key and stay open.
    expect((await guesser.get(`${s.url}/v1/models`, KEY)).status).toBe(429);
    expect((await guesser.get(`${s.url}/healthz`, null)).status).toBe(200);
  });
});
