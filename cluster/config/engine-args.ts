/**
 * What Reef reads of, and adds to, an SGLang engine's command line (`cluster.<role>.extra_args`),
 * against the pinned release, SGLang 0.5.23. Not run against a real SGLang: every rule below is
 * from reading that release's wheel (paths are inside it, `sglang/srt/...`).
 *
 * Its launcher parses with argparse's defaults (`srt/server_args.py:679`), abbreviations allowed:
 * a flag may be written as any prefix of it that names no other of its flags (`--tp` is
 * `--tp-size`, while `--pp` is ambiguous and refused by SGLang itself), its value after `=` or as
 * the next argument, and the last one given wins. A `--config FILE` merged in by SGLang
 * (`server_args.py:681-688`) is not read here.
 */
import type { ConfigIssue } from './errors.js';
import type { ClusterSection, EngineConfig } from './types.js';

interface Flag {
  /** Each spelling with its shortest prefix that 0.5.23 reads as this flag alone (computed from its parser). */
  readonly spellings: readonly (readonly [full: string, shortest: string])[];
  readonly takesValue: boolean;
}

const FLAGS = {
  // srt/arg_groups/fields/parallel.py:45-51 (alias --tensor-parallel-size).
  tp: { spellings: [['--tp-size', '--tp'], ['--tensor-parallel-size', '--te']], takesValue: true },
  // parallel.py:72-80.
  dp: { spellings: [['--dp-size', '--dp'], ['--data-parallel-size', '--da']], takesValue: true },
  // parallel.py:58-64.
  pp: { spellings: [['--pp-size', '--pp-s'], ['--pipeline-parallel-size', '--pi']], takesValue: true },
  // server_args.py:418-424; a prefix of another flag, so only the whole word counts.
  dpAttention: { spellings: [['--enable-dp-attention', '--enable-dp-attention']], takesValue: false },
  // srt/arg_groups/fields/serving.py:274.
  incremental: { spellings: [['--incremental-streaming-output', '--inc']], takesValue: false },
  // serving.py:58.
  skipTokenizer: { spellings: [['--skip-tokenizer-init', '--skip-t']], takesValue: false },
  // srt/arg_groups/fields/exec_.py:1156.
  rlOnPolicy: { spellings: [['--rl-on-policy-target', '--rl-o']], takesValue: true },
  // serving.py:247.
  preferredSampling: { spellings: [['--preferred-sampling-params', '--prefe']], takesValue: true },
} as const satisfies Record<string, Flag>;

type FlagName = keyof typeof FLAGS;

interface Occurrence {
  /** Index of the flag in extra_args. */
  index: number;
  /** As written, before any `=`. */
  written: string;
  /** null when the flag takes none, or its value is missing. */
  value: string | null;
}

function flagOf(written: string): FlagName | null {
  for (const [name, flag] of Object.entries(FLAGS) as [FlagName, Flag][]) {
    if (flag.spellings.some(([full, shortest]) => full.startsWith(written) && written.startsWith(shortest))) return name;
  }
  return null;
}

/** Every flag of FLAGS in `args`, in order, with its value: after `=`, else the next argument. */
function scan(args: readonly string[]): Map<FlagName, Occurrence[]> {
  const found = new Map<FlagName, Occurrence[]>();
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (!arg.startsWith('--')) continue;
    const eq = arg.indexOf('=');
    const written = eq < 0 ? arg : arg.slice(0, eq);
    const name = flagOf(written);
    if (name === null) continue;
    const index = i;
    let value: string | null = null;
    if (FLAGS[name].takesValue) {
      if (eq >= 0) value = arg.slice(eq + 1);
      else if (i + 1 < args.length) value = args[++i]!;
    }
    found.set(name, [...(found.get(name) ?? []), { index, written, value }]);
  }
  return found;
}

/** A size as argparse's `type=int` would take it, or null. */
function sizeOf(value: string | null): number | null {
  if (value === null || !/^\s*[+-]?\d+\s*$/.test(value)) return null;
  return Number(value.trim());
}

type Role = 'rollout' | 'prm' | 'student';

/** A problem with the argument at `index`. */
interface ArgIssue {
  index: number;
  message: string;
}

/** SGLang's parallel sizes as `args` set them (the last of each wins), with issues for what cannot be read. */
function sizes(found: Map<FlagName, Occurrence[]>, issues: ArgIssue[]) {
  const read = (name: 'tp' | 'dp' | 'pp') => {
    const last = found.get(name)?.at(-1);
    if (last === undefined) return null;
    const n = sizeOf(last.value);
    if (n === null || n < 1) {
      issues.push({ index: last.index, message: `${last.written} needs a positive integer, got ${last.value === null ? 'nothing' : JSON.stringify(last.value)}` });
      return null;
    }
    return { n, occurrence: last };
  };
  // The deprecated `--dp-size N --enable-dp-attention` is attention DP inside the TP group: SGLang
  // makes it `--attn-dp-size N` with dp_size 1 (srt/arg_groups/parallel_hook.py:39-61).
  const attention = found.has('dpAttention');
  return { tp: read('tp'), dp: attention ? null : read('dp'), pp: read('pp') };
}

