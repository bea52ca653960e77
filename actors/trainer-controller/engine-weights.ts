import { ReefError } from '../runtime/errors.js';
import type { EngineClient } from '../../cluster/engine-client.js';

/** A checkpoint and the weight version it is served under. */
export interface Weights {
  path: string;
  version: string;
}

/** What `servedVersion` answers while the engine's weights cannot be named: no release matches it. */
export const UNKNOWN_WEIGHTS = '(unknown: a weight load failed)';

/** How long a flush after a load waits for the engine to go idle. */
export const FLUSH_WAIT_S = 30;

/**
 * Loads checkpoints into the rollout engine from disk so that, whatever fails, the engine ends up
 * serving weights Reef can name, or is known not to.
 *
 * A failed `update_weights_from_disk` is not "nothing changed" on SGLang 0.5.23: it points the
 * model at the new path before it loads (srt/model_executor/model_runner_components/
 * weight_updater.py:193), and its rollback after a failed load reads that new path again
 * (:228-238), so a bad checkpoint leaves the weights part new, part old, under the old version's
 * label. A failed load is therefore followed by a load of the last good weights. If that fails too,
 * `unknown` says why until a load succeeds, and the controller's check that the engine serves the
 * current release (which reads `servedVersion`, answered `UNKNOWN_WEIGHTS` meanwhile) loads the
 * release again at each check. The hf engine's loads are all or nothing; the reload costs one load
 * there.
 *
 * Each load is followed by a flush of the engine's prefix cache that waits for idle
 * (`EngineClient.flushCache`): the load itself goes with `flush_cache: false`, since 0.5.23 fails a
 * load whose flush met a running request, after loading the weights.
 */
export class EngineWeights {
  /** Why the engine's weights cannot be named; null while they are the last ones loaded or pushed. */
  unknown: string | null = null;

  constructor(
    private readonly engine: Pick<EngineClient, 'updateWeightsFromDisk' | 'flushCache'>,
    private readonly log: (line: string) => void,
    private readonly flushWaitS = FLUSH_WAIT_S,
  ) {}

  /**
   * Loads `target`. On failure loads `lastGood` back (unless it is the same checkpoint, or null),
   * then throws REEF_ERR_ENGINE_DOWN with the first failure's reason.
   */
  async load(target: Weights, lastGood: Weights | null): Promise<void> {
    let why: string;
    try {
      await this.loadOne(target);
      this.unknown = null;
      return;
    } catch (err) {
      why = (err as Error).message;
    }
    const failed = new ReefError('REEF_ERR_ENGINE_DOWN', { engine: 'rollout', reason: `weight update to ${target.version} (${target.path}) failed: ${why}` });
    if (lastGood === null || lastGood.path === target.path) {
      this.unknown = `loading ${target.path} failed (${why})`;
      this.log(`loading ${target.version} (${target.path}) into the rollout engine failed (${why}): what it serves now cannot be named (a failed load on SGLang leaves part of the new weights in)`);
      throw failed;
    }
    try {
      await this.loadOne(lastGood);
      this.unknown = null;
      this.log(`loading ${target.version} (${target.path}) into the rollout engine failed (${why}); ${lastGood.version} (${lastGood.path}) loaded back, as a failed load may leave part of the new weights in`);
    } catch (err) {
      this.unknown = `loading ${target.path} failed (${why}), and loading ${lastGood.path} back failed too (${(err as Error).message})`;
      this.log(`the rollout engine's weights cannot be named: ${this.unknown}; the current release is loaded again at each check of what it serves`);
    }
    throw failed;
  }

  /** A push put every weight in: they are the pushed release's again. */
  pushed(): void {
    this.unknown = null;
  }

  /** The served label, or UNKNOWN_WEIGHTS while the weights cannot be named. */
  served(label: string | null): string | null {
    return this.unknown === null ? label : UNKNOWN_WEIGHTS;
  }

  private async loadOne(w: Weights): Promise<void> {
    const r = await this.engine.updateWeightsFromDisk(w.path, w.version);
    if (!r.success) throw new Error(r.message);
    const f = await this.engine.flushCache(this.flushWaitS);
    if (!f.flushed) throw new Error(`the weights are in, but the engine was not idle within ${this.flushWaitS} s to drop the cache of the earlier ones: ${f.message}`);
  }
}
