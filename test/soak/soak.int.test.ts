import { appendFileSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import { STATE_KEY } from '../../actors/trainer-controller/messages.js';
import type { ControllerState, Release } from '../../actors/trainer-controller/controller.js';
import { readReleases, RELEASE_PREFIX } from '../../actors/trainer-controller/releases.js';
import { checkSoak, type SoakFiles } from '../../bench/soak/check.js';
import { runSoak, summaryLines, type SoakResult } from '../../bench/soak/soak.js';

/**
 * A short kill -9 soak (bench/soak; `npm run soak` runs the long one): a real stack on the tiny
 * model with the rule PRM double, four sessions, and each of gateway, judge, a PRM actor,
 * trainer-controller and shim killed once. Then the checker on copies of its files, each broken
 * one way, must name what broke: a checker that passes everything would pass the soak too.
 */

describe('kill -9 soak (short)', () => {
  let result: SoakResult;
  const lines: string[] = [];
  const copies: string[] = [];

  beforeAll(async () => {
    // Kills 4–7 s apart over 40 s: the five kinds (one seeded shuffled round) by 35 s at the latest.
    // Two sessions: with four the load made about 130 turns, whose drain after the last kill took
    // 125 of the file's 185 s; two still cross every kill with requests in flight (npm run soak
    // runs four by default).
    result = await runSoak({ minutes: 40 / 60, seed: 3, sessions: 2, streamed: 0.5, killEveryS: { min: 4, max: 7 }, kinds: ['gateway', 'judge', 'prm', 'trainer-controller', 'shim'], batchSize: 2, drainS: 240, log: (l) => lines.push(l) });
  }, 900_000);

  afterAll(() => {
    for (const d of [...copies, ...(result ? [result.dir] : [])]) rmSync(d, { recursive: true, force: true });
  });

  /** A copy of the soak's files to break; the stack is down, so the store's files are at rest. */
  const copy = (): SoakFiles & { dir: string } => {
    const dir = mkdtempSync(join(tmpdir(), 'reef-soak-copy-'));
    copies.push(dir);
    cpSync(result.dir, dir, { recursive: true });
    return { dir, dataDir: join(dir, 'data'), receiptLog: join(dir, 'receipts.jsonl'), recordFile: join(dir, 'prm-records.jsonl') };
  };

  it('holds every invariant after killing each kind once', () => {
    const why = [...lines.slice(-40), ...summaryLines(result)].join('\n');
    expect(result.violations, why).toEqual([]);
    expect(Object.keys(result.chaos.kills).sort(), why).toEqual(['gateway', 'judge', 'prm', 'shim', 'trainer-controller']);
    expect(result.drained, why).toBe(true);
    expect(result.counts.receipts, why).toBeGreaterThan(0);
    expect(result.counts.records, why).toBeGreaterThanOrEqual(result.counts.receipts);
    expect(result.counts.judged, why).toBeGreaterThan(0);
    // Trained turns make the checks 3-5 below mean something.
    expect(result.counts.batches, why).toBeGreaterThan(0);
    expect(result.counts.releases).toBe(result.counts.batches);
    expect(result.counts.ledgerEntries).toBe(result.counts.batches);
  });

  it('the checker finds a receipt whose record is gone', async () => {
    const c = copy();
    const receipt = (JSON.parse(readFileSync(c.receiptLog, 'utf8').split('\n')[0]!) as { id: string }).id;
    const db = new Database(join(c.dataDir, 'records.sqlite'));
    // Its judgment rows name it too; the point is a store that lost a record, not a consistent delete.
    db.pragma('foreign_keys = OFF');
    expect(db.prepare('DELETE FROM records WHERE id = ?').run(receipt).changes).toBe(1);
    db.close();
    const r = await checkSoak(c);
    expect(r.violations).toEqual([`receipts the store does not have: 1 (${receipt})`]);
  });

  it('the checker finds a turn trained by two batches', async () => {
    const c = copy();
    const first = JSON.parse(readFileSync(c.recordFile, 'utf8').split('\n')[0]!) as { batch_id: string; turns: string[]; run: string };
    appendFileSync(c.recordFile, `${JSON.stringify({ ...first, batch_id: 'default:openclawrl:999', turns: [first.turns[0]] })}\n`);
    const r = await checkSoak(c);
    expect(r.violations).toEqual([
      'record lines of batches never released: 1 (default:openclawrl:999)',
      `turns trained by more than one batch: 1 (${first.turns[0]} in ${first.batch_id} and default:openclawrl:999)`,
    ]);
  });

  it('the checker finds a checkpoint that no release names', async () => {
    const c = copy();
    mkdirSync(join(c.dataDir, 'checkpoints', 'v999'));
    const r = await checkSoak(c);
    expect(r.violations).toEqual(['checkpoints no release names: 1 (v999)']);
  });

  it('the checker finds a release without its ledger entry, and a current release without its checkpoint', async () => {
    const c = copy();
    const ledgerPath = join(c.dataDir, 'checkpoints', 'reef_trainer_ledger.json');
    const ledger = JSON.parse(readFileSync(ledgerPath, 'utf8')) as { batches: Record<string, unknown> };
    const [dropped] = Object.keys(ledger.batches);
    delete ledger.batches[dropped!];
    writeFileSync(ledgerPath, JSON.stringify(ledger));
    // The current release, as the controller saved it, with its checkpoint removed from the copy.
    const store = SqliteStore.open(join(c.dataDir, 'records.sqlite'));
    const current = (await readReleases(store)).at(-1)!;
    const moved = current.checkpointPath.replace(result.dir, c.dir);
    const move = (r: Release): Release => ({ ...r, checkpointPath: r.checkpointPath.replace(result.dir, c.dir) });
    // The rows, which the checker reads, and the newest releases in the state, as the controller keeps them.
    for (const [key, r] of await store.statesWithPrefix(RELEASE_PREFIX)) await store.putState(key, move(r as Release));
    const state = (await store.getState(STATE_KEY)) as ControllerState;
    await store.putState(STATE_KEY, { ...state, recentReleases: state.recentReleases.map(move) });
    await store.close();
    rmSync(moved, { recursive: true });
    const r = await checkSoak(c);
    expect(r.violations).toEqual([`releases with no ledger entry: 1 (${dropped})`, `the current release ${current.id} (${current.weightVersion}) has no checkpoint at ${moved}`]);
  });
});
