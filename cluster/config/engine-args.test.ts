import { describe, expect, it } from 'vitest';
import { engineArgs } from './engine-args.js';
import { ConfigError, formatIssue, resolveConfig, type ReefConfig } from './index.js';

const BASE = '/srv/reef';
type Engine = { gpus?: number; engine?: 'hf' | 'sglang'; extra_args?: string[] };
const config = (rollout: Engine, prm: Engine & { replicas?: number } = {}, student: Engine | null = null) => ({
  cluster: { rollout: { model_path: '/models/policy', ...rollout }, prm: { model_path: '/models/prm', ...prm }, student: student === null ? null : { model_path: '/models/student', ...student } },
});
const ok = (raw: unknown): Promise<ReefConfig> => resolveConfig(raw, { baseDir: BASE });

async function errorsOf(raw: unknown): Promise<string[]> {
  try {
    await ok(raw);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).code).toBe('REEF_ERR_CONFIG_INVALID');
    return (err as ConfigError).issues.map(formatIssue);
  }
  throw new Error('expected the config to be rejected');
}

describe('engineArgs: the launch arguments after model, host and port', () => {
  // SGLang's TP size is 1 unless given: on 2 GPUs it ran on the first and left the other idle.
  it.each([
    { name: 'sglang on 1 GPU', e: { engine: 'sglang', gpus: 1, extra_args: ['--x'] }, want: ['--x'] },
    { name: 'sglang on 4 GPUs', e: { engine: 'sglang', gpus: 4, extra_args: ['--x'] }, want: ['--x', '--tp-size', '4'] },
    { name: 'the hf engine on 2 GPUs', e: { engine: 'hf', gpus: 2, extra_args: [] }, want: [] },
    { name: 'a TP size already given', e: { engine: 'sglang', gpus: 2, extra_args: ['--tp', '2'] }, want: ['--tp', '2'] },
    { name: 'a TP size given with =', e: { engine: 'sglang', gpus: 2, extra_args: ['--tensor-parallel-size=2'] }, want: ['--tensor-parallel-size=2'] },
    { name: 'data-parallel replicas share the GPUs', e: { engine: 'sglang', gpus: 4, extra_args: ['--dp-size', '2'] }, want: ['--dp-size', '2', '--tp-size', '2'] },
    { name: 'one replica per GPU', e: { engine: 'sglang', gpus: 2, extra_args: ['--dp=2'] }, want: ['--dp=2'] },
    { name: 'attention DP inside TP', e: { engine: 'sglang', gpus: 2, extra_args: ['--dp', '2', '--enable-dp-attention'] }, want: ['--dp', '2', '--enable-dp-attention', '--tp-size', '2'] },
  ] as const)('$name', ({ e, want }) => {
    expect(engineArgs({ ...e, extra_args: [...e.extra_args] })).toEqual(want);
  });

  it('is what a resolved config starts, with extra_args left as written', async () => {
    const cfg = await ok(config({ gpus: 2 }, { gpus: 2, engine: 'hf' }, { gpus: 8, extra_args: ['--mem-fraction-static', '0.8'] }));
    expect(cfg.cluster.rollout.extra_args).toEqual([]);
    expect(engineArgs(cfg.cluster.rollout)).toEqual(['--tp-size', '2']);
    expect(engineArgs(cfg.cluster.prm)).toEqual([]);
    expect(engineArgs(cfg.cluster.student!)).toEqual(['--mem-fraction-static', '0.8', '--tp-size', '8']);
  });
});

