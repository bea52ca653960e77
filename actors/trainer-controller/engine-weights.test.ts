import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { EngineClient } from '../../cluster/engine-client.js';
import { EngineWeights, UNKNOWN_WEIGHTS } from './engine-weights.js';

/**
 * A test double of SGLang 0.5.23's disk load and cache flush, over HTTP:
 * - a load of a path in `broken` fails after pointing the model at it, and its rollback re-reads
 *   that path (srt/model_executor/model_runner_components/weight_updater.py:193, :228-238): the
 *   weights are then part new (`holding` = `partial:<path>`), the label the old one, answered 400;
 * - with `flush_cache` (the default) a load whose flush meets a running request loads the weights
 *   and then answers 400 without moving the label (scheduler_components/weight_updater.py:120-160;
 *   tokenizer_manager.py:2316-2320);
 * - `/flush_cache?timeout=T` waits up to T s for idle and answers in plain text
 *   (http_server.py:1025-1040, scheduler_components/flush_wrapper.py:22-61).
 */
class FakeSGLang {
  holding = 'base-weights';
  label = 'base';
  broken = new Set<string>();
  busyUntil = 0;
  calls: string[] = [];
  private server: Server | null = null;

  async start(): Promise<string> {
    this.server = createServer((req, res) => void this.answer(req, res));
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  close(): Promise<void> {
    return new Promise((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  private idle(): boolean {
    return Date.now() >= this.busyUntil;
  }

  private async answer(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let raw = '';
    for await (const chunk of req) raw += chunk;
    const url = new URL(req.url ?? '/', 'http://x');
    this.calls.push(url.pathname);
    const json = (status: number, body: unknown) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    if (url.pathname === '/update_weights_from_disk') {
      const body = JSON.parse(raw) as { model_path: string; weight_version: string | null; flush_cache?: boolean };
      if (this.broken.has(body.model_path)) {
        this.holding = `partial:${body.model_path}`;
        return json(400, { success: false, message: 'Failed to update weights: shape mismatch.\nRolling back to original weights.', num_paused_requests: 0 });
      }
      this.holding = body.model_path;
      if ((body.flush_cache ?? true) && !this.idle()) {
        return json(400, { success: false, message: 'Weights were updated, but the cache was not flushed because requests are still running or queued. Retract or finish them, then call /flush_cache.', num_paused_requests: 0 });
      }
      if (body.weight_version !== null) this.label = body.weight_version;
      return json(200, { success: true, message: 'Succeeded to update model weights.', num_paused_requests: 0 });
    }
    if (url.pathname === '/flush_cache') {
      const deadline = Date.now() + Number(url.searchParams.get('timeout') ?? 0) * 1000;
      while (!this.idle() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      return this.idle() ? res.writeHead(200).end('Cache flushed.\n') : res.writeHead(400).end('Timed out waiting for idle state.');
    }
    json(404, { detail: 'Not Found' });
  }
}

const cleanup: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const fn of cleanup.splice(0).reverse()) await fn();
});

async function setUp(flushWaitS = 5) {
  const fake = new FakeSGLang();
  const client = new EngineClient(await fake.start(), { name: 'rollout', adminKey: null });
  cleanup.push(() => fake.close(), () => client.close());
  const log: string[] = [];
  return { fake, weights: new EngineWeights(client, (l) => log.push(l), flushWaitS), log };
}

const V1 = { path: '/ckpt/v1', version: 'v1' };
const V2 = { path: '/ckpt/v2', version: 'v2' };

describe('loading weights into the rollout engine from disk', () => {
  it('loads the last good weights back after a load that failed part-way, and says why', async () => {
    const { fake, weights, log } = await setUp();
    await weights.load(V1, null);
    fake.broken.add(V2.path);
    await expect(weights.load(V2, V1)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN', message: expect.stringContaining('shape mismatch') });
    // Not the half-loaded v2 under v1's label, which is what the engine held after the failed call.
    expect([fake.holding, fake.label, weights.unknown]).toEqual([V1.path, 'v1', null]);
    expect(log.join('\n')).toContain('v1 (/ckpt/v1) loaded back');
  });

  it('says the weights cannot be named when the way back fails too, until a load succeeds', async () => {
    const { fake, weights } = await setUp();
    fake.broken.add(V1.path).add(V2.path);
    await expect(weights.load(V2, V1)).rejects.toMatchObject({ code: 'REEF_ERR_ENGINE_DOWN' });
    expect(fake.holding).toBe(`partial:${V1.path}`);
    expect(weights.unknown).toContain('loading /ckpt/v1 back failed');
    // The controller's check compares this with the current release, so it loads the release again.
    expect(weights.served('base')).toBe(UNKNOWN_WEIGHTS);
    fake.broken.clear();
    await weights.load(V1, null);
    expect([fake.holding, fake.label, weights.served('v1')]).toEqual([V1.path, 'v1', 'v1']);
  });

  it('waits for a request still running to finish before it drops the cache, and the new label stands', async () => {
    const { fake, weights } = await setUp();
    fake.busyUntil = Date.now() + 500;
    await weights.load(V1, null);
    expect([fake.holding, fake.label]).toEqual([V1.path, 'v1']);
    expect(fake.calls).toEqual(['/update_weights_from_disk', '/flush_cache']);
  });

  it('fails a load whose engine never goes idle, within the flush wait', async () => {
    const { fake, weights } = await setUp(0.3);
    await weights.load(V1, null);
    fake.busyUntil = Date.now() + 60_000;
    await expect(weights.load(V2, V1)).rejects.toThrow(/not idle within 0.3 s/);
    expect(weights.unknown).toContain('loading /ckpt/v1 back failed');
  });
});
