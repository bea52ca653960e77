import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewRecord } from './types.js';

let dir: string;
let store: SqliteStore;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-deletion-'));
  store = SqliteStore.open(join(dir, 'records.sqlite'));
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Every file of the store's directory (database, WAL, shared memory), and which hold `marker`. */
function filesHolding(marker: string): string[] {
  const needle = Buffer.from(marker, 'utf8');
  return readdirSync(dir).filter((f) => readFileSync(join(dir, f)).includes(needle));
}

/** A turn of `session` whose system prompt (~20 KB, stored as chunks), question and answer carry `marker`. */
function turn(seed: number, session: string, marker: string): NewRecord {
  const base = sampleRecord(seed, { promptTokens: 5000 });
  return {
    ...base,
    tags: { session },
    request: { messages: [{ role: 'system', content: `${marker} system. `.repeat(800) }, { role: 'user', content: `my address is ${marker}-question` }], tools: null, params: {} },
    response: { role: 'assistant', content: `${marker}-answer`, tool_calls: null },
  };
}

const GONE = 'Zq9GONEmarker';
const KEPT = 'Zq9KEPTmarker';

async function fill(): Promise<{ gone: string[]; kept: string[] }> {
  const gone: string[] = [];
  const kept: string[] = [];
  for (let i = 0; i < 3; i++) gone.push((await store.append(turn(i, 'alice', GONE))).id);
  for (let i = 3; i < 5; i++) kept.push((await store.append(turn(i, 'bob', KEPT))).id);
  const judged = { scenario: 'default', sessionKey: 'tag:alice', decision: 'hint' as const, reward: 1, teacherCandidates: [`hint quoting ${GONE}`] };
  await store.appendJudgedTurn({ ...judged, turnRecordId: gone[0]!, nextStateRecordId: gone[1]!, judgment: { hint: `${GONE} hint` } });
  await store.appendJudgedTurn({ ...judged, sessionKey: 'tag:bob', turnRecordId: kept[0]!, nextStateRecordId: kept[1]!, teacherCandidates: [`hint quoting ${KEPT}`], judgment: {} });
  await store.putReport({ scenario: 'default', score: 1, feedback: `${GONE} feedback`, references: [gone[2]!], metadata: null, clientId: null, keyId: null });
  await store.putReport({ scenario: 'default', score: 1, feedback: `${KEPT} feedback`, references: [kept[1]!], metadata: null, clientId: null, keyId: null });
  // The judge's row of a turn waiting for its PRM: it quotes the next state.
  await store.putState(`judge/pending/${gone[1]!}`, { turn: { nextState: { role: 'user', content: `${GONE} next` } } });
  return { gone, kept };
}

describe('deletion on request', () => {
  it("removes a session's records and every row that quotes them, and no byte of their text is left in the database, WAL or shared-memory file", async () => {
    const { gone, kept } = await fill();
    expect(filesHolding(GONE).length).toBeGreaterThan(0);
    const forgotten: string[][] = [];
    const counts = await store.deleteRecords({ scenario: 'default', session: 'alice' }, async (ids) => void forgotten.push(ids));
    expect(counts).toMatchObject({ records: 3, judgedTurns: 1, judgments: 1, reports: 1, pendingJudgments: 1, walTruncated: true });
    expect(counts.chunks).toBeGreaterThan(0);
    expect(forgotten).toEqual([gone]);
    for (const id of gone) expect(await store.get(id)).toBeNull();
    for (const id of kept) expect((await store.get(id))?.response.content).toBe(`${KEPT}-answer`);
    expect(await store.judgedHeadOffset()).toBeGreaterThan(0);
    expect((await store.listReports({ scenario: 'default' })).items.map((r) => r.feedback)).toEqual([`${KEPT} feedback`]);
    await store.close();
    expect(filesHolding(GONE)).toEqual([]);
    expect(filesHolding(KEPT)).toContain('records.sqlite');
  });

  it('is idempotent: asking again deletes nothing and answers zero counts', async () => {
    await fill();
    await store.deleteRecords({ scenario: 'default', session: 'alice' }, async () => {});
    const again = await store.deleteRecords({ scenario: 'default', session: 'alice' }, async () => {});
    expect(again).toMatchObject({ records: 0, judgedTurns: 0, reports: 0, pendingJudgments: 0, chunks: 0, ids: [] });
  });

  it('a whole scenario goes with session null, and other scenarios stay', async () => {
    await fill();
    const other = (await store.append({ ...turn(9, 'alice', KEPT), scenario: 'other' })).id;
    const counts = await store.deleteRecords({ scenario: 'default', session: null }, async () => {});
    expect(counts.records).toBe(5);
    expect(await store.get(other)).not.toBeNull();
  });

  it('a deletion stopped midway (the judge unreachable) keeps its intent, and resuming it finishes the job with the ids it had found', async () => {
    const { gone } = await fill();
    await expect(store.deleteRecords({ scenario: 'default', session: 'alice' }, async () => {
      throw new Error('judge unreachable');
    })).rejects.toThrow('judge unreachable');
    // The rows went in the first pass; the intent row still names the ids.
    expect(await store.get(gone[0]!)).toBeNull();
    expect((await store.statesWithPrefix('deletion/')).length).toBe(1);
    // A row an actor wrote back meanwhile (its commit raced the first pass) goes in the resumed run.
    await store.putState(`judge/pending/${gone[0]!}`, { turn: { nextState: { content: `${GONE} again` } } });
    const told: string[][] = [];
    expect(await store.resumeDeletions(async (ids) => void told.push(ids))).toBe(1);
    expect(told).toEqual([gone]);
    expect(await store.statesWithPrefix('deletion/')).toEqual([]);
    expect(await store.getState(`judge/pending/${gone[0]!}`)).toBeNull();
    await store.close();
    expect(filesHolding(GONE)).toEqual([]);
  });

  it('refuses an empty session tag and a bad scenario name', async () => {
    await expect(store.deleteRecords({ scenario: 'default', session: '' }, async () => {})).rejects.toThrow(/session tag/);
    await expect(store.deleteRecords({ scenario: '../x', session: 'a' }, async () => {})).rejects.toThrow();
  });

  it('lineage: batch rows outlive the records they name', async () => {
    const { gone } = await fill();
    await store.putBatchTurns('default:openclawrl:1', 'default', [gone[0]!, gone[1]!]);
    await store.putBatchTurns('default:openclawrl:1', 'default', [gone[0]!]); // idempotent
    await store.putBatchTurns('default:openclawrl:2', 'default', [gone[1]!]);
    expect(await store.batchesOf([gone[0]!, gone[1]!, gone[2]!])).toEqual(new Map([[gone[0]!, ['default:openclawrl:1']], [gone[1]!, ['default:openclawrl:1', 'default:openclawrl:2']]]));
    await store.deleteRecords({ scenario: 'default', session: 'alice' }, async () => {});
    expect((await store.batchesOf([gone[1]!])).get(gone[1]!)).toHaveLength(2);
  });
});