describe('resolve refuses sglang launch flags that break Reef, naming the argument', () => {
  const cases: { name: string; raw: unknown; line: string }[] = [
    { name: 'a TP size unlike gpus', raw: config({ gpus: 2, extra_args: ['--tp-size', '4'] }), line: 'cluster.rollout.extra_args[0]: --tp-size 4 takes 4 GPUs, but cluster.rollout.gpus is 2' },
    { name: 'a TP size unlike gpus, abbreviated with =', raw: config({ extra_args: ['--mem-fraction-static', '0.8', '--tp=2'] }), line: 'cluster.rollout.extra_args[2]: --tp 2 takes 2 GPUs, but cluster.rollout.gpus is 1' },
    { name: 'the last TP size is the one SGLang reads', raw: config({ gpus: 2, extra_args: ['--tp-size', '2', '--te', '4'] }), line: 'cluster.rollout.extra_args[2]: --te 4 takes 4 GPUs' },
    { name: 'a TP size that is no number', raw: config({ gpus: 2, extra_args: ['--tp-size', 'two'] }), line: 'cluster.rollout.extra_args[0]: --tp-size needs a positive integer, got "two"' },
    { name: 'a TP size without a value', raw: config({ extra_args: ['--tp-size'] }), line: 'cluster.rollout.extra_args[0]: --tp-size needs a positive integer, got nothing' },
    { name: 'a PRM TP size unlike its gpus', raw: config({}, { gpus: 2, extra_args: ['--tp', '1'] }), line: 'cluster.prm.extra_args[0]: --tp 1 takes 1 GPUs, but cluster.prm.gpus is 2' },
    { name: 'PRM replicas that do not divide its gpus', raw: config({}, { gpus: 3, extra_args: ['--dp-size', '2'] }), line: 'cluster.prm.extra_args[0]: --dp-size 2: dp × pp = 2 does not divide cluster.prm.gpus (3)' },
    { name: 'incremental streaming', raw: config({ extra_args: ['--mem-fraction-static', '0.8', '--incremental-streaming-output'] }), line: 'cluster.rollout.extra_args[2]: --incremental-streaming-output makes SGLang stream deltas' },
    { name: 'incremental streaming, abbreviated', raw: config({ extra_args: ['--inc'] }), line: 'cluster.rollout.extra_args[0]: --inc makes SGLang stream deltas' },
    { name: 'no tokenizer on the rollout engine', raw: config({ extra_args: ['--skip-tokenizer-init'] }), line: 'cluster.rollout.extra_args[0]: --skip-tokenizer-init makes SGLang answer /generate without text (srt/managers/tokenizer_manager.py:2675-2710), which the gateway reads' },
    { name: 'no tokenizer on the PRM', raw: config({}, { extra_args: ['--skip-tokenizer'] }), line: 'cluster.prm.extra_args[0]: --skip-tokenizer makes SGLang answer /generate without text (srt/managers/tokenizer_manager.py:2675-2710), which the judge reads' },
    { name: 'data parallel', raw: config({ gpus: 2, extra_args: ['--dp', '2'] }), line: "cluster.rollout.extra_args[0]: --dp 2: SGLang's weight routes assert one data-parallel replica" },
    { name: 'data parallel, long spelling', raw: config({ gpus: 2, extra_args: ['--data-parallel-size=2'] }), line: "cluster.rollout.extra_args[0]: --data-parallel-size 2: SGLang's weight routes assert one data-parallel replica" },
    { name: 'pipeline parallel', raw: config({ gpus: 2, extra_args: ['--pp-size', '2'] }), line: 'cluster.rollout.extra_args[0]: --pp-size 2: SGLang ranks each engine process in the weight-update group as rank_offset + tp_rank' },
    { name: 'pipeline parallel, long spelling', raw: config({ gpus: 2, extra_args: ['--pipeline-parallel-size', '2'] }), line: 'cluster.rollout.extra_args[0]: --pipeline-parallel-size 2: SGLang ranks' },
    { name: 'the RL on-policy logprobs', raw: config({ extra_args: ['--rl-on-policy-target', 'fsdp'] }), line: 'cluster.rollout.extra_args[0]: --rl-on-policy-target changes how SGLang computes the logprobs it reports' },
    { name: 'server-side sampling defaults', raw: config({ extra_args: ['--preferred-sampling-params={"min_p": 0.1}'] }), line: 'cluster.rollout.extra_args[0]: --preferred-sampling-params sets sampling defaults SGLang merges into every /generate' },
  ];
  it.each(cases)('$name', async ({ raw, line }) => {
    const lines = await errorsOf(raw);
    expect(lines.some((l) => l.startsWith(line)), lines.join('\n')).toBe(true);
  });

  it('reports every such argument, of every engine', async () => {
    const lines = await errorsOf(config({ extra_args: ['--incremental-streaming-output', '--skip-tokenizer-init'] }, { extra_args: ['--skip-tokenizer-init'] }));
    expect(lines.map((l) => l.split(':')[0])).toEqual(['cluster.rollout.extra_args[0]', 'cluster.rollout.extra_args[1]', 'cluster.prm.extra_args[0]']);
  });

  it('leaves alone what breaks nothing: one replica, attention DP, the PRM and student scaled out, engines Reef does not start, the hf engine', async () => {
    await ok(config({ gpus: 2, extra_args: ['--dp-size', '1', '--pp-size=1', '--tp', '2'] }));
    await ok(config({ gpus: 2, extra_args: ['--dp', '2', '--enable-dp-attention'] }));
    await ok(config({}, { gpus: 4, extra_args: ['--dp', '2', '--incremental-streaming-output', '--preferred-sampling-params', '{}'] }, { gpus: 2, extra_args: ['--pp-size', '2', '--skip-tokenizer-init'] }));
    await ok(config({}, { replicas: 0, extra_args: ['--skip-tokenizer-init', '--tp', '8'] }));
    // A value that only looks like one of those flags is another flag's value.
    await ok(config({ extra_args: ['--served-model-name', 'tp', '--chat-template=--inc'] }));
    await ok(config({ engine: 'hf', gpus: 2, extra_args: ['--incremental-streaming-output', '--dp', '2', '--tp', '3'] }, { engine: 'hf', extra_args: ['--skip-tokenizer-init'] }));
  });
});
