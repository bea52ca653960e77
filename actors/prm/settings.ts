import type { ReefConfig } from '../../cluster/config/types.js';
import type { StackEngines } from '../../cluster/stack-env.js';
import type { RedactionSettings } from './redact.js';
import { asOpenClawRL, type Record2RecordConfig } from '../../recipes/openclawrl/recipe.js';

/**
 * Where the PRM is and how to call it, read once from the config: `prm_url` names an external PRM;
 * empty, the stack's own PRM engines (`cluster.prm.replicas` > 0, URLs in `REEF_ENGINES`) serve;
 * with neither, the judge only correlates.
 */
export interface PrmSettings {
  mode: 'judge' | 'correlate-only';
  /** Engine base URLs; a PRM actor spreads its calls over them. Empty in correlate-only mode. */
  urls: string[];
  api: 'sglang' | 'openai';
  /** The chat template used for `sglang` prompts: `prm_tokenizer_path`, else the stack's PRM model. */
  tokenizerPath: string | null;
  model: string | null;
  apiKeyEnv: string | null;
  m: number;
  temperature: number;
  maxTokens: number;
  timeoutMs: number;
  concurrency: number;
  maxHintCandidates: number;
  stage: Readonly<Record2RecordConfig>;
  /** What is masked in the prompts (`reef.redaction`). @default null: nothing */
  redaction?: RedactionSettings | null;
}

export function prmSettings(cfg: ReefConfig, engines: StackEngines | null): PrmSettings {
  const stage = asOpenClawRL(cfg).pipeline.record2record.config;
  const external = stage.prm_url !== '';
  const own = !external && cfg.cluster.prm.replicas > 0;
  const urls = external ? [stage.prm_url] : own ? [...(engines?.prm ?? [])] : [];
  return {
    mode: external || own ? 'judge' : 'correlate-only',
    urls,
    api: stage.prm_api,
    tokenizerPath: stage.prm_tokenizer_path !== '' ? stage.prm_tokenizer_path : own ? cfg.cluster.prm.model_path : null,
    model: stage.prm_model,
    apiKeyEnv: stage.prm_api_key_env,
    m: stage.prm_m,
    temperature: stage.prm_temperature,
    maxTokens: stage.prm_max_tokens,
    timeoutMs: Math.round(stage.prm_timeout_s * 1000),
    concurrency: stage.prm_concurrency,
    maxHintCandidates: stage.prm_max_hint_candidates,
    stage,
    redaction: { builtin: cfg.reef.redaction.builtin, patterns: cfg.reef.redaction.patterns, applyTo: cfg.reef.redaction.apply_to },
  };
}
