/** The OpenClaw-RL recipe as `recipe.implementation` names it: its stages and training options. */
import { isAbsolute } from 'node:path';
import { z } from 'zod';
import type { ReefConfig } from '../../cluster/config/types.js';
import { OPENCLAWRL_TRAINING_OPTIONS, type OpenClawRLTraining } from './options.js';
import { Record2RecordStage, Record2TaskStage, Task2BatchStage, type Record2RecordConfig, type Record2TaskConfig, type Task2BatchConfig } from './stages.js';

/** `prm_url` pointing at the PRM engine Reef starts on its fixed port (stack.ts binds it to 127.0.0.1). */
function namesOwnEngine(url: string, port: number): boolean {
  if (port === 0) return false;
  try {
    const u = new URL(url);
    return ['127.0.0.1', 'localhost', '[::1]'].includes(u.hostname) && Number(u.port) === port;
  } catch {
    return false;
  }
}

export class OpenClawRLRecipe {
  static readonly stages = { record2record: Record2RecordStage, record2task: Record2TaskStage, task2batch: Task2BatchStage } as const;
  /** `recipe.config`: this recipe takes none; stage keys go under `pipeline.<stage>.config`. */
  static readonly configSchema = z.strictObject({});
  static readonly trainingOptions = OPENCLAWRL_TRAINING_OPTIONS;

  /** The PRM settings against the PRM engines Reef starts: each mismatch fails only once judging begins. */
  static crossCheck(cfg: ReefConfig): { path: string; message: string }[] {
    const stage = (cfg.pipeline.record2record.config ?? {}) as Partial<Record2RecordConfig>;
    const at = (key: string) => `pipeline.record2record.config.${key}`;
    const issues: { path: string; message: string }[] = [];
    const prm = cfg.cluster.prm;
    if (stage.prm_url && prm.replicas > 0 && !namesOwnEngine(stage.prm_url, prm.port)) {
      issues.push({ path: 'cluster.prm.replicas', message: `${prm.replicas} PRM engine(s) would start and never be called: ${at('prm_url')} names the PRM the judge calls; set replicas to 0, or leave prm_url empty to judge with these engines` });
    }
    if (!stage.prm_url && prm.replicas > 0) {
      if (stage.prm_api === 'openai' && prm.engine === 'hf') {
        issues.push({ path: at('prm_api'), message: "openai needs /v1/chat/completions, which the hf PRM engine does not serve: use sglang (its /generate), or cluster.prm.engine: sglang" });
      }
      // The stage schema asks for these only beside prm_url; the PRM actors need them here too.
      if (stage.prm_api === 'openai') {
        if (stage.prm_model == null) issues.push({ path: at('prm_model'), message: 'required when prm_api is openai' });
        if (stage.prm_api_key_env == null) issues.push({ path: at('prm_api_key_env'), message: 'required when prm_api is openai' });
      }
      // The PRM actors render judge prompts with this chat template themselves; a hub id here
      // is only fetched by the engine, so the actors would fail at their start.
      if (stage.prm_api === 'sglang' && !stage.prm_tokenizer_path && prm.model_path !== null && !isAbsolute(prm.model_path)) {
        issues.push({ path: at('prm_tokenizer_path'), message: `required: cluster.prm.model_path (${prm.model_path}) is a hub id, not a directory here, and the PRM actors read the PRM's chat template from a directory` });
      }
    }
    return issues;
  }
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
