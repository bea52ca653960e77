import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { decode, encode, f32ToBytes, i32ToBytes } from '../actors/runtime/codec.js';
import { BridgeRequest, type BridgeRequestType, ErrorReply, REPLY_SCHEMAS } from '../bridge/messages.js';
import { pythonBin, pythonEnv, repoRoot } from '../cluster/paths.js';

/**
 * Every bridge message crosses the language boundary both ways: TypeScript encodes, Python decodes,
 * validates with reef_shim.messages and re-encodes, TypeScript decodes and compares; and samples
 * Python builds are validated by the zod schemas. A field added on one side only fails here.
 */

interface Sample {
  schema: string;
  message: Record<string, unknown>;
}
interface Echoed extends Sample {
  error: string | null;
}

const ECHO = join(repoRoot(), 'python_shim', 'tests', 'interop_echo.py');

function python(mode: 'echo' | 'samples', input?: Buffer): unknown {
  const run = spawnSync(pythonBin(), [ECHO, mode], { env: pythonEnv(), input, maxBuffer: 64 * 1024 * 1024 });
  if (run.status !== 0) throw new Error(`interop_echo.py ${mode} exited ${run.status}: ${run.stderr.toString()}`);
  return decode(run.stdout);
}

const layout = { trainer: { gpus: 4 }, rollout: { gpus: 1 }, prm: { gpus: 1, replicas: 1 }, student: { gpus: 1 }, cpusPerBundle: 1, colocate: false };
const bundles = (n: number, node: string | null) => Array.from({ length: n }, (_, index) => ({ index, resources: { GPU: 1, CPU: 0.5 }, nodeId: node }));
const group = (name: string, role: string, strategy: string, n: number, state: string, node: string | null) => ({
  name,
  role,
  strategy,
  state,
  bundles: bundles(n, node),
});
const NODE = 'f'.repeat(56);
const resources = { CPU: 8, GPU: 7, memory: 17_179_869_184, object_store_memory: 134_217_728, 'node:127.0.0.1': 1, 'node:__internal_head__': 1 };
const engine = (pid: number | null, weightVersion: string | null) => ({
  name: 'prm-0 «judge»',
  role: 'prm',
  kind: 'sglang',
  url: 'http://10.0.0.7:30000',
  pid,
  healthy: pid !== null,
  weightVersion,
  modelPath: '/models/Qwen3-4B-思考',
  group: 'reef-prm-0',
  bundleIndex: 0,
});
const spec = { name: 'rollout-0', role: 'rollout', kind: 'hf', modelPath: '/m/tiny', group: 'reef-rollout', bundleIndex: 0, host: '127.0.0.1', port: 0, extraArgs: ['--dtype', 'float32', '', '—ünï'] };

const trainOptions = { wRl: 1, wOpd: 0.5, clipC: 1, hintSelection: 'token_optimal', lr: 1e-5, epsLow: 0.2, epsHigh: 0.28, weightDecay: 0.1, betas: [0.9, 0.98], topK: 4, dtype: 'fp32', oldLogprobs: 'trainer', tisCap: 2, klCoef: 0, clipGrad: 1, microBatchTokens: 2048, gradCheckpointing: 'off' };
const trainerSpec = { modelPath: '/m/tiny', ranks: 2, backend: 'fsdp2', options: trainOptions, engineLogprobs: 'tempered', checkpointDir: '/data/ckpt-ü', seed: 0, group: 'reef-trainer' };
const trainTask = {
  taskId: 'rec-01J×',
  promptIds: i32ToBytes([2039, 84, 2_147_483_647]),
  responseIds: i32ToBytes([12, 2041]),
  logprobs: f32ToBytes([-0.5, -1e-7]),
  topK: 2,
  topkIds: i32ToBytes([12, 7, 2041, -1]),
  topkLogprobs: f32ToBytes([-0.5, -1.25, -1e-7, -10000]),
  reward: -1,
  teacherPromptIds: [i32ToBytes([2039, 84, 9]), i32ToBytes([])],
  sampling: { temperature: 0.8, topP: 0.9, topK: -1 },
  weightVersion: null,
};

const req = (type: BridgeRequestType, fields: Record<string, unknown> = {}): Sample => ({ schema: 'request', message: { type, requestId: `ts-${type}-1`, ...fields } });
const ok = (type: BridgeRequestType, fields: Record<string, unknown> = {}): Sample => ({ schema: `reply:${type}`, message: { type: 'ok', requestId: `ts-${type}-é`, ...fields } });

