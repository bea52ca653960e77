import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { LEDGER_FILE, setAsideEarlierLedger } from './index.js';

describe('a batch ledger left by an earlier run', () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  it('is the file the trainer group writes', () => {
    const python = readFileSync(join(import.meta.dirname, '../../python_shim/reef_shim/trainer/checkpoint.py'), 'utf8');
    expect(python).toContain(`LEDGER = "${LEDGER_FILE}"`);
  });

  it('is set aside whole, under another name, and said so; without one nothing happens', () => {
    const dir = mkdtempSync(join(tmpdir(), 'reef-ledger-'));
    dirs.push(dir);
    const lines: string[] = [];
    expect(setAsideEarlierLedger(dir, (l) => lines.push(l))).toBeNull();
    const ledger = JSON.stringify({ batches: { 's:openclawrl:1': { weightVersion: 'v1', checkpointPath: join(dir, 'v1') } } });
    writeFileSync(join(dir, LEDGER_FILE), ledger);
    const to = setAsideEarlierLedger(dir, (l) => lines.push(l), new Date('2026-11-30T12:00:00.000Z'));
    expect(readdirSync(dir)).toEqual(['reef_trainer_ledger.before-2026-11-30T12-00-00-000Z.json']);
    expect(readFileSync(to!, 'utf8')).toBe(ledger);
    expect(lines).toEqual([expect.stringContaining("an earlier run's")]);
  });
});
