import { describe, expect, it } from 'vitest';
import { addressKey, AuthFailureThrottle } from './auth-throttle.js';

describe('AuthFailureThrottle', () => {
  it('refuses an address after N failures until the bucket refills one, and no other address', () => {
    let t = 0;
    const th = new AuthFailureThrottle(6, 100, () => t);
    for (let i = 0; i < 6; i++) {
      expect(th.refusedFor('10.0.0.1')).toBe(0);
      th.fail('10.0.0.1');
    }
    // 6 a minute: one every 10 s.
    expect(th.refusedFor('10.0.0.1')).toBe(10);
    expect(th.refusedFor('10.0.0.2')).toBe(0);
    t = 4_000;
    expect(th.refusedFor('10.0.0.1')).toBe(6);
    t = 10_000;
    expect(th.refusedFor('10.0.0.1')).toBe(0);
    th.fail('10.0.0.1');
    expect(th.refusedFor('10.0.0.1')).toBe(10);
  });

  it('tracks at most maxAddresses, forgetting the one whose last failure is oldest', () => {
    const th = new AuthFailureThrottle(1, 3, () => 0);
    for (const a of ['10.0.0.1', '10.0.0.2', '10.0.0.3']) th.fail(a);
    // A new failure moves .1 to the newest end, so .2 goes first.
    th.fail('10.0.0.1');
    th.fail('10.0.0.4');
    expect(th.size).toBe(3);
    expect(['10.0.0.1', '10.0.0.2', '10.0.0.3', '10.0.0.4'].map((a) => th.refusedFor(a) > 0)).toEqual([true, false, true, true]);
    for (let i = 0; i < 10_000; i++) th.fail(`10.1.${i >> 8}.${i & 255}`);
    expect(th.size).toBe(3);
  });

  it('counts IPv4-mapped addresses as IPv4, and IPv6 by its /64', () => {
    const th = new AuthFailureThrottle(2, 100, () => 0);
    th.fail('::ffff:192.0.2.7');
    th.fail('192.0.2.7');
    expect(th.refusedFor('192.0.2.7')).toBeGreaterThan(0);
    th.fail('2001:db8:1:2::1');
    th.fail('2001:db8:1:2:ffff:ffff:ffff:ffff');
    expect(th.refusedFor('2001:db8:1:2:abcd::9')).toBeGreaterThan(0);
    expect(th.refusedFor('2001:db8:1:3::1')).toBe(0);
  });
});

describe('addressKey', () => {
  it.each([
    ['127.0.0.1', '127.0.0.1'],
    ['::ffff:127.0.0.1', '127.0.0.1'],
    ['::FFFF:10.1.2.3', '10.1.2.3'],
    ['::1', '0:0:0:0::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['2001:0db8:0000:0042:0000:8a2e:0370:7334', '2001:db8:0:42::/64'],
    ['2001:db8:0:42::', '2001:db8:0:42::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['64:ff9b::192.0.2.33', '64:ff9b:0:0::/64'],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4::/64'],
  ])('%s → %s', (address, key) => {
    expect(addressKey(address)).toBe(key);
  });
});
