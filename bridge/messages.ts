import { z } from 'zod';

/**
 * The bridge protocol (docs/internals.md "Bridge protocol"): every request the TypeScript side
 * sends to the Python shim and every ok reply it gets back. `python_shim/reef_shim/messages.py`
 * mirrors these schemas; `test/interop.int.test.ts` keeps the two in step.
 * Objects are strict on both sides: a key one language adds and the other does not know fails the
 * first message instead of vanishing silently.
 */

const int = () => z.number().int();

export const Role = z.enum(['trainer', 'rollout', 'prm', 'student']);
export const EngineRole = z.enum(['rollout', 'prm', 'student']);
export const EngineKind = z.enum(['hf', 'sglang']);
export const Strategy = z.enum(['STRICT_PACK', 'PACK']);
export const GroupState = z.enum(['PENDING', 'CREATED', 'REMOVED']);
/** Ray resource name → amount (`CPU`, `GPU`, `memory`, `node:<ip>`...). */
export const Resources = z.record(z.string(), z.number());

export const Layout = z.strictObject({
  trainer: z.strictObject({ gpus: int() }),
  rollout: z.strictObject({ gpus: int() }),
  /** `replicas: 0` means an external PRM: no PRM group is placed. */
  prm: z.strictObject({ gpus: int(), replicas: int() }),
  student: z.strictObject({ gpus: int() }).nullable(),
  cpusPerBundle: z.number(),
  /** The rollout engine shares the trainer's one GPU: its bundle, half its GPU and CPUs each. */
  colocate: z.boolean(),
});

export const Bundle = z.strictObject({ GPU: z.number(), CPU: z.number() });

export const PlannedGroup = z.strictObject({
  name: z.string(),
  role: Role,
  strategy: Strategy,
  bundles: z.array(Bundle),
});

export const Plan = z.strictObject({ groups: z.array(PlannedGroup), totalGpus: int(), totalCpus: z.number() });

export const GroupStatus = z.strictObject({
  name: z.string(),
  role: Role,
  strategy: Strategy,
  state: GroupState,
  bundles: z.array(z.strictObject({ index: int(), resources: Resources, nodeId: z.string().nullable() })),
});

export const EngineSpec = z.strictObject({
  name: z.string(),
  role: EngineRole,
  kind: EngineKind,
  modelPath: z.string(),
  /** Placement group name, e.g. `reef-rollout`. */
  group: z.string(),
  bundleIndex: int(),
  host: z.string(),
  /** 0 = the engine's actor picks a free port. */
  port: int(),
  extraArgs: z.array(z.string()),
});

export const EngineInfo = z.strictObject({
  name: z.string(),
  role: EngineRole,
  kind: EngineKind,
  url: z.string(),
  pid: int().nullable(),
  healthy: z.boolean(),
  weightVersion: z.string().nullable(),
  modelPath: z.string(),
  group: z.string(),
  bundleIndex: int(),
});

export const RayStatus = z.strictObject({ address: z.string(), resources: Resources, available: Resources });

// --- training (docs/training.md) ------------------------------------------------------------------

/** Raw little-endian bytes (`i32ToBytes`/`f32ToBytes`); msgpack decodes bin to a Buffer. */
const Bytes = z.instanceof(Uint8Array);

/** `training.resolved` of the openclawrl recipe (`recipes/openclawrl/options.ts`). */
export const TrainingOptions = z.strictObject({
  wRl: z.number(),
  wOpd: z.number(),
  clipC: z.number(),
  hintSelection: z.enum(['sequence_optimal', 'token_optimal', 'shortest']),
  oldLogprobs: z.enum(['engine', 'trainer']),
  tisCap: z.number(),
  klCoef: z.number(),
  lr: z.number(),
  epsLow: z.number(),
  epsHigh: z.number(),
  weightDecay: z.number(),
  betas: z.tuple([z.number(), z.number()]),
  clipGrad: z.number(),
  topK: int(),
  dtype: z.enum(['fp32', 'bf16']),
  microBatchTokens: int(),
  gradCheckpointing: z.enum(['off', 'on']),
});

