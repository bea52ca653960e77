import { type ChildProcess, spawn } from 'node:child_process';
import { request } from 'node:http';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Pool } from 'undici';
import { HANDOFF_DIR_ENV, HeldListener } from '../../cluster/held-listener.js';
import { repoRoot } from '../../cluster/paths.js';
import { type BenchRow, type BenchSuite, measureCalls, toRow } from '../lib.js';

/**
 * What the supervisor's held listener (cluster/held-listener.ts, security review M6) costs: this
 * process accepts each connection and passes its descriptor to the server process over the IPC
 * channel, where a direct listen lets the server accept it itself. Cases: a new connection per
 * request (`connection: close`, as a client without keep-alive makes), sequential and 16 at once,
 * and requests on kept-alive connections, which pay nothing once the socket is handed over.
 * Baseline: the same fastify server in the same kind of process, listening on 127.0.0.1 itself, in
 * the same run. The server answers `GET /` with a 12-byte JSON body, so the figures are the
 * connection's cost, not a handler's.
 */

const SERVER_SCRIPT = (root: string) => `
const Fastify = (await import(${JSON.stringify(join(root, 'node_modules/fastify/fastify.js'))})).default;
const { serveHandedConnections } = await import(${JSON.stringify(join(root, 'dist/actors/gateway/handoff.js'))});
const app = Fastify({ keepAliveTimeout: 75_000 });
app.get('/', async () => ({ ok: true }));
const dir = process.env.${HANDOFF_DIR_ENV};
if (dir) {
  await serveHandedConnections(app, { socketDir: dir, maxConnections: 1024 });
  console.log(JSON.stringify({ url: null }));
} else {
  console.log(JSON.stringify({ url: await app.listen({ host: '127.0.0.1', port: 0 }) }));
}
`;

interface Server {
  url: string;
  child: ChildProcess;
  listener: HeldListener | null;
}

async function startServer(handoff: boolean): Promise<Server> {
  const listener = handoff ? await HeldListener.bind({ host: '127.0.0.1', port: 0, log: () => {} }) : null;
  const child = spawn(process.execPath, ['--input-type=module', '-e', SERVER_SCRIPT(repoRoot())], {
    env: { ...process.env, ...(listener ? { [HANDOFF_DIR_ENV]: listener.socketDir } : {}) },
    stdio: ['ignore', 'pipe', 'inherit', 'ipc'],
  });
  listener?.attach(child);
  const line = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once('line', resolve);
    child.once('exit', (code) => reject(new Error(`bench server exited with code ${code}`)));
  });
  const { url } = JSON.parse(line) as { url: string | null };
  return { url: url ?? `http://127.0.0.1:${listener!.port}`, child, listener };
}

async function stopServer(s: Server): Promise<void> {
  await s.listener?.close();
  const exited = new Promise((resolve) => s.child.once('exit', resolve));
  s.child.kill('SIGTERM');
  await exited;
}

/** One request on a connection of its own, closed after the answer. */
function freshConnection(url: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}/`, { agent: false, headers: { connection: 'close' } }, (res) => {
      res.resume();
      res.once('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`status ${res.statusCode}`))));
    });
    req.once('error', reject);
    req.end();
  });
}

export const suite: BenchSuite = {
  name: 'handoff',
  description: 'a connection accepted by the supervisor and handed to the gateway process over IPC, against the process listening itself',
  async run({ seconds, log }) {
    const rows: BenchRow[] = [];
    for (const [impl, handoff] of [['direct listen (baseline)', false], ['supervisor handoff', true]] as const) {
      const s = await startServer(handoff);
      try {
        log(`${impl}: ${s.url}`);
        rows.push(toRow('new connection per request, sequential', impl, await measureCalls(() => freshConnection(s.url), { seconds })));
        rows.push(toRow('new connection per request, 16 at once', impl, await measureCalls(() => freshConnection(s.url), { seconds, concurrency: 16 })));
        const pool = new Pool(s.url, { connections: 16 });
        try {
          const call = async () => {
            const res = await pool.request({ path: '/', method: 'GET' });
            await res.body.dump();
          };
          rows.push(toRow('kept-alive connections, 16 at once', impl, await measureCalls(call, { seconds, concurrency: 16 })));
        } finally {
          await pool.close();
        }
        if (s.listener) log(`handed ${s.listener.counts.handed} connections, queued ${s.listener.counts.queued}, refused ${s.listener.counts.refused}`);
      } finally {
        await stopServer(s);
      }
    }
    return rows;
  },
};
