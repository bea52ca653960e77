import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { recordDiff, sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';

let dir: string;
let store: SqliteStore;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'reef-store-'));
  store = SqliteStore.open(join(dir, 'records.db'));
});
afterEach(async () => {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('SqliteStore records', () => {
  it('round-trips every field, token arrays bit for bit', async () => {
    const input = sampleRecord(3, { promptTokens: 300, outputTokens: 200, topK: 4 });
    const receipt = await store.append(input);
    const got = await store.get(receipt.id);
    expect(got).not.toBeNull();
    expect(recordDiff(got!, input)).toEqual([]);
    expect(got!.id).toBe(receipt.id);
    expect(got!.offset).toBe(receipt.offset);
    expect(got!.topkLogprobs[got!.topkLogprobs.length - 1]).toBe(-Infinity);
    expect(got!.topkIds).toHaveLength(200 * 4);
  });

  it('keeps a caller-supplied id and stores records with no top-K', async () => {
    const input = { ...sampleRecord(1, { topK: 0 }), id: '01ARZ3NDEKTSV4RRFFQ69G5FAV' };
    const receipt = await store.append(input);
    expect(receipt.id).toBe('01ARZ3NDEKTSV4RRFFQ69G5FAV');
    const got = await store.get(receipt.id);
    expect(recordDiff(got!, input)).toEqual([]);
    expect(got!.topkIds).toHaveLength(0);
  });

  it('takes the request already serialised, as text or UTF-8 bytes, and reads it back as the object', async () => {
    const input = sampleRecord(7);
    const request = { messages: [{ role: 'user', content: 'héllo 👋 "quoted"' }], tools: null, params: { max_tokens: 3 } };
    const asText = await store.append({ ...input, request: JSON.stringify(request) });
    const asBytes = await store.append({ ...input, request: new TextEncoder().encode(JSON.stringify(request)) });
    for (const { id } of [asText, asBytes]) expect((await store.get(id))!.request).toEqual(request);
    for (const bad of ['{"prompt": "x"}', new TextEncoder().encode('[1, 2]')]) {
      await expect(store.append({ ...input, request: bad })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringMatching(/record\.request/) });
    }
  });

  it('stores a chat-completion body as received and reads it back split as the gateway split it', async () => {
    const input = sampleRecord(7);
    const body = {
      model: 'tiny', stream: true, temperature: 0.5, stream_options: { include_usage: true }, x_unknown: [1],
      messages: [{ role: 'system', content: 'héllo 👋 "quoted"' }, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c1', content: [{ type: 'text', text: 'ok' }] }],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }],
    };
    const raw = new TextEncoder().encode(`  \n${JSON.stringify(body)}`);
    const { id } = await store.append({ ...input, request: { chatBody: raw } });
    const { messages, tools, ...params } = body;
    // The schema's one default: a tool call without `type` is a function call.
    const wantMessages = structuredClone(messages);
    (wantMessages[1]!.tool_calls![0] as Record<string, unknown>).type = 'function';
    expect((await store.get(id))!.request).toEqual({ messages: wantMessages, tools, params });
    expect((await store.list({ scenario: input.scenario })).items[0]!.request).toEqual({ messages: wantMessages, tools, params });
    // A byte-order mark, which the gateway's decoder drops, is dropped on reading too.
    const bom = await store.append({ ...input, request: { chatBody: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"messages": [{"role": "user", "content": "hi"}]}')]) } });
    expect((await store.get(bom.id))!.request.messages).toEqual([{ role: 'user', content: 'hi' }]);
    const bomThenSpace = await store.append({ ...input, request: { chatBody: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('\n {"messages": [{"role": "user", "content": "hi"}]}')]) } });
    expect((await store.get(bomThenSpace.id))!.request.messages).toEqual([{ role: 'user', content: 'hi' }]);
    // JSON allows any amount of whitespace first; the shape check looked at 64 bytes only.
    const longSpace = await store.append({ ...input, request: { chatBody: Buffer.from(`${' \t\r\n'.repeat(40)}{"messages": [{"role": "user", "content": "hi"}]}`) } });
    expect((await store.get(longSpace.id))!.request.messages).toEqual([{ role: 'user', content: 'hi' }]);
    // Without tools, `tools` reads as null, as for requests stored as {messages, tools, params}.
    const bare = await store.append({ ...input, request: { chatBody: new TextEncoder().encode('{"messages": [{"role": "user", "content": "hi"}]}') } });
    expect((await store.get(bare.id))!.request).toEqual({ messages: [{ role: 'user', content: 'hi' }], tools: null, params: {} });
    for (const bad of [new TextEncoder().encode('[1, 2]'), 'not bytes', new TextEncoder().encode(' '.repeat(100)), new Uint8Array(0)]) {
      await expect(store.append({ ...input, request: { chatBody: bad as Uint8Array } })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringMatching(/record\.request\.chatBody/) });
    }
  });

  it('rejects a duplicate id with REEF_ERR_CONFLICT without failing its batch neighbours', async () => {
    const first = await store.append(sampleRecord(1));
    const results = await Promise.allSettled([
      store.append(sampleRecord(2)),
      store.append({ ...sampleRecord(3), id: first.id }),
      store.append(sampleRecord(4)),
    ]);
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((results[1] as PromiseRejectedResult).reason.code).toBe('REEF_ERR_CONFLICT');
    expect(store.stats().failedAppends).toBe(1);
  });

  it('rejects inconsistent records with REEF_ERR_INVALID_ARGUMENT naming the field', async () => {
    const r = sampleRecord(1, { outputTokens: 8, topK: 4 });
    await expect(store.append({ ...r, logprobs: new Float32Array(7) })).rejects.toMatchObject({
      code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('logprobs'),
    });
    await expect(store.append({ ...r, topkIds: new Int32Array(31) })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    await expect(store.append({ ...r, promptIds: [1, 2] as unknown as Int32Array })).rejects.toMatchObject({
      message: expect.stringContaining('promptIds'),
    });
    await expect(store.append({ ...r, scenario: 'Bad Name' })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    await expect(store.append({ ...r, id: 'not-an-id' })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    for (const keyId of ['', 'has space', undefined]) {
      await expect(store.append({ ...r, keyId: keyId as unknown as string })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('keyId') });
    }
    expect(await store.headOffset()).toBe(0);
  });

  it('rejects what the row cannot hold as REEF_ERR_INVALID_ARGUMENT, not as a failed commit (fractional times, a tag list, a response JSON cannot write)', async () => {
    const r = sampleRecord(1);
    for (const [field, bad] of [
      ['startedAt', { startedAt: r.startedAt + 0.5 }],
      ['finishedAt', { finishedAt: 1e300 }],
      ['tags', { tags: ['a'] as unknown as Record<string, string> }],
      ['response', { response: { n: 1n } }],
      ['response', { response: () => 1 }],
    ] as const) {
      await expect(store.append({ ...r, ...bad })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining(field) });
    }
    expect(store.stats().commits).toBe(0);
    expect(await store.headOffset()).toBe(0);
  });

  it('refuses a value JSON cannot write (a BigInt, as msgpack decodes an integer past 2^53; a cycle) with REEF_ERR_INVALID_ARGUMENT, not a bare TypeError', async () => {
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    const { id } = await store.append(sampleRecord(1));
    const turn = { turnRecordId: id, nextStateRecordId: id, scenario: 'default', sessionKey: 's', decision: 'anchor' as const, reward: 1, teacherCandidates: [null] };
    const report = { scenario: 'default', score: 1, feedback: null, references: [], metadata: null, clientId: null, keyId: null };
    for (const bad of [10n ** 20n, cycle]) {
      const wrapped = { n: bad };
      for (const attempt of [
        store.putState('k', wrapped),
        store.commitConsumer('c', 1, 'k', wrapped),
        store.putJudgment(id, wrapped),
        store.appendJudgedTurn({ ...turn, judgment: wrapped }),
        store.putReport({ ...report, metadata: wrapped }),
        store.putReport({ ...report, feedback: wrapped }),
        store.append({ ...sampleRecord(2), request: { messages: [wrapped], tools: null, params: {} } }),
      ]) {
        await expect(attempt).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringMatching(/JSON-serialisable/) });
      }
    }
    // Nothing was written.
    expect(await store.getState('k')).toBeNull();
    expect(await store.getOffset('c')).toBe(0);
    expect(await store.judgedHeadOffset()).toBe(0);
    expect(await store.headOffset()).toBe(1);
  });

  it('records aborted and failed streams whole, with their status and reason', async () => {
    const aborted = await store.markAborted({ ...sampleRecord(5), finishReason: null }, 'client disconnected');
    const failed = await store.markFailed(sampleRecord(6, { outputTokens: 0 }), 'engine returned 500');
    const a = await store.get(aborted.id);
    const f = await store.get(failed.id);
    expect([a!.status, a!.error, a!.finishReason]).toEqual(['aborted', 'client disconnected', null]);
    expect([f!.status, f!.error, f!.outputIds.length]).toEqual(['failed', 'engine returned 500', 0]);
  });

  it('assigns strictly increasing offsets in commit order and reads them back by offset', async () => {
    const receipts = [];
    for (let i = 0; i < 5; i++) receipts.push(await store.append(sampleRecord(i)));
    receipts.push(...(await Promise.all([10, 11, 12].map((s) => store.append(sampleRecord(s))))));
    const offsets = receipts.map((r) => r.offset);
    expect(offsets[0]).toBe(1);
    for (let i = 1; i < offsets.length; i++) expect(offsets[i]).toBeGreaterThan(offsets[i - 1]!);
    expect(await store.headOffset()).toBe(offsets[offsets.length - 1]);

    const firstTwo = await store.readFrom(0, 2);
    expect(firstTwo.map((r) => r.id)).toEqual(receipts.slice(0, 2).map((r) => r.id));
    const rest = await store.readFrom(firstTwo[1]!.offset + 1, 100);
    expect(rest.map((r) => r.id)).toEqual(receipts.slice(2).map((r) => r.id));
    expect(recordDiff(rest[rest.length - 1]!, sampleRecord(12))).toEqual([]);
    expect(await store.readFrom(offsets[offsets.length - 1]! + 1, 10)).toEqual([]);
  });

  it('lists one scenario page by page, both directions, without token payloads', async () => {
    const mine: string[] = [];
    for (let i = 0; i < 7; i++) {
      mine.push((await store.append(sampleRecord(i, { scenario: 'a' }))).id);
      await store.append(sampleRecord(100 + i, { scenario: 'b' }));
    }
    const seen: string[] = [];
    let after: string | null = null;
    let pages = 0;
    do {
      const page = await store.list({ scenario: 'a', after, limit: 3 });
      seen.push(...page.items.map((s) => s.id));
      expect(page.items.every((s) => !('outputIds' in s) && s.scenario === 'a')).toBe(true);
      after = page.next;
      pages += 1;
    } while (after !== null);
    expect(seen).toEqual(mine);
    expect(pages).toBe(3);

    const newest = await store.list({ scenario: 'a', limit: 4, order: 'desc' });
    expect(newest.items.map((s) => s.id)).toEqual([...mine].reverse().slice(0, 4));
    const older = await store.list({ scenario: 'a', limit: 4, order: 'desc', after: newest.next });
    expect(older.items.map((s) => s.id)).toEqual([...mine].reverse().slice(4));
    expect(older.next).toBeNull();
    expect((await store.list({ scenario: 'nobody' })).items).toEqual([]);
    await expect(store.list({ scenario: 'a', after: 'garbage' })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
  });

  it('ends a page of summaries at its byte budget, whatever the limit, and the next page goes on from there', async () => {
    const small = SqliteStore.open(join(dir, 'paged.db'), { pageBytes: 4000 });
    try {
      const ids: string[] = [];
      // Each request ~1.5 KB of JSON: a budget of 4,000 characters ends a page after three of them.
      for (let i = 0; i < 7; i++) {
        const r = sampleRecord(i, { scenario: 'big' });
        ids.push((await small.append({ ...r, request: { ...r.request, messages: [{ role: 'user', content: 'x'.repeat(1500) }] } })).id);
      }
      const sizes: number[] = [];
      const seen: string[] = [];
      let after: string | null = null;
      do {
        const page = await small.list({ scenario: 'big', after, limit: 100 });
        sizes.push(page.items.length);
        seen.push(...page.items.map((s) => s.id));
        after = page.next;
      } while (after !== null);
      expect(sizes).toEqual([3, 3, 1]);
      expect(seen).toEqual(ids);
      // A single record over the budget still makes a page of one.
      expect((await small.list({ scenario: 'big', limit: 100, order: 'desc' })).items).toHaveLength(3);
      const one = SqliteStore.open(join(dir, 'paged.db'), { pageBytes: 10 });
      try {
        expect((await one.list({ scenario: 'big', limit: 100 })).items).toHaveLength(1);
      } finally {
        await one.close();
      }
    } finally {
      await small.close();
    }
  });

  it('refuses an order other than asc or desc, for records and reports alike (reports threw a TypeError, records listed oldest first)', async () => {
    const order = 'DESC' as 'desc';
    await expect(store.list({ scenario: 'a', order })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('order') });
    await expect(store.listReports({ scenario: 'a', order })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining('order') });
    expect((await store.listReports({ scenario: 'a', order: 'desc' })).items).toEqual([]);
  });

  it('returns null for an unknown id', async () => {
    expect(await store.get('01ARZ3NDEKTSV4RRFFQ69G5FAV')).toBeNull();
  });
});