export const TrainerSpec = z.strictObject({
  /** The base model: the trainable policy and the frozen teacher both start from it. */
  modelPath: z.string(),
  /** Rank actors, one per bundle of `group` (≤ its bundle count). */
  ranks: int(),
  backend: z.enum(['fsdp2', 'tp']),
  options: TrainingOptions,
  /** How the rollout engine reports logprobs, so ℓθ is scored alike (`training.engine_logprobs`). */
  engineLogprobs: z.enum(['tempered', 'raw']),
  /** Holds `v<n>/` checkpoints and the completed-batch ledger. */
  checkpointDir: z.string(),
  seed: int(),
  group: z.literal('reef-trainer'),
});

export const TrainTask = z.strictObject({
  taskId: z.string(),
  promptIds: Bytes,
  /** The turn's assistant tokens; every one is in the loss. */
  responseIds: Bytes,
  /** f32 per response token, as the engine recorded it. */
  logprobs: Bytes,
  topK: int(),
  /** i32 [T*K], row-major by position. */
  topkIds: Bytes,
  /** f32 [T*K]. */
  topkLogprobs: Bytes,
  reward: z.number(),
  /** One i32 prompt per teacher candidate (hint appended to the last user message); [] = no OPD. */
  teacherPromptIds: z.array(Bytes),
  /** The engine's sampling parameters of this turn (ℓθ uses the same transform). */
  sampling: z.strictObject({ temperature: z.number(), topP: z.number(), topK: int() }),
  weightVersion: z.string().nullable(),
});

export type TrainingOptions = z.infer<typeof TrainingOptions>;
export type TrainerSpec = z.infer<typeof TrainerSpec>;
export type TrainTask = z.infer<typeof TrainTask>;

export type Layout = z.infer<typeof Layout>;
export type Plan = z.infer<typeof Plan>;
export type PlannedGroup = z.infer<typeof PlannedGroup>;
export type GroupStatus = z.infer<typeof GroupStatus>;
export type EngineSpec = z.infer<typeof EngineSpec>;
export type EngineInfo = z.infer<typeof EngineInfo>;
export type RayStatus = z.infer<typeof RayStatus>;

// --- requests ------------------------------------------------------------------------------------

function request<T extends string, S extends z.ZodRawShape>(type: T, shape: S) {
  return z.strictObject({ type: z.literal(type), requestId: z.string(), ...shape });
}

export const PingRequest = request('ping', {});
export const InitRayRequest = request('init-ray', {
  /** null starts a local head. */
  address: z.string().nullable(),
  numCpus: int().nullable(),
  /** Logical GPUs declared on a local head (a CPU machine can place the 7-GPU layout). */
  numGpus: int().nullable(),
  objectStoreBytes: int().nullable(),
});
export const PlanPlacementRequest = request('plan-placement', { layout: Layout });
export const CreatePlacementRequest = request('create-placement', { layout: Layout, timeoutS: z.number() });
/** `names: null` removes every group this shim created. */
export const RemovePlacementRequest = request('remove-placement', { names: z.array(z.string()).nullable() });
export const StartEngineRequest = request('start-engine', { spec: EngineSpec });
export const StopEngineRequest = request('stop-engine', { name: z.string() });
export const StatusRequest = request('status', {});
export const ShutdownRequest = request('shutdown', {});
export const TrainerStartRequest = request('trainer-start', { spec: TrainerSpec });
/** Idempotent by `batchId`: a batch already trained answers its stored result, `trained: false`. */
export const TrainerStepRequest = request('trainer-step', { batchId: z.string(), tasks: z.array(TrainTask) });
export const TrainerLoadRequest = request('trainer-load', { checkpointPath: z.string() });
/**
 * Gather the trainer's full weights and push them into the engine at `engineUrl` with SGLang's
 * distributed weight update (gloo on CPU, NCCL on GPU). `weightVersion` must be the version the
 * trainer holds; the engine serves it once the push is done.
 */
export const TrainerPushWeightsRequest = request('trainer-push-weights', { engineUrl: z.string(), weightVersion: z.string() });
export const TrainerStopRequest = request('trainer-stop', {});