const TS_SAMPLES: Sample[] = [
  req('ping'),
  req('init-ray', { address: null, numCpus: 8, numGpus: 7, objectStoreBytes: 128 * 1024 * 1024 }),
  req('init-ray', { address: 'ray-head.internal:6379', numCpus: null, numGpus: null, objectStoreBytes: Number.MAX_SAFE_INTEGER }),
  req('plan-placement', { layout: { ...layout, student: null, prm: { gpus: 2, replicas: 0 }, cpusPerBundle: 0.25, colocate: false } }),
  req('create-placement', { layout, timeoutS: 60 }),
  req('create-placement', { layout, timeoutS: 0.5 }),
  req('remove-placement', { names: null }),
  req('remove-placement', { names: ['reef-prm-0', 'reef-prm-1'] }),
  req('start-engine', { spec }),
  req('stop-engine', { name: 'rollout-0' }),
  req('status'),
  req('shutdown'),
  req('trainer-start', { spec: trainerSpec }),
  req('trainer-step', { batchId: 'support:openclawrl:3', tasks: [trainTask, { ...trainTask, teacherPromptIds: [], weightVersion: 'v2', reward: 0.5 }] }),
  req('trainer-step', { batchId: 'b', tasks: [] }),
  req('trainer-load', { checkpointPath: '/data/ckpt/v2' }),
  req('trainer-push-weights', { engineUrl: 'http://10.0.0.7:30000', weightVersion: 'v3' }),
  req('trainer-stop'),
  ok('ping', { pid: 123_456, version: '0.1.0', rayConnected: true }),
  ok('init-ray', { address: '127.0.0.1:6379', startedHead: false, resources }),
  ok('plan-placement', {
    plan: { groups: [{ name: 'reef-trainer', role: 'trainer', strategy: 'STRICT_PACK', bundles: [{ GPU: 1, CPU: 1.5 }, { GPU: 1, CPU: 1.5 }] }], totalGpus: 2, totalCpus: 3 },
  }),
  ok('create-placement', { groups: [group('reef-trainer', 'trainer', 'STRICT_PACK', 4, 'CREATED', NODE), group('reef-student', 'student', 'PACK', 1, 'PENDING', null)] }),
  ok('remove-placement', { removed: ['reef-trainer', 'reef-rollout'] }),
  ok('start-engine', { engine: engine(2 ** 31 - 1, 'step-3') }),
  ok('stop-engine', { stopped: true }),
  ok('status', {
    ray: { address: '127.0.0.1:6379', resources, available: { ...resources, GPU: 0, CPU: 4.5 } },
    groups: [group('reef-rollout', 'rollout', 'PACK', 1, 'REMOVED', null)],
    engines: [engine(null, null), engine(77, 'v1')],
  }),
  ok('status', { ray: null, groups: [], engines: [] }),
  ok('shutdown'),
  ok('trainer-start', { worldSize: 2, device: 'cpu', pids: [101, 102], weightVersion: 'v0' }),
  ok('trainer-step', { batchId: 'support:openclawrl:3', weightVersion: 'v3', checkpointPath: '/data/ckpt/v3', metrics: { loss: -0.25, tokens: 72, train_rollout_logprob_abs_diff: 1.5e-7 }, stepMs: 812.5, trained: true }),
  ok('trainer-load', { weightVersion: 'v2' }),
  ok('trainer-push-weights', { weightVersion: 'v3', backend: 'gloo', bytes: 2 ** 33, seconds: 0.0625 }),
  ok('trainer-stop'),
  { schema: 'error', message: { type: 'error', requestId: null, code: 'REEF_ERR_BAD_MESSAGE', message: 'malformed message: not msgpack', retryable: false } },
  { schema: 'error', message: { type: 'error', requestId: 'r-9', code: 'REEF_ERR_FROM_THE_FUTURE', message: 'ünknown', retryable: true } },
];

// Broken the same way for both languages: each must be refused by Python and by zod.
const BROKEN: Array<[Sample, string]> = [
  [req('stop-engine', {}), 'stop-engine.name: missing'],
  [req('ping', { extra: 1 }), 'ping: unknown key(s) extra'],
  [req('create-placement', { layout: (({ student: _, ...rest }) => rest)(layout), timeoutS: 1 }), 'create-placement.layout.student: missing'],
  [req('init-ray', { address: null, numCpus: 1.5, numGpus: null, objectStoreBytes: null }), 'init-ray.numCpus: expected an integer'],
  [req('start-engine', { spec: { ...spec, kind: 'vllm' } }), "start-engine.spec.kind: expected 'hf' | 'sglang', got 'vllm'"],
  [ok('start-engine', { engine: { ...engine(1, null), pid: '1' } }), 'start-engine reply.engine.pid: expected an integer'],
  [ok('status', { ray: null, groups: [] }), 'status reply.engines: missing'],
  [req('trainer-step', { batchId: 'b', tasks: [{ ...trainTask, promptIds: [2039, 84] }] }), 'trainer-step.tasks[0].promptIds: expected bytes'],
  [req('trainer-step', { batchId: 'b', tasks: [{ ...trainTask, topK: 2.5 }] }), 'trainer-step.tasks[0].topK: expected an integer'],
  [req('trainer-start', { spec: { ...trainerSpec, options: { ...trainOptions, betas: [0.9, 0.98, 0.5] } } }), 'trainer-start.spec.options.betas: expected 2 items'],
  [req('trainer-start', { spec: { ...trainerSpec, options: { ...trainOptions, beta1: 0.9 } } }), 'trainer-start.spec.options: unknown key(s) beta1'],
  [ok('trainer-step', { batchId: 'b', weightVersion: 'v1', checkpointPath: '/c', metrics: { loss: 'nan' }, stepMs: 1, trained: true }), 'trainer-step reply.metrics.loss: expected a finite number'],
  [req('trainer-push-weights', { engineUrl: 'http://e', weightVersion: null }), 'trainer-push-weights.weightVersion: expected a string'],
  [ok('trainer-push-weights', { weightVersion: 'v1', backend: 'mpi', bytes: 1, seconds: 1 }), "trainer-push-weights reply.backend: expected 'gloo' | 'nccl' | 'ipc', got 'mpi'"],
];