/**
 * Problems of one sglang engine's extra_args, with `cluster.<role>.extra_args[i]` paths. Every
 * engine: the GPUs SGLang takes (tp × dp × pp, `srt/server_args.py:581-589`) must be its `gpus`.
 * The rollout engine, whose records train and which takes the weight pushes, also may not change
 * what Reef reads of its replies; the PRM's judge reads `text` too.
 */
function engineIssues(role: Role, e: EngineConfig): ConfigIssue[] {
  const issues: ArgIssue[] = [];
  const found = scan(e.extra_args);
  const first = (name: FlagName) => found.get(name)?.[0];
  const refuse = (name: FlagName, why: string) => {
    const o = first(name);
    if (o !== undefined) issues.push({ index: o.index, message: `${o.written} ${why}` });
  };
  const { tp, dp, pp } = sizes(found, issues);
  if (role === 'rollout') {
    refuse('incremental', 'makes SGLang stream deltas (srt/managers/tokenizer_manager.py:2629-2645), but Reef reads each streamed event as the whole output so far (cluster/engine-client.ts): records would lose tokens and logprobs; remove it');
    refuse('rlOnPolicy', 'changes how SGLang computes the logprobs it reports (a bf16 log_softmax, srt/layers/sampler.py:236-249), so ℓold would no longer be the convention the trainer scores in (training.engine_logprobs); remove it');
    refuse('preferredSampling', 'sets sampling defaults SGLang merges into every /generate (srt/managers/tokenizer_manager.py:1549-1550), which the trainer would not know the records were sampled with; remove it');
    if (dp !== null && dp.n > 1) issues.push({ index: dp.occurrence.index, message: `${dp.occurrence.written} ${dp.n}: SGLang's weight routes assert one data-parallel replica (srt/managers/tokenizer_control_mixin.py:451,509), so every release pushed into the rollout engine would fail; remove it` });
    if (pp !== null && pp.n > 1) issues.push({ index: pp.occurrence.index, message: `${pp.occurrence.written} ${pp.n}: SGLang ranks each engine process in the weight-update group as rank_offset + tp_rank (srt/model_executor/model_runner_components/weight_updater.py:124), so pipeline stages would take the same rank; remove it` });
  }
  if (role !== 'student') refuse('skipTokenizer', `makes SGLang answer /generate without text (srt/managers/tokenizer_manager.py:2675-2710), which the ${role === 'rollout' ? 'gateway' : 'judge'} reads; remove it`);
  const replicas = (dp?.n ?? 1) * (pp?.n ?? 1);
  if (tp !== null && tp.n * replicas !== e.gpus) {
    const takes = replicas === 1 ? `${tp.n} GPUs` : `${tp.n * replicas} GPUs (tp × dp × pp)`;
    issues.push({ index: tp.occurrence.index, message: `${tp.occurrence.written} ${tp.n} takes ${takes}, but cluster.${role}.gpus is ${e.gpus}; set gpus and leave the TP size out (Reef adds --tp-size from gpus)` });
  } else if (tp === null && e.gpus % replicas !== 0) {
    const { n, occurrence: o } = (dp ?? pp)!;
    issues.push({ index: o.index, message: `${o.written} ${n}: dp × pp = ${replicas} does not divide cluster.${role}.gpus (${e.gpus}), so no TP size fills the engine's GPUs` });
  }
  return issues.sort((a, b) => a.index - b.index).map(({ index, message }) => ({ path: `cluster.${role}.extra_args[${index}]`, message }));
}

/** The sglang engines Reef starts, by role. */
function startedEngines(c: ClusterSection): [Role, EngineConfig][] {
  const out: [Role, EngineConfig][] = [['rollout', c.rollout]];
  if (c.prm.replicas > 0 && c.prm.model_path !== null) out.push(['prm', { ...c.prm, model_path: c.prm.model_path }]);
  if (c.student !== null) out.push(['student', c.student]);
  return out.filter(([, e]) => e.engine === 'sglang');
}

/** Every problem of the sglang engines' extra_args (the hf engine's are its own). */
export function engineArgIssues(c: ClusterSection): ConfigIssue[] {
  return startedEngines(c).flatMap(([role, e]) => engineIssues(role, e));
}

/**
 * The arguments an engine is started with after its model, host and port: its extra_args, and for
 * an sglang engine on more than one GPU that does not set its TP size, `--tp-size` filling its
 * GPUs (SGLang's default is 1: it would run on the first GPU of the bundle and leave the rest
 * idle). Assumes `engineArgIssues` found nothing.
 */
export function engineArgs(e: Pick<EngineConfig, 'engine' | 'gpus' | 'extra_args'>): string[] {
  const args = [...e.extra_args];
  if (e.engine !== 'sglang') return args;
  const found = scan(args);
  if (found.has('tp')) return args;
  const { dp, pp } = sizes(found, []);
  const tp = e.gpus / ((dp?.n ?? 1) * (pp?.n ?? 1));
  if (Number.isInteger(tp) && tp > 1) args.push('--tp-size', String(tp));
  return args;
}
