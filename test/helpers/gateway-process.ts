import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { distEntry } from '../../cluster/paths.js';

export interface GatewayProcess {
  child: ChildProcess;
  /** Its base URL, from its "listening on" line. */
  url: string;
  /** Its exit: the signal's name or the exit code. */
  exited: Promise<number | string | null>;
  stderr: () => string;
}

/**
 * The gateway's own entry (dist) as a process of its own, with no supervisor: what a test that
 * kills it outright needs. Resolves once it listens; rejects, with its output, if it exits first.
 */
export async function spawnGateway(o: { configPath: string; engineUrl: string; env?: Record<string, string>; detached?: boolean }): Promise<GatewayProcess> {
  const child = spawn(process.execPath, [distEntry('actors/gateway/main')], {
    env: {
      ...process.env,
      ...o.env,
      REEF_ACTOR: JSON.stringify({ name: 'gateway', id: 'gateway-0', supervisor: null, configPath: o.configPath, overrides: {}, heartbeatMs: null }),
      REEF_ENGINES: JSON.stringify({ rollout: o.engineUrl, prm: [], student: null }),
    },
    stdio: ['ignore', 'ignore', 'pipe'],
    detached: o.detached ?? false,
  });
  let stderr = '';
  const exited = new Promise<number | string | null>((resolve) => child.on('exit', (code, signal) => resolve(signal ?? code)));
  const url = await new Promise<string>((resolve, reject) => {
    const lines = createInterface({ input: child.stderr! });
    lines.on('line', (line) => {
      stderr += line + '\n';
      const m = /listening on (http:\/\/\S+)/.exec(line);
      if (m) resolve(m[1]!);
    });
    void exited.then((how) => reject(new Error(`gateway exited (${String(how)}) before listening:\n${stderr}`)));
  });
  return { child, url, exited, stderr: () => stderr };
}