export const BridgeRequest = z.discriminatedUnion('type', [
  PingRequest,
  InitRayRequest,
  PlanPlacementRequest,
  CreatePlacementRequest,
  RemovePlacementRequest,
  StartEngineRequest,
  StopEngineRequest,
  StatusRequest,
  ShutdownRequest,
  TrainerStartRequest,
  TrainerStepRequest,
  TrainerLoadRequest,
  TrainerPushWeightsRequest,
  TrainerStopRequest,
]);
export type BridgeRequest = z.infer<typeof BridgeRequest>;
export type BridgeRequestType = BridgeRequest['type'];
/** What a caller fills in for a request of type `T` (the client adds `type` and `requestId`). */
export type RequestFields<T extends BridgeRequestType> = Omit<Extract<BridgeRequest, { type: T }>, 'type' | 'requestId'>;

// --- replies -------------------------------------------------------------------------------------

function ok<S extends z.ZodRawShape>(shape: S) {
  return z.strictObject({ type: z.literal('ok'), requestId: z.string(), ...shape });
}

export const PingReply = ok({ pid: int(), version: z.string(), rayConnected: z.boolean() });
export const InitRayReply = ok({ address: z.string(), startedHead: z.boolean(), resources: Resources });
export const PlanPlacementReply = ok({ plan: Plan });
export const CreatePlacementReply = ok({ groups: z.array(GroupStatus) });
export const RemovePlacementReply = ok({ removed: z.array(z.string()) });
export const StartEngineReply = ok({ engine: EngineInfo });
export const StopEngineReply = ok({ stopped: z.boolean() });
export const StatusReply = ok({ ray: RayStatus.nullable(), groups: z.array(GroupStatus), engines: z.array(EngineInfo) });
export const ShutdownReply = ok({});
export const TrainerStartReply = ok({ worldSize: int(), device: z.string(), pids: z.array(int()), weightVersion: z.string() });
export const TrainerStepReply = ok({
  batchId: z.string(),
  weightVersion: z.string(),
  checkpointPath: z.string(),
  metrics: z.record(z.string(), z.number()),
  stepMs: z.number(),
  trained: z.boolean(),
});
export const TrainerLoadReply = ok({ weightVersion: z.string() });
/** `backend`: the group's (`gloo`, `nccl`), or `ipc` for the colocated push by `update_weights_from_tensor`. */
export const TrainerPushWeightsReply = ok({ weightVersion: z.string(), backend: z.enum(['gloo', 'nccl', 'ipc']), bytes: int(), seconds: z.number() });
export const TrainerStopReply = ok({});

/** The ok reply schema of each request type. */
export const REPLY_SCHEMAS = {
  ping: PingReply,
  'init-ray': InitRayReply,
  'plan-placement': PlanPlacementReply,
  'create-placement': CreatePlacementReply,
  'remove-placement': RemovePlacementReply,
  'start-engine': StartEngineReply,
  'stop-engine': StopEngineReply,
  status: StatusReply,
  shutdown: ShutdownReply,
  'trainer-start': TrainerStartReply,
  'trainer-step': TrainerStepReply,
  'trainer-load': TrainerLoadReply,
  'trainer-push-weights': TrainerPushWeightsReply,
  'trainer-stop': TrainerStopReply,
} as const satisfies Record<BridgeRequestType, z.ZodType>;

export type ReplyOf<T extends BridgeRequestType> = z.infer<(typeof REPLY_SCHEMAS)[T]>;
export type PingReply = ReplyOf<'ping'>;
export type InitRayReply = ReplyOf<'init-ray'>;
export type StatusReply = ReplyOf<'status'>;
export type TrainerStartReply = ReplyOf<'trainer-start'>;
export type TrainerStepReply = ReplyOf<'trainer-step'>;
export type TrainerPushWeightsReply = ReplyOf<'trainer-push-weights'>;

export const ErrorReply = z.strictObject({
  type: z.literal('error'),
  requestId: z.string().nullable(),
  code: z.string(),
  message: z.string(),
  retryable: z.boolean(),
});
