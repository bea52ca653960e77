import { existsSync, renameSync } from 'node:fs';
import { join } from 'node:path';
import { BridgeClient, defaultTimeoutMs } from '../../bridge/client.js';
import type { TrainingOptions, TrainTask } from '../../bridge/messages.js';
import { EngineClient } from '../../cluster/engine-client.js';
import type { ReefConfig } from '../../cluster/config/index.js';
import { f32ToBytes, i32ToBytes } from '../runtime/codec.js';
import { ReefError } from '../runtime/errors.js';
import { RpcClient } from '../runtime/rpc.js';
import { lookupMailbox } from '../../cluster/lookup.js';
import type { SqliteStore } from '../gateway/store/sqlite-store.js';
import { ChatTokenizer } from '../gateway/tokenize/index.js';
import { renderChat } from '../gateway/tokenize/prepare.js';
import type { Task } from '../../recipes/openclawrl/record2task.js';
import { reportReader } from '../../recipes/openclawrl/outcomes.js';
import { stepRewardOptions, type Task2BatchConfig } from '../../recipes/openclawrl/stages.js';
import { TrainerController, type JudgedTurnRow, type Published, type SavedControllerState } from './controller.js';
import { readRelease } from './releases.js';
import { EngineWeights, type Weights } from './engine-weights.js';
import { CONSUMER, STATE_KEY } from './messages.js';
import { STATE_KEY as JUDGE_STATE_KEY } from '../judge/handler.js';

/** Wires the controller to the store, the bridge (trainer group), the gateway and the engine. */

/** How long `pause-generation` waits for the requests in flight before the swap goes ahead. */
const DRAIN_TIMEOUT_MS = 30_000;
/** The engine client's limit on one request, `update_weights_from_disk` included. */
const ENGINE_REQUEST_TIMEOUT_MS = 300_000;
/** On top of the swap's own limits: connecting the bridge, the gateway calls, a loaded machine. */
const PAUSE_MARGIN_MS = 60_000;
/** Colocated, the gateway stays paused through a step: its drain, the step (bridge/client.ts trainer-step), a margin. */
export const COLOCATED_STEP_PAUSE_MS = DRAIN_TIMEOUT_MS + defaultTimeoutMs('trainer-step', { batchId: '', tasks: [] }) + PAUSE_MARGIN_MS;
/** The label an engine serving the base weights is reloaded under when no release exists yet. */
const BASE_LABEL = 'base';

/**
 * The `maxPauseMs` a swap asks the gateway for: after it the gateway resumes by itself, so that a
 * controller that died mid-swap does not stop serving for good. It must outlast the longest swap a
 * live controller can make, or the gateway would admit requests onto half-loaded weights: the
 * drain, then a push that may run to its bridge timeout before it falls back, then the disk load
 * to the engine client's timeout. A rollback never pushes.
 */
export function maxPauseMs(pushes: boolean): number {
  const push = pushes ? defaultTimeoutMs('trainer-push-weights', { engineUrl: '', weightVersion: '' }) : 0;
  return DRAIN_TIMEOUT_MS + push + ENGINE_REQUEST_TIMEOUT_MS + PAUSE_MARGIN_MS;
}

export interface WiringOptions {
  config: ReefConfig;
  store: SqliteStore;
  shimEndpoint: string;
  rolloutUrl: string;
  supervisor: string | null;
  log: (line: string) => void;
}

type WireBytes = TrainTask['promptIds'];
const i32 = (a: ArrayLike<number>) => i32ToBytes(a) as unknown as WireBytes;
const f32 = (a: ArrayLike<number>) => f32ToBytes(a) as unknown as WireBytes;

export function toWire(t: Task): TrainTask {
  return {
    taskId: t.taskId,
    promptIds: i32(t.promptIds),
    responseIds: i32(t.responseIds),
    logprobs: f32(t.logprobs),
    topK: t.topK,
    topkIds: i32(t.topkIds),
    topkLogprobs: f32(t.topkLogprobs),
    reward: t.reward,
    teacherPromptIds: t.teacherPromptIds.map((p) => i32(p)),
    sampling: t.sampling,
    weightVersion: t.weightVersion,
  };
}

