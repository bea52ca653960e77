import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ReefError } from '../actors/runtime/errors.js';
import { BridgeClient } from '../bridge/client.js';
import type { EngineSpec, Layout } from '../bridge/messages.js';
import { type ShimProcess, spawnShim } from '../bridge/shim-process.js';
import { repoRoot } from '../cluster/paths.js';
import { pidAlive, waitFor } from './helpers/wait.js';

/**
 * Real Ray through the real bridge: a local head declaring 7 logical GPUs holds the reference
 * 4/1/1/1 layout on a CPU machine. Engines are the stand-in `fake_engine_server`, selected with
 * REEF_ENGINE_MODULE_HF; everything around it (actor in the bundle, subprocess, health wait) is the
 * production path. Ray starts once for the whole file.
 */

const REFERENCE: Layout = { trainer: { gpus: 4 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 1 }, student: { gpus: 1 }, cpusPerBundle: 1, colocate: false };
const shimDir = join(repoRoot(), 'python_shim');

function engineSpec(over: Partial<EngineSpec>): EngineSpec {
  return { name: 'rollout-0', role: 'rollout', kind: 'hf', modelPath: '/models/fake', group: 'reef-rollout', bundleIndex: 0, host: '127.0.0.1', port: 0, extraArgs: [], ...over };
}

async function rejection(p: Promise<unknown>): Promise<ReefError> {
  const err = await p.then(
    () => new Error('expected a rejection'),
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(ReefError);
  return err as ReefError;
}

describe('placement groups and engines on a real Ray head with 7 logical GPUs', () => {
  let shim: ShimProcess;
  let client: BridgeClient;
  let logDir: string;
  const enginePids: number[] = [];

  beforeAll(async () => {
    logDir = mkdtempSync(join(tmpdir(), 'reef-engines-'));
    shim = await spawnShim({
      env: { PYTHONPATH: `${shimDir}:${join(shimDir, 'tests')}`, REEF_ENGINE_MODULE_HF: 'fake_engine_server', REEF_ENGINE_LOG_DIR: logDir },
      log: () => {},
    });
    client = await BridgeClient.forProcess(shim);
  });

  afterAll(async () => {
    await client?.close();
    await shim?.stop();
    for (const pid of enginePids) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
    if (logDir) rmSync(logDir, { recursive: true, force: true });
  });

  it('starts a local head and creates the reference 4/1/1/1 layout', async () => {
    const t0 = performance.now();
    const ray = await client.initRay({ numCpus: 8, numGpus: 7 });
    const t1 = performance.now();
    const groups = await client.createPlacement(REFERENCE, 60);
    const t2 = performance.now();
    console.log(`ray init ${((t1 - t0) / 1000).toFixed(1)} s, 4/1/1/1 placement ${((t2 - t1) / 1000).toFixed(1)} s`);
    expect(ray.startedHead).toBe(true);
    expect(ray.resources.GPU).toBe(7);
    expect(groups.map((g) => [g.name, g.state])).toEqual([
      ['reef-trainer', 'CREATED'],
      ['reef-rollout', 'CREATED'],
      ['reef-prm-0', 'CREATED'],
      ['reef-student', 'CREATED'],
    ]);
    // Ray's count of available resources comes from the raylets' periodic reports, so it can trail
    // a placement that is already CREATED by a moment (regression: read at once, it showed 1 GPU free).
    const status = await waitFor(async () => {
      const s = await client.status();
      return (s.ray!.available.GPU ?? 0) === 0 ? s : null;
    }, { what: "Ray's count of available GPUs to reach 0", timeoutMs: 10_000, intervalMs: 100 });
    const trainer = status.groups.find((g) => g.name === 'reef-trainer')!;
    expect(trainer.strategy).toBe('STRICT_PACK');
    expect(trainer.bundles).toHaveLength(4);
    for (const b of trainer.bundles) {
      expect(b.resources).toEqual({ GPU: 1, CPU: 1 });
      expect(b.nodeId).toMatch(/^[0-9a-f]{56}$/);
    }
    expect(status.groups.every((g) => g.state === 'CREATED')).toBe(true);
    expect(status.ray!.available.GPU ?? 0).toBe(0); // every logical GPU is held by a bundle
    expect(Object.keys(status.ray!.resources).some((k) => k.includes('_group_'))).toBe(false);
  });

  it('starts an engine in the rollout bundle and sees it healthy', async () => {
    const engine = await client.startEngine(engineSpec({ extraArgs: ['--weight-version', 'w-0'] }));
    enginePids.push(engine.pid!);
    expect(engine).toMatchObject({ name: 'rollout-0', healthy: true, weightVersion: 'w-0', group: 'reef-rollout', bundleIndex: 0 });
    expect((await fetch(`${engine.url}/health`)).status).toBe(200);
    const status = await client.status();
    expect(status.engines).toEqual([engine]);
  });

  it('reports an engine that dies at start with its output', async () => {
    const err = await rejection(client.startEngine(engineSpec({ name: 'prm-0', role: 'prm', group: 'reef-prm-0', extraArgs: ['--exit-code', '3'] })));
    expect(err.code).toBe('REEF_ERR_ENGINE_START');
    expect(err.message).toContain('exited with code 3');
    expect(err.message).toContain('fake engine: refusing to start');
    expect((await client.status()).engines.map((e) => e.name)).toEqual(['rollout-0']);
  });

  it('fails a group that cannot be placed now, naming its bundle, and leaves the rest', async () => {
    // Totals fit (4+1+2 = 7 GPUs) but the student group holds the seventh: reef-prm-1 stays pending.
    const err = await rejection(client.createPlacement({ ...REFERENCE, prm: { gpus: 1, replicas: 2 }, student: null }, 2));
    expect(err.code).toBe('REEF_ERR_PLACEMENT');
    expect(err.message).toMatch(/^cannot place reef-prm-1 bundle 0 \{GPU:1, CPU:1\}: still pending after \d+ s \(GPU 0 of 7 free\)/);
    const names = (await client.status()).groups.map((g) => g.name);
    expect(names).toEqual(['reef-trainer', 'reef-rollout', 'reef-prm-0', 'reef-student']);
  });

  it('refuses a layout larger than the cluster at once, naming the bundle', async () => {
    const err = await rejection(client.createPlacement({ ...REFERENCE, trainer: { gpus: 5 } }, 60));
    expect(err.code).toBe('REEF_ERR_PLACEMENT');
    expect(err.message).toContain('cannot place reef-student bundle 0 {GPU:1}: 7 of 7 logical GPUs already planned');
  });

  it('removes everything: groups, engines, their processes', async () => {
    const removed = await client.removePlacement(null);
    expect(removed.sort()).toEqual(['reef-prm-0', 'reef-rollout', 'reef-student', 'reef-trainer']);
    const status = await client.status();
    expect(status.groups).toEqual([]);
    expect(status.engines).toEqual([]);
    await waitFor(() => !pidAlive(enginePids[0]!), { what: 'the engine process to exit', timeoutMs: 20_000 });
    expect(await client.stopEngine('rollout-0')).toBe(false);
  });

  it('stops on SIGTERM with exit code 0 once Ray is up', async () => {
    // Ray's core installs a SIGTERM crash handler that aborts; the shim must take SIGTERM back.
    await shim.stop();
    expect(await shim.exited).toBe(0);
  });
});
