import { describe, expect, it } from 'vitest';
import { leaseFromEnv } from './index.js';

describe('REEF_JUDGE_LEASE_MS', () => {
  it('is read when it is whole milliseconds a timer can wait, and absent otherwise', () => {
    expect(leaseFromEnv(undefined)).toBeNull();
    expect(leaseFromEnv('')).toBeNull();
    expect(leaseFromEnv('1500')).toBe(1500);
    expect(leaseFromEnv(String(2 ** 31 - 1))).toBe(2 ** 31 - 1);
  });

  it.each(['abc', '-1', '0', '99', '1.5e3x', '2.5', String(2 ** 31), '1e12'])('refuses %j, naming the variable', (v) => {
    expect(() => leaseFromEnv(v)).toThrow(expect.objectContaining({ code: 'REEF_ERR_CONFIG_INVALID', message: expect.stringContaining('REEF_JUDGE_LEASE_MS') }));
  });
});
