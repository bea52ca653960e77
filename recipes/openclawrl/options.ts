/** The OpenClaw-RL `training.options` flags (ARCHITECTURE.md §4) and their resolved form. */
import { z } from 'zod';
import { nonNegativeNumber, numberIn, oneOf, positiveInt, positiveNumber } from '../../cluster/config/kit.js';
import type { TrainingOptionSpec, TrainingOptionsSpec } from '../../cluster/config/types.js';

export type HintSelection = 'sequence_optimal' | 'token_optimal';
export type TrainerDtype = 'fp32' | 'bf16';

/** `training.resolved` for this recipe. */
export interface OpenClawRLTraining {
  readonly wRl: number;
  readonly wOpd: number;
  /** C: bound on the teacher-minus-old log-prob difference. */
  readonly clipC: number;
  readonly hintSelection: HintSelection;
  readonly lr: number;
  readonly epsLow: number;
  readonly epsHigh: number;
  readonly weightDecay: number;
  readonly betas: readonly [number, number];
  readonly topK: number;
  /** The trainer's compute dtype (docs/training.md, "Which distribution"). */
  readonly dtype: TrainerDtype;
}

const num = (flag: string, key: string, schema: z.ZodType, dflt: number, help: string): TrainingOptionSpec => ({ flag, key, kind: 'number', schema, default: dflt, help });

const OPTIONS: readonly TrainingOptionSpec[] = [
  num('--openclawrl-w-rl', 'wRl', nonNegativeNumber(), 1.0, 'weight of the RL loss'),
  num('--openclawrl-w-opd', 'wOpd', nonNegativeNumber(), 1.0, 'weight of the on-policy distillation loss'),
  num('--openclawrl-adv-diff-clip', 'clipC', positiveNumber(), 1.0, 'C: teacher-minus-old log-prob differences are clipped to [-C, C]'),
  { flag: '--openclawrl-hint-selection', key: 'hintSelection', kind: 'string', schema: oneOf(['sequence_optimal', 'token_optimal']), default: 'sequence_optimal', help: 'how the teacher hint is chosen: per sequence or per token' },
  num('--lr', 'lr', positiveNumber(), 1e-5, 'AdamW learning rate'),
  num('--eps-clip', 'epsLow', numberIn(0, 1), 0.2, 'ε_low: lower clip of the ratio (1 - ε_low)'),
  num('--eps-clip-high', 'epsHigh', positiveNumber(), 0.28, 'ε_high: upper clip of the ratio (1 + ε_high)'),
  num('--weight-decay', 'weightDecay', nonNegativeNumber(), 0.1, 'AdamW weight decay'),
  num('--adam-beta1', 'beta1', numberIn(0, 1), 0.9, 'AdamW β1'),
  num('--adam-beta2', 'beta2', numberIn(0, 1), 0.98, 'AdamW β2'),
  num('--topk', 'topK', positiveInt(), 4, 'K: top-K log-probs recorded at generation and used by OPD'),
  { flag: '--dtype', key: 'dtype', kind: 'string', schema: oneOf(['fp32', 'bf16']), default: 'fp32', help: "the trainer's compute dtype: fp32 throughout, or bf16 compute over fp32 master weights with a bf16 teacher; match the rollout engine's dtype" },
];

export const OPENCLAWRL_TRAINING_OPTIONS: TrainingOptionsSpec = {
  options: OPTIONS,
  resolve(v): OpenClawRLTraining {
    return {
      wRl: v.wRl as number,
      wOpd: v.wOpd as number,
      clipC: v.clipC as number,
      hintSelection: v.hintSelection as HintSelection,
      lr: v.lr as number,
      epsLow: v.epsLow as number,
      epsHigh: v.epsHigh as number,
      weightDecay: v.weightDecay as number,
      betas: [v.beta1 as number, v.beta2 as number],
      topK: v.topK as number,
      dtype: v.dtype as TrainerDtype,
    };
  },
};
