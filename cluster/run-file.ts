import { existsSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * `<data_dir>/run/supervisor.json`: how `reef status|scale|down` find a running stack. A file whose
 * pid is gone is stale (the stack was killed) and is treated as absent.
 */
export interface RunFile {
  pid: number;
  control: string;
  startedAt: number;
  configPath: string;
  gateway: string;
}

export function runFilePath(runDir: string): string {
  return join(runDir, 'supervisor.json');
}

export function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export function readRunFile(runDir: string): RunFile | null {
  const path = runFilePath(runDir);
  if (!existsSync(path)) return null;
  try {
    const rf = JSON.parse(readFileSync(path, 'utf8')) as RunFile;
    return pidAlive(rf.pid) ? rf : null;
  } catch {
    return null;
  }
}

export function writeRunFile(runDir: string, rf: RunFile): void {
  const path = runFilePath(runDir);
  // Write then rename, so a reader never sees half a file.
  writeFileSync(`${path}.tmp`, JSON.stringify(rf, null, 2));
  renameSync(`${path}.tmp`, path);
}

export function clearRunFile(runDir: string): void {
  rmSync(runFilePath(runDir), { force: true });
}
