import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import type { NewRecord } from '../../actors/gateway/store/types.js';
import { asst, sys, user, type Msg } from '../../actors/judge/correlate/fixtures.js';
import { parseArgs } from '../args.js';
import { type CorrelateReport, correlateCommand } from './correlate.js';
import { exportCommand, recordFromJson } from './export.js';

const S = sys('You are a helpful agent.');
let dir: string;

function record(seed: number, messages: Msg[], reply: string, tags: Record<string, string> = {}, scenario = 'demo'): NewRecord {
  const base = sampleRecord(seed, { scenario });
  return { ...base, tags, request: { ...base.request, messages }, response: asst(reply), startedAt: 1_700_000_000_000 + seed, finishedAt: 1_700_000_000_000 + seed * 1000 };
}

function capture(): { io: { stdout: (s: string) => void; stderr: (s: string) => void }; out: string[]; err: string[] } {
  const out: string[] = [];
  const err: string[] = [];
  return { io: { stdout: (s) => out.push(s), stderr: (s) => err.push(s) }, out, err };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'reef-correlate-'));
  const store = SqliteStore.open(join(dir, 'records.sqlite'));
  try {
    // A tagged conversation, an untagged chain, an untagged request that binds nothing, and
    // another scenario's record that the export must leave out.
    const recs = [
      record(1, [S, user('hi')], 'hello', { session: 'a' }),
      record(2, [S, user('plan a trip')], 'where to?'),
      record(3, [S, user('hi'), asst('hello'), user('2+2?')], '4', { session: 'a' }),
      record(4, [S, user('plan a trip'), asst('where to?'), user('Lisbon')], 'ok: Lisbon', {}),
      record(5, [sys('other'), user('x')], 'y', { session: 'z' }, 'other'),
      record(6, [S, user('hi'), asst('hello'), user('2+2?'), asst('4'), user('no, 5')], 'sorry', { session: 'a' }),
      record(7, [S, user('unrelated')], 'fine', {}),
    ];
    for (const r of recs) await store.append(r);
  } finally {
    await store.close();
  }
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('reef export records + reef correlate', () => {
  it('exports a scenario as JSON lines with payload arrays, then correlates them', async () => {
    const file = join(dir, 'demo.jsonl');
    const ex = capture();
    expect(await exportCommand(parseArgs(['export', 'records', '--scenario', 'demo', '--out', file, '--data-dir', dir]), ex.io)).toBe(0);
    const lines = readFileSync(file, 'utf8').trim().split('\n');
    expect(lines).toHaveLength(6);
    const first = recordFromJson(lines[0]!);
    const expected = sampleRecord(1, { scenario: 'demo' });
    expect(Array.from(first.promptIds)).toEqual(Array.from(expected.promptIds));
    expect(Array.from(first.topkLogprobs)).toEqual(Array.from(expected.topkLogprobs));
    expect(first.topkLogprobs[first.topkLogprobs.length - 1]).toBe(-Infinity);
    expect(JSON.parse(lines[0]!).offset).toBe(1);

    const co = capture();
    expect(await correlateCommand(parseArgs(['correlate', file, '--json']), co.io)).toBe(0);
    const report = JSON.parse(co.out.join('\n')) as CorrelateReport;
    expect(report.records).toBe(6);
    expect(report.counters).toEqual({ tagged: 3, untagged: 3, bound: 3, dropped_unbound: 0, evicted: 0, retries: 0, side: 0, ended: 0 });
    const byKey = Object.fromEntries(report.sessions.map((s) => [s.key, s]));
    expect(Object.keys(byKey)).toHaveLength(3);
    expect(byKey['tag:a']!.turns.map((t) => t.content)).toEqual(['2+2?', 'no, 5']);
    const chains = report.sessions.filter((s) => s.key.startsWith('chain:'));
    expect(chains.map((s) => s.turns.map((t) => t.content))).toEqual([['Lisbon'], []]);
    expect(report.warnings.map((w) => w.code)).toEqual(['untagged-traffic']);

    const text = capture();
    expect(await correlateCommand(parseArgs(['correlate', file]), text.io)).toBe(0);
    expect(text.out.join('\n')).toMatch(/session tag:a \(scenario demo, open\): 3 requests, 2 bound turns/);
    expect(text.out.join('\n')).toContain('counters: tagged=3 untagged=3 bound=3');
  });

  it('says what is wrong: no store, no scenario, bad lines, bad usage', async () => {
    const c = capture();
    await expect(exportCommand(parseArgs(['export', 'records', '--scenario', 'demo', '--data-dir', join(dir, 'nope')]), c.io)).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    await expect(exportCommand(parseArgs(['export', 'records', '--scenario', 'absent', '--data-dir', dir]), c.io)).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    expect(await exportCommand(parseArgs(['export', 'records', '--data-dir', dir]), c.io)).toBe(2);
    // A failed export leaves the file it would have replaced as it was, and nothing beside it.
    const earlier = join(dir, 'earlier.jsonl');
    writeFileSync(earlier, 'kept\n');
    await expect(exportCommand(parseArgs(['export', 'records', '--scenario', 'absent', '--out', earlier, '--data-dir', dir]), c.io)).rejects.toMatchObject({ code: 'REEF_ERR_NOT_FOUND' });
    expect(readFileSync(earlier, 'utf8')).toBe('kept\n');
    expect(readdirSync(dir).filter((f) => f.startsWith('earlier.jsonl'))).toEqual(['earlier.jsonl']);
    expect(await correlateCommand(parseArgs(['correlate']), c.io)).toBe(2);
    await expect(correlateCommand(parseArgs(['correlate', join(dir, 'records.sqlite')]), c.io)).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT' });
    // It failed with a bare EISDIR.
    await expect(correlateCommand(parseArgs(['correlate', dir]), c.io)).rejects.toMatchObject({ code: 'REEF_ERR_INVALID_ARGUMENT', message: expect.stringContaining(`${dir} is not a file`) });
  });

  // The correlator takes a whole number of sessions; 2.5 reached it and threw a RangeError, which
  // the CLI printed as a crash with its stack instead of naming the flag. A bad value is a usage
  // error (exit 2), as an unknown flag is; it exited 1.
  it.each([
    ['--max-open-sessions=2.5', '--max-open-sessions must be an integer >= 1, got 2.5'],
    ['--max-open-sessions=Infinity', '--max-open-sessions must be an integer >= 1, got Infinity'],
    ['--max-open-sessions=0x10', '--max-open-sessions must be an integer >= 1, got 0x10'],
    ['--session-ttl-s=0', '--session-ttl-s must be a positive number, got 0'],
    ['--session-ttl-s=0x10', '--session-ttl-s must be a positive number, got 0x10'],
  ])('refuses %s, naming the flag', async (flag, message) => {
    const file = join(dir, 'flags.jsonl');
    writeFileSync(file, `${JSON.stringify({ id: 'r1', scenario: 'demo', status: 'ok', finishedAt: 0, request: { messages: [user('hi')] }, response: asst('hello') })}\n`);
    const c = capture();
    expect(await correlateCommand(parseArgs(['correlate', file, flag]), c.io)).toBe(2);
    expect(c.err.join('\n')).toContain(`reef: REEF_ERR_INVALID_ARGUMENT: ${message}`);
  });

  it('takes whole and fractional values where they make sense', async () => {
    const file = join(dir, 'flags-ok.jsonl');
    writeFileSync(file, `${JSON.stringify({ id: 'r1', scenario: 'demo', status: 'ok', finishedAt: 0, request: { messages: [user('hi')] }, response: asst('hello') })}\n`);
    const c = capture();
    expect(await correlateCommand(parseArgs(['correlate', file, '--max-open-sessions=1e3', '--session-ttl-s=2.5', '--json']), c.io)).toBe(0);
    expect(JSON.parse(c.out.join('\n')).records).toBe(1);
  });

  it('writes to stdout without --out', async () => {
    const c = capture();
    expect(await exportCommand(parseArgs(['export', 'records', '--scenario', 'other', '--data-dir', dir]), c.io)).toBe(0);
    expect(c.out.map((l) => JSON.parse(l).tags)).toEqual([{ session: 'z' }]);
  });
});
