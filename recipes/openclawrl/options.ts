/** The OpenClaw-RL `training.options` flags (ARCHITECTURE.md §4) and their resolved form. */
import { z } from 'zod';
import { nonNegativeInt, nonNegativeNumber, numberIn, oneOf, positiveInt, positiveNumber } from '../../cluster/config/kit.js';
import type { TrainingOptionSpec, TrainingOptionsSpec } from '../../cluster/config/types.js';

export type HintSelection = 'sequence_optimal' | 'token_optimal' | 'shortest';
export type TrainerDtype = 'fp32' | 'bf16';
export type OldLogprobs = 'engine' | 'trainer';
export type OnOff = 'on' | 'off';

/** `training.resolved` for this recipe. */
export interface OpenClawRLTraining {
  readonly wRl: number;
  readonly wOpd: number;
  /** C: bound on the teacher-minus-old log-prob difference. */
  readonly clipC: number;
  readonly hintSelection: HintSelection;
  /** Where ℓold comes from: the engine's recorded logprobs, or the trainer's own forward (docs/training.md). */
  readonly oldLogprobs: OldLogprobs;
  /** Cap of the per-token truncated importance weight against the engine (`oldLogprobs: trainer`); 0 = no weight. */
  readonly tisCap: number;
  /** Coefficient of the KL-to-base term; 0 = off (no extra forward). */
  readonly klCoef: number;
  readonly lr: number;
  readonly epsLow: number;
  readonly epsHigh: number;
  readonly weightDecay: number;
  readonly betas: readonly [number, number];
  /** Global gradient-norm clip; 0 = off. */
  readonly clipGrad: number;
  readonly topK: number;
  /** The trainer's compute dtype (docs/training.md, "Which distribution"). */
  readonly dtype: TrainerDtype;
  /** Token budget of one policy forward/backward (gradient accumulation); 0 = one per rank. */
  readonly microBatchTokens: number;
  /** Activation checkpointing of the policy's decoder layers. */
  readonly gradCheckpointing: OnOff;
}

const num = (flag: string, key: string, schema: z.ZodType, dflt: number, help: string): TrainingOptionSpec => ({ flag, key, kind: 'number', schema, default: dflt, help });
const str = (flag: string, key: string, values: readonly [string, ...string[]], dflt: string, help: string): TrainingOptionSpec => ({ flag, key, kind: 'string', schema: oneOf(values), default: dflt, help });

/** 0 (off) or a number >= 1: a truncated importance weight's cap below 1 would shrink every token. */
const offOrAtLeastOne = () => {
  const e = { error: 'expected 0 (off) or a number >= 1' };
  return z.number(e).refine((v) => v === 0 || v >= 1, e);
};

const OPTIONS: readonly TrainingOptionSpec[] = [
  num('--openclawrl-w-rl', 'wRl', nonNegativeNumber(), 1.0, 'weight of the RL loss'),
  num('--openclawrl-w-opd', 'wOpd', nonNegativeNumber(), 1.0, 'weight of the on-policy distillation loss'),
  num('--openclawrl-adv-diff-clip', 'clipC', positiveNumber(), 1.0, 'C: teacher-minus-old log-prob differences are clipped to [-C, C]'),
  str('--openclawrl-hint-selection', 'hintSelection', ['sequence_optimal', 'token_optimal', 'shortest'], 'sequence_optimal', 'how the teacher hint is chosen: by top-K overlap per sequence or per token, or the shortest hint (fewest teacher-prompt tokens)'),
  str('--openclawrl-old-logprobs', 'oldLogprobs', ['engine', 'trainer'], 'trainer', "ℓold: the trainer's own forward, detached (the engine's logprobs then weight each token by truncated importance sampling), or the engine's recorded logprobs"),
  num('--openclawrl-tis-cap', 'tisCap', offOrAtLeastOne(), 2.0, 'cap C of the truncated importance weight min(π_trainer/π_engine, C) per token (--openclawrl-old-logprobs=trainer); 0 = no weight'),
  num('--kl-coef', 'klCoef', nonNegativeNumber(), 0, 'coefficient of the exact KL(policy ‖ base model) per response token; 0 = off, no extra forward'),
  num('--lr', 'lr', positiveNumber(), 1e-5, 'AdamW learning rate'),
  num('--eps-clip', 'epsLow', numberIn(0, 1), 0.2, 'ε_low: lower clip of the ratio (1 - ε_low)'),
  num('--eps-clip-high', 'epsHigh', positiveNumber(), 0.28, 'ε_high: upper clip of the ratio (1 + ε_high)'),
  num('--weight-decay', 'weightDecay', nonNegativeNumber(), 0.1, 'AdamW weight decay'),
  num('--adam-beta1', 'beta1', numberIn(0, 1), 0.9, 'AdamW β1'),
  num('--adam-beta2', 'beta2', numberIn(0, 1), 0.98, 'AdamW β2'),
  num('--clip-grad', 'clipGrad', nonNegativeNumber(), 1.0, 'the gradient is scaled down to this global norm when above it; 0 = off'),
  num('--topk', 'topK', positiveInt(), 4, 'K: top-K log-probs recorded at generation and used by OPD'),
  str('--dtype', 'dtype', ['fp32', 'bf16'], 'fp32', "the trainer's compute dtype: fp32 throughout, or bf16 compute over fp32 master weights with a bf16 teacher; match the rollout engine's dtype"),
  num('--micro-batch-tokens', 'microBatchTokens', nonNegativeInt(), 2048, "a rank's tasks run through the policy in forward/backward passes of at most this many (padded) tokens, accumulating the gradient; 0 = all at once"),
  str('--grad-checkpointing', 'gradCheckpointing', ['off', 'on'], 'off', "recompute each decoder layer's activations in backward instead of keeping them"),
];

export const OPENCLAWRL_TRAINING_OPTIONS: TrainingOptionsSpec = {
  options: OPTIONS,
  resolve(v): OpenClawRLTraining {
    return {
      wRl: v.wRl as number,
      wOpd: v.wOpd as number,
      clipC: v.clipC as number,
      hintSelection: v.hintSelection as HintSelection,
      oldLogprobs: v.oldLogprobs as OldLogprobs,
      tisCap: v.tisCap as number,
      klCoef: v.klCoef as number,
      lr: v.lr as number,
      epsLow: v.epsLow as number,
      epsHigh: v.epsHigh as number,
      weightDecay: v.weightDecay as number,
      betas: [v.beta1 as number, v.beta2 as number],
      clipGrad: v.clipGrad as number,
      topK: v.topK as number,
      dtype: v.dtype as TrainerDtype,
      microBatchTokens: v.microBatchTokens as number,
      gradCheckpointing: v.gradCheckpointing as OnOff,
    };
  },
};
