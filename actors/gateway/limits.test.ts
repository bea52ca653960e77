import { mkdtempSync, rmSync, statfsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { TokenBucket } from './auth.js';
import { DiskGuard, ScenarioCap } from './limits.js';

describe('TokenBucket', () => {
  it('gives a whole minute at once, then refills at perMinute / 60 a second, never past perMinute', () => {
    let now = 0;
    const b = new TokenBucket(60, () => now);
    for (let i = 0; i < 60; i++) expect(b.take(1)).toBe(0);
    // Empty: one token a second.
    expect(b.take(1)).toBe(1);
    expect(b.emptyFor()).toBe(1);
    now += 1000;
    expect(b.take(1)).toBe(0);
    // A long idle spell refills to the limit, not beyond.
    now += 3_600_000;
    expect(b.take(60)).toBe(0);
    expect(b.take(1)).toBe(1);
  });

  it('says how many whole seconds until a larger take fits, and takes nothing meanwhile', () => {
    let now = 0;
    const b = new TokenBucket(600, () => now);
    expect(b.take(500)).toBe(0);
    // 100 left, 10 a second: 300 more need 30 s.
    expect(b.take(400)).toBe(30);
    expect(b.take(100)).toBe(0);
    now += 500;
    expect(b.emptyFor()).toBe(0);
  });
});

describe('DiskGuard', () => {
  const dir = mkdtempSync(join(tmpdir(), 'reef-disk-'));
  const s = statfsSync(dir);
  const free = s.bavail * s.bsize;

  it('refuses below the threshold with a 503 naming the setting, and passes above it', () => {
    const full = new DiskGuard(dir, free * 2 + 2 ** 30).check();
    expect(full?.code).toBe('REEF_ERR_DISK_FULL');
    expect(full?.status).toBe(503);
    expect(full?.message).toContain('reef.limits.min_free_disk_mb');
    expect(new DiskGuard(dir, 1).check()).toBeNull();
    expect(new DiskGuard(dir, 0).check()).toBeNull();
  });

  it('leaves a data dir it cannot measure to the commit', () => {
    expect(new DiskGuard(join(dir, 'missing', 'dir'), 2 ** 60).check()).toBeNull();
    rmSync(dir, { recursive: true, force: true });
  });
});

describe('ScenarioCap', () => {
  it('admits known names always and new ones up to the limit; the refusal names the cap and the key', () => {
    const cap = new ScenarioCap(['a', 'b'], 3);
    expect(cap.admit('a')).toBeNull();
    expect(cap.admit('c')).toBeNull();
    const refused = cap.admit('d');
    expect(refused?.code).toBe('REEF_ERR_SCENARIO_LIMIT');
    expect(refused?.message).toContain('reef.limits.max_scenarios allows (3)');
    expect(cap.admit('c')).toBeNull();
    // A store already past the cap (the cap lowered) keeps its scenarios.
    const lowered = new ScenarioCap(['a', 'b', 'c'], 1);
    expect(lowered.admit('b')).toBeNull();
    expect(lowered.admit('z')).not.toBeNull();
  });
});
