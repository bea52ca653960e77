import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewJudgedTurn } from './types.js';

let dir: string;
let store: SqliteStore;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-judged-'));
  store = SqliteStore.open(join(dir, 'r.db'));
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

function turn(turnRecordId: string, over: Partial<NewJudgedTurn> = {}): NewJudgedTurn {
  return {
    turnRecordId,
    nextStateRecordId: 'next',
    scenario: 'default',
    sessionKey: 'tag:a',
    decision: 'hint',
    reward: 1,
    teacherCandidates: ['say less'],
    judgment: { votes: [1, 1, -1], decision: 'hint' },
    ...over,
  };
}

describe('judged-turn log', () => {
  it('lists a scenario\'s turns with their votes, hints, next state and reply, paged either way, and its curve points oldest first', async () => {
    const ids: string[] = [];
    for (const [i, scenario] of [[1, 'default'], [2, 'other'], [3, 'default'], [4, 'default']] as const) {
      const r = await store.append({ ...sampleRecord(i, { scenario }), response: { role: 'assistant', content: i === 4 ? [{ type: 'text', text: 'four' }] : `reply ${i}`, tool_calls: null } });
      ids.push(r.id);
      const judgment = i === 3 ? 'not an object' : { score: { votes: [1, null, -1], outputs: ['long'] }, hint: { votes: [1], hints: [`hint ${i}`] }, nextState: { role: 'user', content: `next ${i}` } };
      await store.appendJudgedTurn(turn(r.id, { scenario, judgment, reward: i === 3 ? -1 : 1 }));
    }
    const desc = await store.listJudgedTurns({ scenario: 'default', order: 'desc', limit: 2 });
    expect(desc.items.map((t) => t.offset)).toEqual([4, 3]);
    expect(desc.items[0]).toMatchObject({ turnRecordId: ids[3], votes: { score: [1, null, -1], hint: [1] }, hints: ['hint 4'], nextState: { role: 'user', content: 'next 4' }, reply: 'four' });
    // A judgment without the parts (an older judge's) lists with none rather than failing the page.
    expect(desc.items[1]).toMatchObject({ votes: { score: [], hint: [] }, hints: [], nextState: null, reply: 'reply 3' });
    const rest = await store.listJudgedTurns({ scenario: 'default', order: 'desc', limit: 2, after: desc.next });
    expect(rest).toMatchObject({ items: [{ offset: 1, reply: 'reply 1' }], next: null });
    expect((await store.listJudgedTurns({ scenario: 'default' })).items.map((t) => t.offset)).toEqual([1, 3, 4]);
    expect((await store.judgedSeries('default', 2)).map((p) => [p.offset, p.reward, p.decision])).toEqual([[3, -1, 'hint'], [4, 1, 'hint']]);
    expect(await store.judgedReplies([4, 1, 99])).toEqual(new Map([[1, 'reply 1'], [4, 'four']]));
    await expect(store.listJudgedTurns({ scenario: 'default', after: 'x' })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    await expect(store.judgedSeries('default', 0)).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
  });

  it('appends with increasing offsets, stores the judgment, and reads back by offset', async () => {
    const a = await store.append(sampleRecord(1));
    const b = await store.append(sampleRecord(2));
    expect(await store.judgedHeadOffset()).toBe(0);
    expect(await store.appendJudgedTurn(turn(a.id))).toEqual({ offset: 1, created: true });
    expect(await store.appendJudgedTurn(turn(b.id, { decision: 'anchor', reward: -1, teacherCandidates: [null] }))).toEqual({ offset: 2, created: true });
    expect(await store.getJudgment(a.id)).toEqual({ votes: [1, 1, -1], decision: 'hint' });
    const all = await store.readJudgedTurns(1, 10);
    expect(all.map((t) => [t.offset, t.turnRecordId, t.decision, t.reward, t.teacherCandidates])).toEqual([
      [1, a.id, 'hint', 1, ['say less']],
      [2, b.id, 'anchor', -1, [null]],
    ]);
    expect((await store.readJudgedTurns(2, 10)).map((t) => t.offset)).toEqual([2]);
    expect(await store.readJudgedTurns(3, 10)).toEqual([]);
    expect(await store.judgedHeadOffset()).toBe(2);
  });

  it('a second append of the same turn changes nothing and returns the first offset', async () => {
    const a = await store.append(sampleRecord(1));
    await store.appendJudgedTurn(turn(a.id));
    expect(await store.appendJudgedTurn(turn(a.id, { decision: 'dropped', reward: 0, teacherCandidates: [], judgment: { other: true } }))).toEqual({ offset: 1, created: false });
    expect(await store.getJudgment(a.id)).toEqual({ votes: [1, 1, -1], decision: 'hint' });
    expect((await store.readJudgedTurns(0, 10)).map((t) => t.decision)).toEqual(['hint']);
  });

  it('refuses an unknown record and a bad decision, writing nothing', async () => {
    await expect(store.appendJudgedTurn(turn('NOPE'))).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    const a = await store.append(sampleRecord(1));
    await expect(store.appendJudgedTurn(turn(a.id, { decision: 'maybe' as never }))).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    expect(await store.judgedHeadOffset()).toBe(0);
    expect(await store.getJudgment(a.id)).toBeNull();
  });

  it('judgedTurnIds answers which turns are logged, also past one query chunk', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await store.append(sampleRecord(i))).id);
    await store.appendJudgedTurn(turn(ids[1]!));
    const asked = [...ids, ...Array.from({ length: 1200 }, (_, i) => `x${i}`)];
    expect(await store.judgedTurnIds(asked)).toEqual(new Set([ids[1]]));
    expect(await store.judgedTurnIds([])).toEqual(new Set());
  });

  it('is visible to a second connection (the trainer reads what the judge wrote)', async () => {
    const a = await store.append(sampleRecord(1));
    await store.appendJudgedTurn(turn(a.id));
    const reader = SqliteStore.open(join(dir, 'r.db'));
    try {
      expect((await reader.readJudgedTurns(1, 5)).map((t) => t.turnRecordId)).toEqual([a.id]);
    } finally {
      await reader.close();
    }
  });

  it('migration 2 adds the table to a version-1 file that already holds records', async () => {
    const a = await store.append(sampleRecord(1));
    await store.close();
    const db = new Database(join(dir, 'r.db'));
    // Undo migrations 8, 7, 6, 5, 4, 3 and 2, newest first.
    db.exec('DROP TABLE responses');
    db.exec('ALTER TABLE reports DROP COLUMN key_id');
    db.exec('ALTER TABLE records DROP COLUMN key_id');
    db.exec('DROP TABLE chunk_gc');
    db.exec('ALTER TABLE records DROP COLUMN chunk_ref_bytes');
    db.exec('ALTER TABLE records DROP COLUMN request_form');
    db.exec('DROP TABLE chunks; ALTER TABLE records DROP COLUMN request_chunks; ALTER TABLE records DROP COLUMN prompt_chunks');
    db.exec('DROP TABLE judged_turns');
    db.pragma('user_version = 1');
    db.close();
    store = SqliteStore.open(join(dir, 'r.db'));
    expect((await store.get(a.id))?.id).toBe(a.id);
    expect(await store.appendJudgedTurn(turn(a.id))).toEqual({ offset: 1, created: true });
  });

  it('migration 4 reads the requests of older records as before and stores bodies after them', async () => {
    const a = await store.append(sampleRecord(1));
    const before = (await store.get(a.id))!.request;
    await store.close();
    const db = new Database(join(dir, 'r.db'));
    db.exec('DROP TABLE responses');
    db.exec('ALTER TABLE reports DROP COLUMN key_id');
    db.exec('ALTER TABLE records DROP COLUMN key_id');
    db.exec('DROP TABLE chunk_gc');
    db.exec('ALTER TABLE records DROP COLUMN chunk_ref_bytes');
    db.exec('ALTER TABLE records DROP COLUMN request_form');
    db.pragma('user_version = 3');
    db.close();
    store = SqliteStore.open(join(dir, 'r.db'));
    expect((await store.get(a.id))!.request).toEqual(before);
    const b = await store.append({ ...sampleRecord(2), request: { chatBody: new TextEncoder().encode('{"messages":[{"role":"user","content":"x"}],"seed":3}') } });
    expect((await store.get(b.id))!.request).toEqual({ messages: [{ role: 'user', content: 'x' }], tools: null, params: { seed: 3 } });
  });
});
