import { describe, expect, it } from 'vitest';
import { Batcher, batchId, recordLine, rewardSplit, type TaskRef } from './task2batch.js';

const t = (id: string, reward: number, hints: string[] = []): TaskRef => ({ turnRecordId: id, reward, hints });

describe('Batcher', () => {
  it('forms one batch per batch_size tasks with monotonic ids per scenario', () => {
    const b = new Batcher(2);
    expect(b.add('a', t('r1', 1))).toBeNull();
    const first = b.add('a', t('r2', -1));
    expect(first).toMatchObject({ batchId: 'a:openclawrl:1', n: 1, scenario: 'a' });
    expect(first!.tasks.map((x) => x.turnRecordId)).toEqual(['r1', 'r2']);
    expect(b.add('b', t('r3', 1))).toBeNull();
    expect(b.add('a', t('r4', 0))).toBeNull();
    expect(b.add('a', t('r5', 1))!.batchId).toBe('a:openclawrl:2');
    expect(b.add('b', t('r6', 1))!.batchId).toBe('b:openclawrl:1');
  });

  it('puts each task in exactly one batch across a save and restore', () => {
    const b = new Batcher(3);
    const seen: string[] = [];
    let restored = b;
    for (let i = 0; i < 10; i++) {
      const batch = restored.add('s', t(`r${i}`, 1));
      if (batch) seen.push(...batch.tasks.map((x) => x.turnRecordId));
      // Every step is a crash and a restart from the persisted state.
      restored = new Batcher(3, JSON.parse(JSON.stringify(restored.toJSON())));
    }
    expect(seen).toEqual(['r0', 'r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7', 'r8']);
    expect(restored.pendingCount('s')).toBe(1);
    expect(restored.add('s', t('r10', 1))).toBeNull();
  });

  it('reports the judge counters of the turns judged since the previous batch', () => {
    const b = new Batcher(1);
    b.count('s', ['eval:-1', 'declined']);
    b.count('s', ['eval:1', 'hint_accepted']);
    const batch = b.add('s', t('r1', 1, ['no bold']))!;
    expect(batch.judged).toEqual({ 'eval:-1': 1, declined: 1, 'eval:1': 1, hint_accepted: 1 });
    b.count('s', ['eval:0']);
    expect(b.add('s', t('r2', 0))!.judged).toEqual({ 'eval:0': 1 });
  });

  it('a batch_size lowered across a restart still makes batches of batch_size, oldest first', () => {
    const before = new Batcher(8);
    for (let i = 0; i < 5; i++) before.add('s', t(`r${i}`, 1));
    const after = new Batcher(2, before.toJSON());
    expect(after.add('s', t('r5', 1))!.tasks.map((x) => x.turnRecordId)).toEqual(['r0', 'r1']);
    expect(after.pendingCount('s')).toBe(4);
    expect(after.add('s', t('r6', 1))!.tasks.map((x) => x.turnRecordId)).toEqual(['r2', 'r3']);
    expect(after.pendingCount('s')).toBe(3);
  });

  it('rejects a batch size that is not a positive integer', () => {
    expect(() => new Batcher(0)).toThrow(/positive integer/);
  });
});

describe('record line', () => {
  it('has the documented fields', () => {
    const b = new Batcher(3);
    b.count('s', ['next_state:user', 'eval:1']);
    b.add('s', t('r1', 1));
    b.add('s', t('r2', -1));
    const batch = b.add('s', t('r3', 0))!;
    expect(recordLine(batch, { bound: 3, tagged: 3 })).toEqual({
      batch: 1,
      batch_id: 's:openclawrl:1',
      scenario: 's',
      samples: 3,
      turns: ['r1', 'r2', 'r3'],
      rewards: { '1': 1, '-1': 1, '0': 1 },
      judged: { 'next_state:user': 1, 'eval:1': 1 },
      correlation: { bound: 3, tagged: 3 },
    });
    expect(rewardSplit([])).toEqual({ '1': 0, '-1': 0, '0': 0 });
    expect(batchId('my.scn', 12)).toBe('my.scn:openclawrl:12');
  });
});
