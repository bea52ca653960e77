import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../../cluster/paths.js';
import { recordDiff } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';
import type { NewRecord } from './types.js';

const root = repoRoot();
const gcScript = join(root, 'test', 'fixtures', 'store-gc.mjs');
const srcDir = join(root, 'actors', 'gateway', 'store');
const distDir = join(root, 'dist', 'actors', 'gateway', 'store');

/** The child runs from dist/ (as production does): rebuild when any store source is newer. */
function ensureBuilt(): void {
  const sources = readdirSync(srcDir).filter((f) => f.endsWith('.ts')).map((f) => join(srcDir, f));
  const newest = Math.max(...sources.map((f) => statSync(f).mtimeMs));
  const built = join(distDir, 'retention.js');
  if (existsSync(built) && statSync(built).mtimeMs >= newest) return;
  const res = spawnSync('npx', ['tsc', '-p', 'tsconfig.json'], { cwd: root, encoding: 'utf8' });
  if (!existsSync(built) || statSync(built).mtimeMs < newest) throw new Error(`build of dist/ failed:\n${res.stdout}\n${res.stderr}`);
}

interface Line {
  event: 'receipt' | 'protected' | 'gc';
  id?: string;
  seed?: number;
  what?: string;
}

/** Runs the probe until it has printed `killAfter` committed retention steps (of kind `what`, if given), then kill -9s it. */
async function gcThenKill(path: string, firstSeed: number, killAfter: number, maxBytes: number | null = null, what: string | null = null): Promise<Line[]> {
  const child = spawn(process.execPath, [gcScript, path, String(firstSeed), ...(maxBytes === null ? [] : [String(maxBytes)])], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<NodeJS.Signals | number | null>((resolve) => child.on('exit', (code, signal) => resolve(signal ?? code)));
  const lines: Line[] = [];
  let steps = 0;
  for await (const text of createInterface({ input: child.stdout })) {
    const line = JSON.parse(text) as Line;
    lines.push(line);
    if (line.event === 'gc' && (what === null || line.what === what) && ++steps === killAfter) child.kill('SIGKILL');
  }
  const how = await exited;
  if (how !== 'SIGKILL') throw new Error(`retention probe ended with ${String(how)} before it was killed:\n${stderr}`);
  return lines;
}

let dir: string;
let gcRecord: (seed: number) => NewRecord;
beforeAll(async () => {
  ensureBuilt();
  ({ gcRecord } = (await import(pathToFileURL(join(root, 'test', 'fixtures', 'store-gc-records.mjs')).href)) as { gcRecord: typeof gcRecord });
  dir = mkdtempSync(join(tmpdir(), 'reef-retention-kill-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('retention under kill -9', () => {
  it('never deletes a chunk a record references, nor a record a consumer may read, wherever it is killed', async () => {
    const path = join(dir, 'r.db');
    const lines: Line[] = [];
    // Kills after the 1st, 5th, 2nd, 9th and 3rd committed step: inside record, report and chunk phases.
    for (const [round, killAfter] of [1, 5, 2, 9, 3].entries()) lines.push(...(await gcThenKill(path, round * 100_000, killAfter)));
    const receipts = lines.filter((l) => l.event === 'receipt');
    expect(lines.filter((l) => l.event === 'gc').length).toBeGreaterThanOrEqual(20);

    const check = new Database(path, { readonly: true });
    expect(check.pragma('integrity_check', { simple: true })).toBe('ok');
    expect(check.pragma('foreign_key_check')).toEqual([]);
    const state = JSON.parse((check.prepare("SELECT value FROM kv WHERE key = 'judge.state'").get() as { value: string }).value) as { correlator: { sessions: { last: string }[] } };
    const below = (check.prepare("SELECT next_offset AS o FROM consumer_offsets WHERE consumer = 'judge'").get() as { o: number }).o;
    check.close();

    const store = SqliteStore.open(path);
    try {
      // Every record still stored reads back whole: none points at a collected chunk.
      const stored = new Map<string, number>();
      for (let from = 0; ; ) {
        const page = await store.readFrom(from, 100);
        if (page.length === 0) break;
        for (const r of page) {
          expect(recordDiff(r, gcRecord(Number(r.tags.seed))), `record ${r.id}`).toEqual([]);
          stored.set(r.id, r.offset);
        }
        from = page[page.length - 1]!.offset + 1;
      }
      // Kept: every recent record, every one the judge has not read, and the turn its state holds.
      for (const r of receipts) {
        if (r.seed! % 2 === 1) expect(stored.has(r.id!), `recent record ${r.id}`).toBe(true);
      }
      expect(stored.has(state.correlator.sessions[0]!.last)).toBe(true);
      const unread = receipts.filter((r) => !stored.has(r.id!));
      // Deleted ones were all old and read by the judge when the last run began (offsets only grow).
      expect(unread.length).toBeGreaterThan(0);
      expect(unread.every((r) => r.seed! % 2 === 0)).toBe(true);
      const head = await store.headOffset();
      expect(head).toBeGreaterThanOrEqual(below);

      // A run to the end leaves no unreferenced chunk, and every record still reads.
      await store.retain({ maxAgeMs: 30 * 86_400_000 }, { now: () => 1_800_000_000_000 });
      const db = (store as unknown as { db: Database.Database }).db;
      const refs = new Set<string>();
      for (const row of db.prepare('SELECT request_chunks AS a, prompt_chunks AS b FROM records').iterate() as Iterable<{ a: Buffer | null; b: Buffer | null }>) {
        for (const list of [row.a, row.b]) for (let o = 0; list !== null && o < list.length; o += 32) refs.add(list.toString('hex', o, o + 32));
      }
      const hashes = db.prepare('SELECT hex(hash) AS h FROM chunks').all() as { h: string }[];
      expect(hashes.filter(({ h }) => !refs.has(h.toLowerCase()))).toEqual([]);
      for (const id of stored.keys()) {
        const r = await store.get(id);
        if (r !== null) expect(recordDiff(r, gcRecord(Number(r.tags.seed)))).toEqual([]);
      }
    } finally {
      await store.close();
    }
  });

  it('under a size bound, never deletes a record the judge has not read nor one its state holds, nor a referenced chunk, wherever it is killed', async () => {
    const path = join(dir, 'size.db');
    const bound = 384 * 1024;
    const lines: Line[] = [];
    // Killed in each phase: after a record deletion, a chunk sweep and a vacuum step.
    for (const [round, [what, killAfter]] of ([['records', 3], ['chunks', 5], ['vacuum', 1], ['records', 8]] as const).entries()) {
      lines.push(...(await gcThenKill(path, round * 100_000, killAfter, bound, what)));
    }
    const steps = lines.filter((l) => l.event === 'gc');
    expect(new Set(steps.map((l) => l.what))).toEqual(new Set(['records', 'chunks', 'vacuum']));
    const receipts = lines.filter((l) => l.event === 'receipt');
    const lastProtected = lines.filter((l) => l.event === 'protected').at(-1)!.id!;

    const check = new Database(path, { readonly: true });
    expect(check.pragma('integrity_check', { simple: true })).toBe('ok');
    expect(check.pragma('auto_vacuum', { simple: true })).toBe(2);
    const below = (check.prepare("SELECT next_offset AS o FROM consumer_offsets WHERE consumer = 'judge'").get() as { o: number }).o;
    const head = (check.prepare('SELECT MAX(seq) AS s FROM records').get() as { s: number }).s;
    // Offsets are never reused, so a record taken at or past the judge's offset would leave a gap.
    expect((check.prepare('SELECT COUNT(*) AS n FROM records WHERE seq >= ?').get(below) as { n: number }).n).toBe(head - below + 1);
    check.close();

    const store = SqliteStore.open(path);
    try {
      const stored = new Set<string>();
      for (let from = 0; ; ) {
        const page = await store.readFrom(from, 100);
        if (page.length === 0) break;
        for (const r of page) {
          expect(recordDiff(r, gcRecord(Number(r.tags.seed))), `record ${r.id}`).toEqual([]);
          stored.add(r.id);
        }
        from = page[page.length - 1]!.offset + 1;
      }
      expect(stored.has(lastProtected)).toBe(true);
      // The size bound took records whatever their age, old and recent alike.
      const gone = receipts.filter((r) => !stored.has(r.id!));
      expect(gone.some((r) => r.seed! % 2 === 0) && gone.some((r) => r.seed! % 2 === 1)).toBe(true);

      // A run to the end brings the store under the bound and leaves no unreferenced chunk.
      const r = await store.retain({ maxBytes: bound });
      expect(r.size!.over).toBeNull();
      expect(r.size!.after).toBeLessThanOrEqual(bound);
      const db = (store as unknown as { db: Database.Database }).db;
      const refs = new Set<string>();
      for (const row of db.prepare('SELECT request_chunks AS a, prompt_chunks AS b FROM records').iterate() as Iterable<{ a: Buffer | null; b: Buffer | null }>) {
        for (const list of [row.a, row.b]) for (let o = 0; list !== null && o < list.length; o += 32) refs.add(list.toString('hex', o, o + 32));
      }
      expect((db.prepare('SELECT hex(hash) AS h FROM chunks').all() as { h: string }[]).filter(({ h }) => !refs.has(h.toLowerCase()))).toEqual([]);
    } finally {
      await store.close();
    }
  });
});
