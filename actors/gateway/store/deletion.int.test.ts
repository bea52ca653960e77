import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../../cluster/paths.js';
import { SqliteStore } from './sqlite-store.js';

const root = repoRoot();
const probe = join(root, 'test', 'fixtures', 'store-delete.mjs');
const srcDir = join(root, 'actors', 'gateway', 'store');
const distDir = join(root, 'dist', 'actors', 'gateway', 'store');

/** The child runs from dist/ (as production does): rebuild when any store source is newer. */
function ensureBuilt(): void {
  const sources = readdirSync(srcDir).filter((f) => f.endsWith('.ts')).map((f) => join(srcDir, f));
  const newest = Math.max(...sources.map((f) => statSync(f).mtimeMs));
  const built = join(distDir, 'deletion.js');
  if (existsSync(built) && statSync(built).mtimeMs >= newest) return;
  const res = spawnSync('npx', ['tsc', '-p', 'tsconfig.json'], { cwd: root, encoding: 'utf8' });
  if (!existsSync(built) || statSync(built).mtimeMs < newest) throw new Error(`build of dist/ failed:\n${res.stdout}\n${res.stderr}`);
}

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('deletion on request, killed midway', () => {
  it('kill -9 while the actors are being told leaves the intent; the next run finishes it, and no byte of the text is left', async () => {
    ensureBuilt();
    const dir = mkdtempSync(join(tmpdir(), 'reef-deletion-kill-'));
    dirs.push(dir);
    const path = join(dir, 'records.sqlite');
    const MARK = 'Qk4KilledMidDeletion';
    const child = spawn(process.execPath, [probe, path, MARK], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<NodeJS.Signals | number | null>((resolve) => child.on('exit', (code, signal) => resolve(signal ?? code)));
    let ids: string[] = [];
    for await (const text of createInterface({ input: child.stdout })) {
      const line = JSON.parse(text) as { event: string; ids?: string[] };
      if (line.event === 'appended') ids = line.ids!;
      if (line.event === 'forgetting') child.kill('SIGKILL');
    }
    expect(await exited, stderr).toBe('SIGKILL');
    const files = () => readdirSync(dir).filter((f) => readFileSync(join(dir, f)).includes(Buffer.from(MARK)));
    // Killed before the scrub: the rows are gone, the bytes not yet (the chunks, the WAL).
    expect(files().length).toBeGreaterThan(0);
    const store = SqliteStore.open(path);
    try {
      expect(await store.get(ids[0]!)).toBeNull();
      expect((await store.statesWithPrefix('deletion/')).map(([, v]) => (v as { ids: string[] }).ids)).toEqual([ids]);
      const told: string[][] = [];
      expect(await store.resumeDeletions(async (x) => void told.push(x))).toBe(1);
      expect(told).toEqual([ids]);
      expect(await store.statesWithPrefix('deletion/')).toEqual([]);
      expect((await store.list({ scenario: 'default' })).items.map((r) => r.tags.session)).toEqual(['bob', 'bob', 'bob']);
    } finally {
      await store.close();
    }
    expect(files()).toEqual([]);
  });
});
