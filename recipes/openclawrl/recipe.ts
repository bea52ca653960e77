/** The OpenClaw-RL recipe as `recipe.implementation` names it: its stages and training options. */
import { z } from 'zod';
import type { ReefConfig } from '../../cluster/config/types.js';
import { OPENCLAWRL_TRAINING_OPTIONS, type OpenClawRLTraining } from './options.js';
import { Record2RecordStage, Record2TaskStage, Task2BatchStage, type Record2RecordConfig, type Record2TaskConfig, type Task2BatchConfig } from './stages.js';

export class OpenClawRLRecipe {
  static readonly stages = { record2record: Record2RecordStage, record2task: Record2TaskStage, task2batch: Task2BatchStage } as const;
  /** `recipe.config`: this recipe takes none; stage keys go under `pipeline.<stage>.config`. */
  static readonly configSchema = z.strictObject({});
  static readonly trainingOptions = OPENCLAWRL_TRAINING_OPTIONS;
}

/** A resolved config whose recipe is OpenClaw-RL, with its stage configs typed. */
export type OpenClawRLConfig = ReefConfig & {
  readonly pipeline: {
    readonly record2record: { readonly config: Readonly<Record2RecordConfig> };
    readonly record2task: { readonly config: Readonly<Record2TaskConfig> };
    readonly task2batch: { readonly config: Readonly<Task2BatchConfig> };
  };
  readonly training: ReefConfig['training'] & { readonly resolved: OpenClawRLTraining };
};

/** Narrows a resolved config to this recipe's types (the loader already validated it). */
export function asOpenClawRL(cfg: ReefConfig): OpenClawRLConfig {
  if (cfg.recipe.implementation.split(':')[1] !== 'OpenClawRLRecipe') {
    throw new TypeError(`config uses recipe ${cfg.recipe.implementation}, not OpenClawRLRecipe`);
  }
  return cfg as OpenClawRLConfig;
}

export type { OpenClawRLTraining, HintSelection } from './options.js';
export { Record2RecordStage, Record2TaskStage, Task2BatchStage } from './stages.js';
export type { Record2RecordConfig, Record2TaskConfig, Task2BatchConfig } from './stages.js';
