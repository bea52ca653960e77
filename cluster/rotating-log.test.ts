import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { redirectOutput, RotatingLog } from './rotating-log.js';

const dirs: string[] = [];
const newDir = () => {
  const d = mkdtempSync(join(tmpdir(), 'reef-rotate-'));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

/** 20 numbered lines of 100 bytes. */
const LINES = Array.from({ length: 20 }, (_, i) => `${String(i).padStart(4, '0')}${'x'.repeat(95)}\n`);

describe('rotating log', () => {
  it('keeps the newest bytes in the file and its backups, none past the limit, owner-only', () => {
    const dir = newDir();
    const log = new RotatingLog(join(dir, 'reef.log'), { maxBytes: 300, backups: 2 });
    for (const l of LINES) log.write(l);
    log.close();
    expect(readdirSync(dir).sort()).toEqual(['reef.log', 'reef.log.1', 'reef.log.2']);
    for (const f of readdirSync(dir)) {
      expect(statSync(join(dir, f)).size).toBeLessThanOrEqual(300);
      expect(statSync(join(dir, f)).mode & 0o777).toBe(0o600);
    }
    const kept = ['reef.log.2', 'reef.log.1', 'reef.log'].map((f) => readFileSync(join(dir, f), 'utf8')).join('');
    expect(kept).toBe(LINES.slice(-8).join('').slice(-kept.length));
    expect(kept.length).toBe(2 * 300 + (2000 % 300));
  });

  it('splits a write larger than the limit, and without backups starts over', () => {
    const dir = newDir();
    const log = new RotatingLog(join(dir, 'a.log'), { maxBytes: 10, backups: 0 });
    log.write('0123456789abcdefghij' + 'XYZ');
    log.close();
    expect(readdirSync(dir)).toEqual(['a.log']);
    expect(readFileSync(join(dir, 'a.log'), 'utf8')).toBe('XYZ');
  });

  it('goes on from the size a file had when it was opened again', () => {
    const dir = newDir();
    const first = new RotatingLog(join(dir, 'r.log'), { maxBytes: 250, backups: 1 });
    first.write(LINES[0]!.repeat(2));
    first.close();
    const second = new RotatingLog(join(dir, 'r.log'), { maxBytes: 250, backups: 1 });
    second.write(LINES[1]!);
    second.close();
    expect(readFileSync(join(dir, 'r.log.1'), 'utf8')).toBe(LINES[0]!.repeat(2) + LINES[1]!.slice(0, 50));
    expect(readFileSync(join(dir, 'r.log'), 'utf8')).toBe(LINES[1]!.slice(50));
  });

  it("takes this process's stdout and stderr writes, callbacks and encodings included", async () => {
    const dir = newDir();
    const saved = [process.stdout.write, process.stderr.write] as const;
    let log: RotatingLog | null = null;
    try {
      log = redirectOutput(join(dir, 'reef.log'), { maxBytes: 250, backups: 1 });
      process.stderr.write(LINES[0]!);
      await new Promise<void>((resolve) => process.stdout.write(LINES[1]!, () => resolve()));
      process.stderr.write(Buffer.from(LINES[2]!));
      process.stdout.write(Buffer.from(LINES[3]!).toString('hex'), 'hex');
    } finally {
      [process.stdout.write, process.stderr.write] = saved;
      log?.close();
    }
    expect(readFileSync(join(dir, 'reef.log.1'), 'utf8') + readFileSync(join(dir, 'reef.log'), 'utf8')).toBe(LINES.slice(0, 4).join('').slice(-(250 + 150)));
  });
});
