import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { powerRound, type RoundResult } from '../../bench/powerloss/round.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { powercutLibrary } from '../helpers/powercut.js';
import { seeded } from '../helpers/seeded.js';
import { ensureBuilt } from './harness.js';

/**
 * "Acknowledged means durable" under the power-loss emulation (fsync granularity, not a real power
 * cut: docs/benchmarks.md "The power-loss emulation"). The real gateway process writes receipts
 * under the powercut library, clients log each receipt they get, the cut comes at a random moment,
 * and the restored store is checked. `process` is the control: it must lose receipts, or this
 * test could not see a loss at all. `npm run powerloss` repeats it many times.
 */

describe('gateway receipts across an emulated power cut', () => {
  let engine: FakeEngine;
  let work: string;
  const rand = seeded(21);
  let round = 0;

  beforeAll(async () => {
    ensureBuilt();
    powercutLibrary();
    engine = await startFakeEngine({ keepRequests: 16 });
    work = mkdtempSync(join(tmpdir(), 'reef-gw-powerloss-'));
  });
  afterAll(async () => {
    await engine?.close();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  const run = (durability: 'power' | 'process', min: number, max: number): Promise<RoundResult> =>
    powerRound({ durability, engineUrl: engine.url, dir: join(work, `r${round++}`), cutAfterMs: Math.round(min + rand() * (max - min)) });

  const expectSound = (r: RoundResult) => {
    expect(r.integrity).toBe('ok');
    expect(r.contiguous).toBe(true);
    expect(r.unreadable).toEqual([]);
  };

  it("durability 'power': every receipt a client logged is in the restored store, and the store is sound", async () => {
    for (let i = 0; i < 2; i++) {
      const r = await run('power', 50, 800);
      expect(r.logged).toBeGreaterThan(0);
      expect(r.lost).toEqual([]);
      expect(r.stored).toBeGreaterThanOrEqual(r.logged);
      expectSound(r);
    }
  });

  it("durability 'process' (the control): the harness sees receipts lost, and the store that is left is sound", async () => {
    // NORMAL syncs the WAL only at a checkpoint (every 200 ms), so almost every cut loses the
    // receipts since; a cut just after a checkpoint with no commit in between loses none, hence
    // up to three rounds.
    const rounds: RoundResult[] = [];
    while (rounds.length < 3 && !rounds.some((r) => r.lost.length > 0)) rounds.push(await run('process', 250, 800));
    for (const r of rounds) expectSound(r);
    expect(rounds.map((r) => r.lost.length).some((n) => n > 0)).toBe(true);
  });
});