function zodCheck(sample: Sample): { success: boolean; error?: unknown } {
  if (sample.schema === 'request') return BridgeRequest.safeParse(sample.message);
  if (sample.schema === 'error') return ErrorReply.safeParse(sample.message);
  if (sample.schema.startsWith('reply:')) {
    const type = sample.schema.slice('reply:'.length) as BridgeRequestType;
    return REPLY_SCHEMAS[type].safeParse(sample.message);
  }
  return { success: true };
}

describe('bridge messages across TypeScript and Python', () => {
  it('has a TypeScript sample of every request and every ok reply', () => {
    const types = Object.keys(REPLY_SCHEMAS).sort();
    expect([...new Set(TS_SAMPLES.filter((s) => s.schema === 'request').map((s) => s.message.type))].sort()).toEqual(types);
    expect([...new Set(TS_SAMPLES.filter((s) => s.schema.startsWith('reply:')).map((s) => s.schema.slice(6)))].sort()).toEqual(types);
    for (const sample of TS_SAMPLES) expect(zodCheck(sample), JSON.stringify(sample)).toMatchObject({ success: true });
  });

  it('TypeScript → Python → TypeScript keeps every message valid and equal', () => {
    const codec: Sample = {
      schema: 'codec',
      message: {
        floats: f32ToBytes([0.5, -1.25, 3.0e38]),
        bytes: Buffer.from([0, 1, 2, 253, 254, 255]),
        big: 2n ** 63n - 1n,
        negBig: -(2n ** 62n),
        safe: -Number.MAX_SAFE_INTEGER,
        nested: [[1, [2, [null, 'ü☃']]], {}, { a: [[], [[]]] }],
        float: 0.1,
        // A lone surrogate in a short string went out as CESU-8, which Python cannot decode.
        lone: 'cut \uD83D',
      },
    };
    const sent = [...TS_SAMPLES, codec];
    const back = python('echo', encode(sent)) as Echoed[];
    expect(back).toHaveLength(sent.length);
    for (const [i, item] of back.entries()) {
      expect(item.error, `${item.schema} ${String(sent[i]!.message.type)}`).toBeNull();
      expect(item.schema).toBe(sent[i]!.schema);
    }
    expect(back.slice(0, TS_SAMPLES.length).map((b) => b.message)).toEqual(TS_SAMPLES.map((s) => s.message));
    const raw = back[back.length - 1]!.message;
    expect(Buffer.from(raw.floats as Uint8Array).equals(codec.message.floats as Buffer)).toBe(true);
    expect(Buffer.from(raw.bytes as Uint8Array).equals(codec.message.bytes as Buffer)).toBe(true);
    expect(raw.big).toBe(2n ** 63n - 1n);
    expect(raw.negBig).toBe(-(2n ** 62n));
    expect(raw.safe).toBe(-Number.MAX_SAFE_INTEGER);
    expect(raw.nested).toEqual(codec.message.nested);
    expect(raw.float).toBe(0.1);
    expect(raw.lone).toBe('cut \uFFFD');
  });

  it('Python and zod refuse the same broken messages', () => {
    const back = python('echo', encode(BROKEN.map(([s]) => s))) as Echoed[];
    for (const [i, [sample, expected]] of BROKEN.entries()) {
      expect(back[i]!.error, JSON.stringify(sample)).toContain(expected);
      expect(back[i]!.error).toMatch(/^REEF_ERR_BAD_MESSAGE: /);
      expect(zodCheck(sample).success, JSON.stringify(sample)).toBe(false);
    }
  });

  it('Python → TypeScript: samples the shim builds pass the zod schemas', () => {
    const samples = python('samples') as Sample[];
    const types = Object.keys(REPLY_SCHEMAS).sort();
    expect([...new Set(samples.filter((s) => s.schema === 'request').map((s) => s.message.type))].sort()).toEqual(types);
    expect([...new Set(samples.filter((s) => s.schema.startsWith('reply:')).map((s) => s.schema.slice(6)))].sort()).toEqual(types);
    for (const sample of samples) {
      const result = zodCheck(sample);
      expect(result.success, `${sample.schema}: ${JSON.stringify(result.error)}`).toBe(true);
    }
    const codec = samples.find((s) => s.schema === 'codec')!.message;
    expect(Buffer.from(codec.bytes as Uint8Array).equals(Buffer.from(Array.from({ length: 256 }, (_, i) => i)))).toBe(true);
    expect(codec.u64).toBe(Number.MAX_SAFE_INTEGER);
    expect(codec.nested).toEqual([[1, [2, [null, 'ü']]], {}]);
  });
});