describe('SqliteStore scenarios', () => {
  it('validates names', async () => {
    for (const good of ['a', '0', 'my-app.v2_test', 'x'.repeat(64)]) {
      await expect(store.createScenario(good)).resolves.toMatchObject({ name: good });
    }
    for (const bad of ['', '-a', '.a', 'A', 'a b', 'a/b', 'x'.repeat(65), 'é']) {
      await expect(store.createScenario(bad)).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    }
  });

  it('creates, refuses duplicates with 409, ensures idempotently and lists by name', async () => {
    const made = await store.createScenario('shop', 'the shop agent');
    expect(made).toMatchObject({ name: 'shop', description: 'the shop agent' });
    await expect(store.createScenario('shop')).rejects.toMatchObject({ code: 'REEF_ERR_CONFLICT', status: 409 });
    expect(await store.ensureScenario('shop', 'ignored')).toEqual(made);
    await store.append(sampleRecord(1, { scenario: 'auto' }));
    expect((await store.listScenarios()).map((s) => s.name)).toEqual(['auto', 'shop']);
    expect(await store.getScenario('none')).toBeNull();
  });
});

describe('SqliteStore consumer state', () => {
  it('keeps offsets, state and judgments across a reopen', async () => {
    const { id } = await store.append(sampleRecord(1));
    expect(await store.getOffset('judge')).toBe(0);
    await store.setOffset('judge', 2);
    await store.commitConsumer('trainer', 7, 'trainer/state', { pending: ['x'], n: 3 });
    await store.putState('judge/sessions', { open: 2 });
    await store.putJudgment(id, { reward: 1, votes: [1, 1, -1] });
    await store.close();

    store = SqliteStore.open(join(dir, 'records.db'));
    expect(await store.getOffset('judge')).toBe(2);
    expect(await store.getOffset('trainer')).toBe(7);
    expect(await store.getState('trainer/state')).toEqual({ pending: ['x'], n: 3 });
    expect(await store.getState('judge/sessions')).toEqual({ open: 2 });
    expect(await store.getJudgment(id)).toEqual({ reward: 1, votes: [1, 1, -1] });
    await store.deleteState('judge/sessions');
    expect(await store.getState('judge/sessions')).toBeNull();
  });

  it('reads parts of a saved state by JSON path, and when it was written', async () => {
    expect(await store.getStateFields('judge/state', ['$.counters'])).toBeNull();
    expect(await store.stateUpdatedAt('judge/state')).toBeNull();
    const before = Date.now();
    const state = { correlator: { counters: { tagged: 3 }, sessions: { a: { text: 'x'.repeat(1000) } } }, counters: { judged: 2 }, name: 'é "q"', list: [{ v: 'v1' }, { v: 'v2' }] };
    await store.commitConsumer('judge', 4, 'judge/state', state);
    const got = await store.getStateFields('judge/state', ['$.correlator.counters', '$.counters', '$.nothing', '$.name', '$.list', '$.list[#-1].v']);
    expect(got?.values).toEqual([{ tagged: 3 }, { judged: 2 }, null, 'é "q"', [{ v: 'v1' }, { v: 'v2' }], 'v2']);
    expect(got!.updatedAt).toBeGreaterThanOrEqual(before);
    expect(await store.stateUpdatedAt('judge/state')).toBe(got!.updatedAt);
    // Statements are kept per path count: a second call with other paths reads those.
    expect((await store.getStateFields('judge/state', ['$.counters.judged', '$.correlator.counters.tagged']))?.values).toEqual([2, 3]);
    await expect(store.getStateFields('judge/state', ['counters'])).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
  });

  it('commitConsumer writes both or neither', async () => {
    await store.commitConsumer('judge', 3, 'judge/state', { v: 1 });
    await expect(store.commitConsumer('judge', 9, 'judge/state', undefined)).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    await expect(store.commitConsumer('judge', -1, 'judge/state', { v: 2 })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    expect(await store.getOffset('judge')).toBe(3);
    expect(await store.getState('judge/state')).toEqual({ v: 1 });
  });

  it('commitConsumer writes and deletes other state rows in the same transaction, and statesWithPrefix reads them back by prefix', async () => {
    await store.commitConsumer('judge', 1, 'judge/state', { v: 1 }, { put: [['judge/pending/a', { n: 1 }], ['judge/pending/b', { n: 2 }], ['judge/pendingx', 0], ['other', 0]], delete: [] });
    expect(await store.statesWithPrefix('judge/pending/')).toEqual([['judge/pending/a', { n: 1 }], ['judge/pending/b', { n: 2 }]]);
    await store.commitConsumer('judge', 2, 'judge/state', { v: 2 }, { put: [['judge/pending/c', { n: 3 }]], delete: ['judge/pending/a'] });
    expect(await store.statesWithPrefix('judge/pending/')).toEqual([['judge/pending/b', { n: 2 }], ['judge/pending/c', { n: 3 }]]);
    // A row that cannot be written fails the whole commit: offset, state and rows stay as they were.
    await expect(store.commitConsumer('judge', 3, 'judge/state', { v: 3 }, { put: [['judge/pending/d', 1n]], delete: ['judge/pending/b'] })).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    expect(await store.getOffset('judge')).toBe(2);
    expect(await store.getState('judge/state')).toEqual({ v: 2 });
    expect((await store.statesWithPrefix('judge/pending/')).map(([k]) => k)).toEqual(['judge/pending/b', 'judge/pending/c']);
  });

  it('refuses a judgment for an unknown record', async () => {
    await expect(store.putJudgment('01ARZ3NDEKTSV4RRFFQ69G5FAV', {})).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
  });

  it('is closed after close(), which is idempotent', async () => {
    await store.close();
    await store.close();
    await expect(store.append(sampleRecord(1))).rejects.toMatchObject({ code: 'REEF_ERR_STORE_CLOSED', retryable: true });
    await expect(store.getOffset('x')).rejects.toMatchObject({ code: 'REEF_ERR_STORE_CLOSED' });
    store = SqliteStore.open(join(dir, 'records.db'));
  });

  it('answers a second close() made while the first is under way only once the file is closed', async () => {
    await store.append(sampleRecord(1)); // starts the checkpoint worker, which the first close() waits for
    const db = (store as unknown as { db: { open: boolean } }).db;
    const first = store.close();
    await store.close();
    expect(db.open).toBe(false);
    await first;
    store = SqliteStore.open(join(dir, 'records.db'));
  });
});
