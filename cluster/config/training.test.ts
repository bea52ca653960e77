import { describe, expect, it } from 'vitest';
import { OPENCLAWRL_TRAINING_OPTIONS } from '../../recipes/openclawrl/options.js';
import { formatIssue } from './errors.js';
import { parseTrainingOptions } from './training.js';

const parse = (options: string[]) => parseTrainingOptions(options, OPENCLAWRL_TRAINING_OPTIONS);

describe('training.options', () => {
  it('defaults come from ARCHITECTURE.md §4', () => {
    expect(parse([]).resolved).toEqual({ wRl: 1, wOpd: 1, clipC: 1, hintSelection: 'sequence_optimal', oldLogprobs: 'trainer', tisCap: 2, klCoef: 0, lr: 1e-5, epsLow: 0.2, epsHigh: 0.28, weightDecay: 0.1, betas: [0.9, 0.98], clipGrad: 1, topK: 4, dtype: 'fp32', microBatchTokens: 2048, gradCheckpointing: 'off' });
  });

  const good: { options: string[]; want: Record<string, unknown> }[] = [
    { options: ['--openclawrl-w-rl=0.5', '--openclawrl-w-opd', '2'], want: { wRl: 0.5, wOpd: 2 } },
    { options: ['--openclawrl-adv-diff-clip=0.5'], want: { clipC: 0.5 } },
    { options: ['--openclawrl-hint-selection', 'token_optimal'], want: { hintSelection: 'token_optimal' } },
    { options: ['--lr=3e-6', '--weight-decay=0'], want: { lr: 3e-6, weightDecay: 0 } },
    { options: ['--eps-clip=0.1', '--eps-clip-high', '0.3'], want: { epsLow: 0.1, epsHigh: 0.3 } },
    { options: ['--adam-beta1=0.8', '--adam-beta2=0.95'], want: { betas: [0.8, 0.95] } },
    { options: ['--topk', '8'], want: { topK: 8 } },
    { options: ['--openclawrl-w-opd=0'], want: { wOpd: 0 } },
    { options: ['--dtype', 'bf16'], want: { dtype: 'bf16' } },
    { options: ['--openclawrl-hint-selection=shortest'], want: { hintSelection: 'shortest' } },
    { options: ['--openclawrl-old-logprobs=engine'], want: { oldLogprobs: 'engine' } },
    { options: ['--openclawrl-tis-cap=0'], want: { tisCap: 0 } },
    { options: ['--openclawrl-tis-cap', '1.5'], want: { tisCap: 1.5 } },
    { options: ['--kl-coef=0.05'], want: { klCoef: 0.05 } },
    { options: ['--clip-grad=0'], want: { clipGrad: 0 } },
    { options: ['--clip-grad', '0.5'], want: { clipGrad: 0.5 } },
    { options: ['--micro-batch-tokens=0'], want: { microBatchTokens: 0 } },
    { options: ['--micro-batch-tokens', '4096'], want: { microBatchTokens: 4096 } },
    { options: ['--grad-checkpointing=on'], want: { gradCheckpointing: 'on' } },
  ];
  it.each(good)('accepts $options', ({ options, want }) => {
    const r = parse(options);
    expect(r.issues).toEqual([]);
    expect(r.resolved).toMatchObject(want);
  });

  const bad: { options: string[]; lines: string[] }[] = [
    { options: ['--lr=0.1', '--learning-rate=1'], lines: ['training.options[1]: unknown option --learning-rate'] },
    { options: ['--topkk=3'], lines: ['training.options[0]: unknown option --topkk; did you mean --topk?'] },
    { options: ['--lr=fast'], lines: ['training.options[0]: --lr: expected a positive number, got "fast"'] },
    { options: ['--lr='], lines: ['training.options[0]: --lr: expected a positive number, got ""'] },
    { options: ['--lr=0x10'], lines: ['training.options[0]: --lr: expected a positive number, got "0x10"'] },
    { options: ['--topk=2.5'], lines: ['training.options[0]: --topk: expected a positive integer, got "2.5"'] },
    { options: ['--adam-beta2=1'], lines: ['training.options[0]: --adam-beta2: expected a number in [0, 1), got "1"'] },
    { options: ['--openclawrl-hint-selection=best'], lines: ['training.options[0]: --openclawrl-hint-selection: expected one of sequence_optimal, token_optimal, shortest, got "best"'] },
    { options: ['--openclawrl-old-logprobs=rollout'], lines: ['training.options[0]: --openclawrl-old-logprobs: expected one of engine, trainer, got "rollout"'] },
    { options: ['--openclawrl-tis-cap=0.5'], lines: ['training.options[0]: --openclawrl-tis-cap: expected 0 (off) or a number >= 1, got "0.5"'] },
    { options: ['--kl-coef=-0.1'], lines: ['training.options[0]: --kl-coef: expected a number >= 0, got "-0.1"'] },
    { options: ['--clip-grad=-1'], lines: ['training.options[0]: --clip-grad: expected a number >= 0, got "-1"'] },
    { options: ['--micro-batch-tokens=1.5'], lines: ['training.options[0]: --micro-batch-tokens: expected an integer >= 0, got "1.5"'] },
    { options: ['--grad-checkpointing=yes'], lines: ['training.options[0]: --grad-checkpointing: expected one of off, on, got "yes"'] },
    { options: ['--dtype=fp16'], lines: ['training.options[0]: --dtype: expected one of fp32, bf16, got "fp16"'] },
    { options: ['--openclawrl-w-rl=-1'], lines: ['training.options[0]: --openclawrl-w-rl: expected a number >= 0, got "-1"'] },
    { options: ['--lr'], lines: ['training.options[0]: --lr needs a value'] },
    { options: ['--lr', '--topk=2'], lines: ['training.options[0]: --lr needs a value'] },
    { options: ['lr=1'], lines: ['training.options[0]: expected --option=value, got "lr=1"'] },
    { options: ['--lr=1e-5', '--lr=2e-5'], lines: ['training.options[1]: --lr is already given at training.options[0]'] },
    // The first --lr is item 0; its value, item 1, was named as where it was given.
    { options: ['--lr', '1e-5', '--lr=2e-5'], lines: ['training.options[2]: --lr is already given at training.options[0]'] },
    { options: ['--topk', '3', '--lr=1', '--topk', '4'], lines: ['training.options[3]: --topk is already given at training.options[0]'] },
    { options: ['--topk', '3', '--bogus', '--eps-clip=2'], lines: ['training.options[2]: unknown option --bogus', 'training.options[3]: --eps-clip: expected a number in [0, 1), got "2"'] },
  ];
  it.each(bad)('rejects $options', ({ options, lines }) => {
    const r = parse(options);
    expect(r.issues.map(formatIssue)).toEqual(lines);
    expect(r.resolved).toBeNull();
  });
});
