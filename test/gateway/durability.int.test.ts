import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tinyModelDir } from '../../cluster/paths.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { spawnGateway, type GatewayProcess } from '../helpers/gateway-process.js';
import { pidAlive, waitFor } from '../helpers/wait.js';
import { CHAT, CPU_EXAMPLE, ensureBuilt } from './harness.js';

/**
 * A receipt means durable: the gateway runs as its own process (as `reef up` starts it), is
 * kill -9'd the moment a receipt reaches the client, and a restart on the same data dir serves the
 * complete record.
 */

type Running = GatewayProcess;

describe('gateway durability across kill -9', () => {
  let engine: FakeEngine;
  let dir: string;
  let configPath: string;
  const children: ChildProcess[] = [];

  beforeAll(async () => {
    ensureBuilt();
    engine = await startFakeEngine();
    dir = mkdtempSync(join(tmpdir(), 'reef-gw-durable-'));
    // The CPU example, with the tiny model's path made absolute, port 0 and a fresh data dir.
    const yaml = readFileSync(CPU_EXAMPLE, 'utf8')
      .replaceAll('../../../../.cache/tiny-model', tinyModelDir())
      .replace(/^(\s+)port: 8600$/m, '$1port: 0')
      .replace(/^(\s+)data_dir: \.reef$/m, `$1data_dir: ${join(dir, 'data')}`);
    expect(yaml).toContain('port: 0');
    configPath = join(dir, 'serve.yaml');
    writeFileSync(configPath, yaml);
  });
  afterAll(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await engine?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  async function startGatewayProcess(): Promise<Running> {
    const g = await spawnGateway({ configPath, engineUrl: engine.url });
    children.push(g.child);
    return g;
  }

  /** Sends a completion and kill -9s the gateway as soon as `isReceipt` sees the receipt arrive. */
  function completeThenKill(g: Running, body: unknown, isReceipt: (headers: Record<string, unknown>, soFar: string) => string | null): Promise<string> {
    const payload = JSON.stringify(body);
    return new Promise<string>((resolve, reject) => {
      const req = httpRequest(`${g.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
        let soFar = '';
        const check = () => {
          const id = isReceipt(res.headers, soFar);
          if (id === null) return false;
          g.child.kill('SIGKILL');
          resolve(id);
          return true;
        };
        if (check()) return;
        res.on('data', (d: Buffer) => {
          soFar += d.toString();
          check();
        });
        res.on('error', () => {});
        res.on('end', () => reject(new Error(`response ended without a receipt: ${soFar}`)));
      });
      req.on('error', () => {});
      req.end(payload);
    });
  }

  async function expectComplete(url: string, id: string, engineRequest: Record<string, unknown>) {
    const res = await fetch(`${url}/reef/scenarios/default/records/${id}`);
    expect(res.status).toBe(200);
    const rec = (await res.json()) as any;
    expect(rec).toMatchObject({ id, status: 'ok', scenario: 'default', topK: 4, finishReason: 'stop', weightVersion: 'v0' });
    expect(rec.promptIds).toEqual(engineRequest.input_ids);
    expect(rec.outputIds).toHaveLength(6);
    expect(rec.logprobs).toHaveLength(6);
    expect(rec.topk).toHaveLength(6);
    expect(rec.response).toEqual({ role: 'assistant', content: 'Hello from the fake engine.' });
  }

  it('keeps a non-streamed receipt (header) and a streamed one (final chunk) across kill -9 and restart', async () => {
    const first = await startGatewayProcess();
    const id1 = await completeThenKill(first, CHAT, (h) => (typeof h['x-reef-agent-record-id'] === 'string' ? h['x-reef-agent-record-id'] : null));
    expect(await first.exited).toBe('SIGKILL');
    const sent1 = engine.requests.at(-1)!;

    const second = await startGatewayProcess();
    await expectComplete(second.url, id1, sent1);
    const id2 = await completeThenKill(second, { ...CHAT, stream: true }, (_h, soFar) => /"agent_record_id":"([0-9A-Z]{26})"/.exec(soFar)?.[1] ?? null);
    expect(await second.exited).toBe('SIGKILL');
    const sent2 = engine.requests.at(-1)!;

    const third = await startGatewayProcess();
    await expectComplete(third.url, id1, sent1);
    await expectComplete(third.url, id2, sent2);
    const listed = (await (await fetch(`${third.url}/reef/scenarios/default/records`)).json()) as { data: Array<{ id: string }> };
    expect(listed.data.map((r) => r.id)).toEqual([id1, id2]);
    // SIGTERM drains and exits cleanly.
    third.child.kill('SIGTERM');
    expect(await third.exited).toBe(0);
    await waitFor(() => !pidAlive(third.child.pid!), { what: 'the gateway process to be gone' });
  });
});