/** Counter names a judged turn adds to its batch's record line. */
export function turnCounters(judgment: unknown, decision: string, candidates: number): string[] {
  const j = (judgment ?? {}) as { nextState?: { role?: string }; score?: { result?: number } };
  const out: string[] = [];
  if (j.nextState?.role) out.push(`next_state:${j.nextState.role}`);
  if (typeof j.score?.result === 'number') out.push(`eval:${j.score.result}`);
  if (decision === 'hint') out.push('hint_accepted');
  else out.push('hint_declined');
  if (decision === 'anchor') out.push('anchor_only');
  if (decision === 'dropped') out.push('declined');
  for (let i = 0; i < candidates; i++) out.push('teacher_cands');
  return out;
}

/**
 * Asks the gateway to resume, weights unchanged. Only a controller pauses the gateway, so at its
 * start any pause is one its predecessor left when it died between pause and resume; waiting for
 * the pause's own bound would keep requests failing for up to `maxPauseMs`. Best effort: the gateway
 * may not be up (yet), and a start must not fail for it.
 */
async function resumeLeftoverPause(gatewayRpc: () => Promise<RpcClient | null>, log: (line: string) => void): Promise<void> {
  try {
    const gw = await gatewayRpc();
    if (!gw) return;
    try {
      await gw.call({ type: 'resume-generation', weightVersion: null }, { timeoutMs: 5_000 });
    } finally {
      await gw.close();
    }
  } catch (err) {
    log(`could not ask the gateway to resume at start (${(err as Error).message}); a pause left behind ends at its maxPauseMs`);
  }
}

/** The trainer group's ledger of trained batches in the checkpoint directory (python_shim/reef_shim/trainer/checkpoint.py `LEDGER`). */
export const LEDGER_FILE = 'reef_trainer_ledger.json';

/**
 * A store without the controller's state has never formed a batch (a batch is saved before it is
 * stepped), so a ledger in the checkpoint directory is another run's: the store was removed and
 * the checkpoints kept. Its batch ids (`{scenario}:openclawrl:{n}`) are the ones this run forms
 * first, and the trainer would answer them from it with that run's checkpoints, never trained on
 * this run's turns. Set aside under another name, not deleted; returns where it went.
 */
export function setAsideEarlierLedger(checkpointDir: string, log: (line: string) => void, now = new Date()): string | null {
  const path = join(checkpointDir, LEDGER_FILE);
  if (!existsSync(path)) return null;
  const to = join(checkpointDir, `${LEDGER_FILE.replace(/\.json$/, '')}.before-${now.toISOString().replace(/[:.]/g, '-')}.json`);
  renameSync(path, to);
  log(`the store has no trainer-controller state, so the batch ledger in ${checkpointDir} is an earlier run's: set aside as ${to}, so that this run's batches train rather than take that run's checkpoints`);
  return to;
}

