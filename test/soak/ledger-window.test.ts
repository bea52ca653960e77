import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { LEDGER_KEEP, releasesMissingLedger } from '../../bench/soak/check.js';
import { repoRoot } from '../../cluster/paths.js';

const ids = (n: number) => Array.from({ length: n }, (_, i) => `b${i + 1}`);
const ledgerOf = (batches: string[]) => Object.fromEntries(batches.map((b) => [b, {}]));

describe('soak checker: the ledger window', () => {
  it('asks the ledger only for the newest batches it keeps, and still finds one missing among them', () => {
    const released = ids(LEDGER_KEEP + 131);
    const kept = released.slice(-LEDGER_KEEP);
    expect(releasesMissingLedger(released, ledgerOf(kept))).toEqual([]);
    const newest = kept.at(-1)!;
    expect(releasesMissingLedger(released, ledgerOf(kept.filter((b) => b !== newest)))).toEqual([newest]);
    expect(releasesMissingLedger(ids(5), ledgerOf(ids(4)))).toEqual(['b5']);
  });

  it("keeps the trainer's own window", () => {
    const py = readFileSync(join(repoRoot(), 'python_shim/reef_shim/trainer/checkpoint.py'), 'utf8');
    expect(py).toMatch(new RegExp(`^LEDGER_KEEP = ${LEDGER_KEEP}$`, 'm'));
  });
});
