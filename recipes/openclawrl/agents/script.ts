/**
 * The scripted policy of the agents example (`npm run agents`) and its integration test: what the
 * hf engine answers sampled requests with (`--scripted-outputs`, python_shim/reef_shim/engines/
 * scripted.py). The CPU models here cannot call tools, so without a script every episode would
 * end at its first reply and no step would be judged. Each task has a good and a bad first step,
 * given in turn to the parallel rollouts of its group, so every group holds both:
 *
 * - `terminal:write-file`: good writes `hello reef` and says it is done (2 model calls, succeeds);
 *   bad writes `hello`, looks at the file, says it is done (3 calls: the extra step is alone in
 *   its step-index bucket with 2 rollouts, and one of an all-equal bucket with 4; fails).
 * - `toolcall:arith`: good calls `calculator` and answers 395 (succeeds); bad calls a tool that
 *   does not exist (the tool answers an error: the rule PRM votes −1 and hints), then answers 400
 *   (fails).
 *
 * Greedy requests are never scripted: the evaluation before and after training is the model's own.
 */

export interface ScriptRule {
  when: string[];
  replies: string[];
}

/** An `env:task` of python_shim/reef_shim/envs with the script's replies for it. */
export interface ScriptedTask {
  id: 'terminal:write-file' | 'toolcall:arith';
  /** Trained steps one group of `n` rollouts gives (n even): the buckets that are not all equal. */
  trainedSteps(n: number): number;
  /** Which first reply an episode got, from its first step's tool calls. */
  variant(firstCalls: ReadonlyArray<{ name: string | null; arguments: unknown }>): 'good' | 'bad' | 'other';
  rules: ScriptRule[];
}

const call = (name: string, args: Record<string, string>) => `<tool_call>\n${JSON.stringify({ name, arguments: args })}\n</tool_call>`;

const GOOD_WRITE = "echo 'hello reef' > greeting.txt";
const BAD_WRITE = 'echo hello > greeting.txt';
const WRITE_TASK = 'greeting.txt whose only line is: hello reef';
const ARITH_TASK = 'What is 17 * 23 + 4?';

export const SCRIPTED_TASKS: readonly ScriptedTask[] = [
  {
    id: 'terminal:write-file',
    // Bucket 0 mixes good (r = 1 + 1) and bad (r = −1 + 1) first steps; bucket 1 holds the bad
    // episodes' second step only: alone with n = 2 (kept, raw), all equal with more (dropped).
    trainedSteps: (n) => n + (n === 2 ? 1 : 0),
    variant: (calls) => {
      const cmd = String((calls[0]?.arguments as string | undefined) ?? '');
      return calls[0]?.name !== 'run_shell' ? 'other' : cmd.includes(GOOD_WRITE) ? 'good' : cmd.includes(BAD_WRITE) ? 'bad' : 'other';
    },
    rules: [
      { when: [WRITE_TASK, GOOD_WRITE, '<tool_response>'], replies: ['Done: greeting.txt holds the line.'] },
      { when: [WRITE_TASK, BAD_WRITE, 'cat greeting.txt', '<tool_response>'], replies: ['Done.'] },
      { when: [WRITE_TASK, BAD_WRITE, '<tool_response>'], replies: [call('run_shell', { command: 'cat greeting.txt' })] },
      { when: [WRITE_TASK], replies: [call('run_shell', { command: GOOD_WRITE }), call('run_shell', { command: BAD_WRITE })] },
    ],
  },
  {
    id: 'toolcall:arith',
    trainedSteps: (n) => n,
    variant: (calls) => (calls[0]?.name === 'calculator' ? 'good' : calls[0]?.name === 'calc' ? 'bad' : 'other'),
    rules: [
      { when: [ARITH_TASK, '<tool_response>\n395\n</tool_response>'], replies: ['17 * 23 + 4 is 395.'] },
      { when: [ARITH_TASK, '<tool_response>'], replies: ['It is 400.'] },
      { when: [ARITH_TASK], replies: [call('calculator', { expression: '17 * 23 + 4' }), call('calc', { expression: '17 * 23 + 4' })] },
    ],
  },
];

/** The script file's content for the given tasks. */
export function scriptFor(tasks: readonly ScriptedTask[]): { rules: ScriptRule[] } {
  return { rules: tasks.flatMap((t) => t.rules) };
}

export function scriptedTask(id: string): ScriptedTask {
  const t = SCRIPTED_TASKS.find((x) => x.id === id);
  if (t === undefined) throw new Error(`--tasks: no scripted task ${id} (scripted: ${SCRIPTED_TASKS.map((x) => x.id).join(', ')})`);
  return t;
}