export async function createController(w: WiringOptions): Promise<{ controller: TrainerController; close(): Promise<void> }> {
  const cfg = w.config;
  const t2b = cfg.pipeline.task2batch.config as { batch_size: number; prm_record_file: string | null; max_staleness: number };
  const opts = cfg.training.resolved as unknown as TrainingOptions;
  const checkpointDir = join(cfg.reef.data_dir, 'checkpoints');
  const tokenizer = ChatTokenizer.load(cfg.cluster.rollout.model_path);
  const engine = new EngineClient(w.rolloutUrl, { name: 'rollout', requestTimeoutMs: ENGINE_REQUEST_TIMEOUT_MS });
  const weights = new EngineWeights(engine, w.log);
  // What the engine served before a load: the current release's checkpoint, or the base model.
  const lastGood = (): Weights => ({ path: controller.lastCheckpoint ?? cfg.cluster.rollout.model_path, version: controller.currentVersion ?? BASE_LABEL });
  let bridge: BridgeClient | null = null;
  const getBridge = async () => {
    if (!bridge || bridge.isDown) {
      await bridge?.close();
      bridge = await BridgeClient.connect(w.shimEndpoint, { timeoutMs: 10_000, log: w.log });
    }
    return bridge;
  };
  let started = false;
  const startTrainer = async (checkpointPath: string | null) => {
    const b = await getBridge();
    const spec = { modelPath: cfg.cluster.rollout.model_path, ranks: cfg.cluster.trainer.gpus, backend: cfg.training.backend, options: opts, engineLogprobs: cfg.training.engine_logprobs, checkpointDir, seed: 0, group: 'reef-trainer' as const };
    const reply = await b.trainerStart(spec);
    w.log(`trainer group up: ${reply.worldSize} ranks on ${reply.device} (pids ${reply.pids.join(', ')})`);
    if (checkpointPath) await b.trainerLoad(checkpointPath);
    started = true;
  };
  const gatewayRpc = async (): Promise<RpcClient | null> => {
    if (!w.supervisor) return null;
    const mailbox = await lookupMailbox(w.supervisor, 'gateway');
    return mailbox ? new RpcClient(mailbox, { name: 'tc→gateway', defaultTimeoutMs: 60_000 }) : null;
  };

  const push = async (version: string): Promise<Published> => {
    const sync = cfg.training.weight_sync === 'tensor' ? 'tensor' : 'distributed';
    try {
      const r = await (await getBridge()).trainerPushWeights(w.rolloutUrl, version);
      w.log(`pushed ${version} into the rollout engine: ${(r.bytes / 1e6).toFixed(1)} MB over ${r.backend} in ${r.seconds.toFixed(2)} s`);
      return { sync, fallback: null };
    } catch (err) {
      const why = (err as Error).message;
      w.log(`${sync} weight sync of ${version} failed (${why}); loading its checkpoint from disk instead`);
      return { sync: 'disk', fallback: why };
    }
  };

  // Colocated (cluster.colocate), the engine gives its memory to the trainer for each step: the
  // gateway is paused from before the step until the release is in the engine, and the weights,
  // which do not survive the release, come back by the push (or from the checkpoint) before it
  // resumes. `released` is whether the engine's memory is out now.
  const colocated = cfg.cluster.colocate;
  let released = false;
  const withGateway = async (fn: (gw: RpcClient) => Promise<unknown>) => {
    const gw = await gatewayRpc();
    try {
      if (gw) await fn(gw);
    } finally {
      await gw?.close();
    }
  };
  const releaseEngine = async () => {
    await withGateway((gw) => gw.call({ type: 'pause-generation', drainTimeoutMs: DRAIN_TIMEOUT_MS, maxPauseMs: COLOCATED_STEP_PAUSE_MS }));
    try {
      await engine.releaseMemory();
      released = true;
    } catch (err) {
      const why = (err as Error).message;
      // A retried step finds it released by the attempt before.
      if (/already released/.test(why)) released = true;
      else w.log(`the rollout engine did not give its memory back for the step (${why}); the trainer steps beside it`);
    }
  };
  /** After a failed step: the engine's memory back, the weights it served loaded again, the gateway resumed. */
  const restoreEngine = async () => {
    try {
      if (released) {
        await engine.resumeMemory();
        released = false;
        // Nothing else to fall back to: these are the weights it served.
        await weights.load(lastGood(), null);
      }
    } finally {
      await withGateway((gw) => gw.call({ type: 'resume-generation', weightVersion: null })).catch((err: unknown) =>
        w.log(`the gateway did not take the resume after a failed step (${(err as Error).message}); it admits requests again after its pause bound`),
      );
    }
  };

  const [offset, state] = await Promise.all([w.store.getOffset(CONSUMER), w.store.getState(STATE_KEY)]);
  // Colocated, an engine released by a controller that died mid-step serves nothing until its
  // memory and weights are back (the publish restore below cannot see it: its label is unchanged).
  let recoverReleased = colocated;
  if (state === null) setAsideEarlierLedger(checkpointDir, w.log);
  // eslint-disable-next-line prefer-const -- read by the ports above, which run only after this is set
  let controller: TrainerController;
  controller = new TrainerController(
    {
      readJudged: async (from, limit): Promise<JudgedTurnRow[]> => {
        const rows: JudgedTurnRow[] = [];
        for (const t of await w.store.readJudgedTurns(from, limit)) {
          rows.push({
            offset: t.offset,
            scenario: t.scenario,
            turnRecordId: t.turnRecordId,
            decision: t.decision,
            reward: t.reward,
            hints: t.teacherCandidates.filter((c): c is string => c !== null),
            counters: turnCounters(await w.store.getJudgment(t.turnRecordId), t.decision, t.teacherCandidates.length),
          });
        }
        return rows;
      },
      getRecord: (id) => w.store.get(id),
      noteBatchTurns: (batchId, scenario, turns) => w.store.putBatchTurns(batchId, scenario, turns),
      commit: (next, s, rows) => w.store.commitConsumer(CONSUMER, next, STATE_KEY, s, rows),
      getRelease: (id) => readRelease(w.store, id),
      // As the gateway rendered the turn's own prompt, so that the hint is the only difference.
      renderTeacher: async (messages, tools, extra) => renderChat(tokenizer, messages, tools, { addGenerationPrompt: true, extra }).ids,
      trainer: {
        restart: async (checkpointPath) => {
          started = false;
          await startTrainer(checkpointPath);
        },
        // The controller starts the group (from its last release) before its first step.
        step: async (batchId, tasks) => {
          if (!colocated) return (await getBridge()).trainerStep(batchId, tasks.map(toWire));
          await releaseEngine();
          try {
            return await (await getBridge()).trainerStep(batchId, tasks.map(toWire));
          } catch (err) {
            await restoreEngine();
            throw err;
          }
        },
        load: async (path) => {
          if (!started) await startTrainer(null);
          await (await getBridge()).trainerLoad(path);
        },
      },
      publish: async (path, version, kind): Promise<Published> => {
        // Bracket the swap with the gateway's pause/resume: requests in flight finish, new ones wait.
        const gw = await gatewayRpc();
        const pushes = kind === 'release' && cfg.training.weight_sync !== 'disk';
        try {
          // Colocated, the step's pause is still on: this one renews its bound.
          if (gw) await gw.call({ type: 'pause-generation', drainTimeoutMs: DRAIN_TIMEOUT_MS, maxPauseMs: maxPauseMs(pushes) });
          if (released) {
            await engine.resumeMemory();
            released = false;
          }
          let published: Published = { sync: 'disk', fallback: null };
          if (pushes) published = await push(version);
          if (published.sync === 'disk') {
            // The checkpoint holds the same weights: a failed (even part-way) push is made whole
            // here. A restore loads what the engine should serve already: nothing before it to go back to.
            await weights.load({ path, version }, kind === 'restore' ? null : lastGood());
          } else {
            weights.pushed();
          }
          if (gw) await gw.call({ type: 'resume-generation', weightVersion: version });
          return published;
        } catch (err) {
          if (gw) {
            // Unanswered, the gateway stays paused until its own bound (up to maxPauseMs) lets requests through.
            await gw.call({ type: 'resume-generation', weightVersion: null }).catch((resumeErr: unknown) =>
              w.log(`publish of ${version} failed and the gateway did not take the resume (${(resumeErr as Error).message}); it admits requests again after its pause bound`),
            );
          }
          throw err;
        } finally {
          await gw?.close();
        }
      },
      servedVersion: async () => weights.served((await engine.modelInfo()).weight_version ?? null),
      // The judge saves its correlator's head (with the cumulative counters) under this key
      // (actors/judge/handler.ts). Only the counters: beside them are every pending turn's lease.
      correlation: async () => ((await w.store.getStateFields(JUDGE_STATE_KEY, ['$.correlator.counters']))?.values[0] as Record<string, number> | null) ?? {},
      log: w.log,
      readReports: reportReader(w.store),
    },
    {
      batchSize: t2b.batch_size,
      maxStaleness: t2b.max_staleness,
      recordFile: t2b.prm_record_file,
      keepCheckpoints: cfg.training.keep_checkpoints,
      baseModelPath: cfg.cluster.rollout.model_path,
      maxAttempts: 3,
      train: cfg.training.enabled,
      steps: stepRewardOptions(cfg.pipeline.task2batch.config as Task2BatchConfig),
    },
    offset,
    (state as SavedControllerState | null) ?? null,
  );
  if (recoverReleased) {
    try {
      await engine.resumeMemory();
      // It was released: the weights it held are gone.
      const good = lastGood();
      const loaded = await weights.load(good, null).then(
        () => '',
        (err: unknown) => ` — refused: ${(err as Error).message}`,
      );
      w.log(`the rollout engine's memory was still given back to the trainer (a controller stopped mid-step): taken back, ${good.path} loaded${loaded}`);
    } catch {
      // Not released (the usual case): nothing to take back.
    }
    recoverReleased = false;
  }
  await resumeLeftoverPause(gatewayRpc, w.log);
  return {
    controller,
    close: async () => {
      await bridge?.close();
      await engine.close();
    },
  };
}
