import * as fs from 'node:fs';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import type { AgentRecord } from '../../actors/gateway/store/types.js';
import { parseArgs } from '../args.js';
import type { Io } from '../cli.js';
import { exportCommand, recordFromJson, recordToJson, WRITE_CHARS } from './export.js';

/** The size of every text the export handed to write (a write at offset 0 starts one). */
const handed: number[] = [];

// write(2) may write less than it was asked to without an error (a file size limit, a disk filling
// up); this one always does, at most 1000 bytes a call.
vi.mock('node:fs', async (importOriginal) => {
  const real = await importOriginal<typeof fs>();
  const writeSync = (fd: number, data: string | NodeJS.ArrayBufferView, offset?: number, length?: number) => {
    const bytes = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    const from = typeof data === 'string' ? 0 : (offset ?? 0);
    const upTo = typeof data === 'string' || length === undefined ? bytes.length : from + length;
    if (from === 0) handed.push(upTo);
    return real.writeSync(fd, bytes, from, Math.min(1000, upTo - from));
  };
  return { ...real, writeSync };
});

describe('reef export lines', () => {
  it('read back every logprob as recorded: a missing one (NaN) does not come back as a masked one (-Infinity)', () => {
    const base = sampleRecord(1, { outputTokens: 3, topK: 2 });
    // The gateway records NaN where the engine gave no logprob for a token, -Infinity for a masked candidate.
    const record = {
      ...base, id: '01ARZ3NDEKTSV4RRFFQ69G5FAV', offset: 1,
      logprobs: Float32Array.from([Number.NaN, -0.5, Number.NEGATIVE_INFINITY]),
      topkLogprobs: Float32Array.from([-0.25, Number.NEGATIVE_INFINITY, Number.NaN, Number.POSITIVE_INFINITY, -1, -2]),
    } as AgentRecord;
    const back = recordFromJson(recordToJson(record));
    expect(Array.from(back.logprobs)).toEqual(Array.from(record.logprobs));
    expect(Array.from(back.topkLogprobs)).toEqual(Array.from(record.topkLogprobs));
    expect(Array.from(back.promptIds)).toEqual(Array.from(record.promptIds));
    // A masked candidate stays null, as earlier exports wrote it.
    expect(JSON.parse(recordToJson(record)).topkLogprobs[1]).toBeNull();
  });
});

describe('reef export records --out', () => {
  let dir: string;
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('writes every line when the file takes less than each write offered (it reported all records and kept a cut file)', async () => {
    dir = mkdtempSync(join(tmpdir(), 'reef-export-'));
    const store = SqliteStore.open(join(dir, 'records.sqlite'));
    for (let i = 0; i < 5; i++) await store.append(sampleRecord(i, { promptTokens: 200 }));
    await store.close();
    const out = join(dir, 'out.jsonl');
    const io: Io = { stdout: () => undefined, stderr: () => undefined };
    expect(await exportCommand(parseArgs(['export', 'records', '--scenario', 'default', '--out', out, '--data-dir', dir]), io)).toBe(0);
    const lines = readFileSync(out, 'utf8').split('\n');
    expect(lines.pop()).toBe('');
    expect(lines.map((l) => recordFromJson(l).tags.seed)).toEqual(['0', '1', '2', '3', '4']);
  });

  it('writes a page of long records in pieces of about WRITE_CHARS (a page was one string, past V8\'s longest on long outputs)', async () => {
    dir = mkdtempSync(join(tmpdir(), 'reef-export-'));
    const store = SqliteStore.open(join(dir, 'records.sqlite'));
    // ~0.9 MB of JSON each, all on one page.
    const sample = { outputTokens: 4096, topK: 8 };
    for (let i = 0; i < 12; i++) await store.append(sampleRecord(i, sample));
    await store.close();
    const out = join(dir, 'out.jsonl');
    handed.length = 0;
    expect(await exportCommand(parseArgs(['export', 'records', '--scenario', 'default', '--out', out, '--data-dir', dir]), { stdout: () => undefined, stderr: () => undefined })).toBe(0);
    const lines = readFileSync(out, 'utf8').split('\n');
    expect(lines.pop()).toBe('');
    expect(lines.map((l) => recordFromJson(l).tags.seed)).toEqual(Array.from({ length: 12 }, (_, i) => String(i)));
    const longest = Math.max(...lines.map((l) => Buffer.byteLength(l) + 1));
    expect(handed.length).toBeGreaterThan(1);
    for (const n of handed) expect(n).toBeLessThanOrEqual(WRITE_CHARS + longest);
  });
});
