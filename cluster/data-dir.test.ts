import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { ownDataDir } from './data-dir.js';

const root = mkdtempSync(join(tmpdir(), 'reef-data-dir-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));
const umask = process.umask();
afterEach(() => void process.umask(umask));
const mode = (p: string) => statSync(p).mode & 0o777;

describe('the data dir', () => {
  it("is made the owner's alone, and so is everything created after it", () => {
    const dir = join(root, 'new', 'data');
    const lines: string[] = [];
    ownDataDir(dir, (l) => lines.push(l));
    writeFileSync(join(dir, 'records.sqlite'), '');
    mkdirSync(join(dir, 'checkpoints'));
    expect([mode(dir), mode(join(dir, 'records.sqlite')), mode(join(dir, 'checkpoints'))]).toEqual([0o700, 0o600, 0o700]);
    expect(lines).toEqual([]);
  });

  it('closes one an earlier run left open to other users, and says so', () => {
    const dir = join(root, 'open');
    mkdirSync(dir);
    chmodSync(dir, 0o755);
    const lines: string[] = [];
    ownDataDir(dir, (l) => lines.push(l));
    expect(mode(dir)).toBe(0o700);
    expect(lines).toEqual([`reef.data_dir ${dir} was open to other users (mode 755); made it 0700`]);
  });

  it.skipIf(process.getuid?.() !== 0)("refuses another user's, naming the key (needs root to give it away)", () => {
    const dir = join(root, 'theirs');
    mkdirSync(dir);
    chownSync(dir, 12345, 12345);
    expect(() => ownDataDir(dir, () => {})).toThrow(/reef\.data_dir .*theirs belongs to uid 12345, not to this user/);
  });
});
