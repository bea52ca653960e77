import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import Database from 'better-sqlite3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../../cluster/paths.js';
import { recordDiff, sampleRecord } from './fixtures.js';
import { SqliteStore } from './sqlite-store.js';

// Must match SAMPLE in test/fixtures/store-writer.mjs.
const SAMPLE = { scenario: 'durable', promptTokens: 512, outputTokens: 256, topK: 4 };
const root = repoRoot();
const writerScript = join(root, 'test', 'fixtures', 'store-writer.mjs');
const srcDir = join(root, 'actors', 'gateway', 'store');
const distDir = join(root, 'dist', 'actors', 'gateway', 'store');

/** The child runs from dist/ (as production does): rebuild when any store source is newer. */
function ensureBuilt(): void {
  const sources = [...readdirSync(srcDir).filter((f) => f.endsWith('.ts')).map((f) => join(srcDir, f)), join(root, 'actors', 'runtime', 'errors.ts')];
  const newestSrc = Math.max(...sources.map((f) => statSync(f).mtimeMs));
  const built = join(distDir, 'sqlite-store.js');
  if (existsSync(built) && statSync(built).mtimeMs >= newestSrc) return;
  // tsc still emits when other parts of the tree have type errors; what matters here is our output.
  const res = spawnSync('npx', ['tsc', '-p', 'tsconfig.json'], { cwd: root, encoding: 'utf8' });
  if (!existsSync(built) || statSync(built).mtimeMs < newestSrc) {
    throw new Error(`build of dist/ failed:\n${res.stdout}\n${res.stderr}`);
  }
}

interface Receipt {
  id: string;
  offset: number;
  seed: number;
}

/** Starts the writer, collects receipts, and kill -9s it once `killAfter` receipts were printed. */
async function writeThenKill(path: string, firstSeed: number, killAfter: number, durability: string): Promise<Receipt[]> {
  const child = spawn(process.execPath, [writerScript, path, String(firstSeed), durability, '8'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = new Promise<NodeJS.Signals | number | null>((resolve) => child.on('exit', (code, signal) => resolve(signal ?? code)));
  const receipts: Receipt[] = [];
  for await (const line of createInterface({ input: child.stdout })) {
    const msg = JSON.parse(line) as Receipt & { event?: string };
    if (msg.event === 'ready') continue;
    receipts.push(msg);
    if (receipts.length === killAfter) child.kill('SIGKILL');
  }
  const how = await exited;
  if (how !== 'SIGKILL') throw new Error(`writer ended with ${String(how)} before it was killed:\n${stderr}`);
  return receipts;
}

let dir: string;
beforeAll(() => {
  ensureBuilt();
  dir = mkdtempSync(join(tmpdir(), 'reef-durable-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('record store durability (kill -9)', () => {
  for (const durability of ['process', 'power'] as const) {
    it(`keeps every printed receipt, whole, across repeated kills (${durability})`, async () => {
      const path = join(dir, `${durability}.db`);
      const all: Receipt[] = [];
      // Three rounds on the same file: each restart recovers from the WAL the last kill left.
      for (const [round, killAfter] of [150, 40, 300].entries()) {
        all.push(...(await writeThenKill(path, round * 100_000, killAfter, durability)));
      }
      expect(all.length).toBeGreaterThanOrEqual(490);

      const check = new Database(path, { readonly: true });
      expect(check.pragma('integrity_check', { simple: true })).toBe('ok');
      check.close();

      const store = SqliteStore.open(path);
      try {
        for (const r of all) {
          const got = await store.get(r.id);
          expect(got, `receipt ${r.id}`).not.toBeNull();
          expect(got!.offset).toBe(r.offset);
          expect(recordDiff(got!, sampleRecord(r.seed, SAMPLE)), `record ${r.id}`).toEqual([]);
        }
        // No half-written row: everything stored (printed or not) is a complete record.
        let stored = 0;
        let last = 0;
        for (let from = 0; ; ) {
          const batch = await store.readFrom(from, 200);
          if (batch.length === 0) break;
          for (const rec of batch) {
            expect(rec.offset).toBeGreaterThan(last);
            last = rec.offset;
            expect(recordDiff(rec, sampleRecord(Number(rec.tags.seed), SAMPLE)), `record ${rec.id}`).toEqual([]);
          }
          stored += batch.length;
          from = last + 1;
        }
        expect(stored).toBeGreaterThanOrEqual(all.length);
      } finally {
        await store.close();
      }
    });
  }
});
