import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sampleRecord } from './fixtures.js';
import { canonicalJson } from './reports.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewReport } from './types.js';

let dir: string;
let store: SqliteStore;
let refs: string[];
let otherScenarioRef: string;
beforeEach(async () => {
  dir = mkdtempSync(join(tmpdir(), 'reef-store-'));
  store = SqliteStore.open(join(dir, 'r.db'));
  refs = [(await store.append(sampleRecord(1, { scenario: 'shop' }))).id, (await store.append(sampleRecord(2, { scenario: 'shop' }))).id];
  otherScenarioRef = (await store.append(sampleRecord(3, { scenario: 'other' }))).id;
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

const report = (over: Partial<NewReport> = {}): NewReport => ({
  scenario: 'shop',
  score: 0.5,
  feedback: { text: 'good', tags: ['polite'] },
  references: refs,
  metadata: { harness: 'h1' },
  clientId: 'r-1',
  keyId: 'aaaa0001',
  ...over,
});

describe('reports', () => {
  it('stores a report and reads it back', async () => {
    const { report: stored, created } = await store.putReport(report());
    expect(created).toBe(true);
    expect(stored).toMatchObject({ scenario: 'shop', score: 0.5, references: refs, clientId: 'r-1', metadata: { harness: 'h1' } });
    expect(await store.getReport(stored.id)).toEqual(stored);
  });

  it('is idempotent by client id: the same content returns the stored report', async () => {
    const first = await store.putReport(report());
    // Same content built with a different key order is the same report.
    const again = await store.putReport(report({ feedback: { tags: ['polite'], text: 'good' } }));
    expect(again).toEqual({ report: first.report, created: false });
    expect((await store.listReports({ scenario: 'shop' })).items).toHaveLength(1);
  });

  it('keeps the filing key id; a retry by another key answers the first filer\'s report', async () => {
    const first = await store.putReport(report());
    expect(first.report.keyId).toBe('aaaa0001');
    expect((await store.listReports({ scenario: 'shop' })).items.map((r) => r.keyId)).toEqual(['aaaa0001']);
    const other = await store.putReport(report({ keyId: 'bbbb0002' }));
    expect(other).toEqual({ report: first.report, created: false });
    const second = await store.putReport(report({ clientId: 'r-2', keyId: 'bbbb0002' }));
    expect(second.report.keyId).toBe('bbbb0002');
    expect((await store.getReport(second.report.id))!.keyId).toBe('bbbb0002');
    await expect(store.putReport(report({ clientId: 'r-3', keyId: 'has space' }))).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('report.keyId') });
  });

  it('answers a conflicting retry with REEF_ERR_CONFLICT (409)', async () => {
    await store.putReport(report());
    await expect(store.putReport(report({ score: -1 }))).rejects.toMatchObject({ code: 'REEF_ERR_CONFLICT', status: 409 });
    await expect(store.putReport(report({ references: [refs[0]!] }))).rejects.toMatchObject({ code: 'REEF_ERR_CONFLICT' });
    // The same client id in another scenario is another report.
    await expect(store.putReport(report({ scenario: 'other', references: [otherScenarioRef] }))).resolves.toMatchObject({ created: true });
  });

  it('keeps every report without a client id', async () => {
    await store.putReport(report({ clientId: null }));
    await store.putReport(report({ clientId: null }));
    expect((await store.listReports({ scenario: 'shop' })).items).toHaveLength(2);
  });

  it('names a reference that does not exist or belongs to another scenario', async () => {
    await expect(store.putReport(report({ references: [refs[0]!, '01ARZ3NDEKTSV4RRFFQ69G5FAV'] }))).rejects.toMatchObject({
      code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('01ARZ3NDEKTSV4RRFFQ69G5FAV'),
    });
    await expect(store.putReport(report({ references: [otherScenarioRef] }))).rejects.toMatchObject({
      code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining(otherScenarioRef),
    });
    expect((await store.listReports({ scenario: 'shop' })).items).toHaveLength(0);
  });

  it('validates score, feedback, metadata and scenario', async () => {
    for (const bad of [
      report({ score: Number.NaN }), report({ score: Infinity }), report({ score: '1' as unknown as number }),
      report({ feedback: 3 as unknown as string }), report({ metadata: [] as unknown as Record<string, unknown> }),
      report({ scenario: 'No' }), report({ clientId: '' }),
    ]) {
      await expect(store.putReport(bad)).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    }
    await expect(store.putReport(report({ feedback: 'plain text', metadata: null, references: [] }))).resolves.toMatchObject({ created: true });
  });

  it('pages reports of a scenario', async () => {
    for (let i = 0; i < 5; i++) await store.putReport(report({ clientId: `c-${i}`, score: i }));
    const p1 = await store.listReports({ scenario: 'shop', limit: 3 });
    const p2 = await store.listReports({ scenario: 'shop', limit: 3, after: p1.next });
    expect([...p1.items, ...p2.items].map((r) => r.score)).toEqual([0, 1, 2, 3, 4]);
    expect(p2.next).toBeNull();
  });
});

describe('canonicalJson', () => {
  it('sorts keys at every depth and keeps array order', () => {
    expect(canonicalJson({ b: 1, a: [{ d: 1, c: 2 }, 3] })).toBe('{"a":[{"c":2,"d":1},3],"b":1}');
  });
});
