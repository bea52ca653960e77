import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../../cluster/paths.js';
import { loadTemplate, renderPrompt, scoreKindOf, type TurnText } from './prompts.js';
import { parseVote } from './votes.js';

/**
 * The step prompt against the rule-following PRM double (python_shim/reef_shim/engines/
 * rule_prm_rules.py), run as the PRM engine runs it: a real Python process reading the rendered
 * prompts. The double scores a tool's output +1, or -1 when it reports an error.
 */
const root = repoRoot();

function ruleDouble(prompts: string[]): { kind: string; next_role: string; next_state: string; answer: string }[] {
  const script = [
    'import json, sys',
    'from pathlib import Path',
    'from reef_shim.engines.rule_prm_rules import JudgePrompt, answer',
    'jp = JudgePrompt(Path(sys.argv[1]))',
    'out = []',
    'for text in json.load(sys.stdin):',
    '    t = jp.parse(text)',
    '    out.append({"kind": t.kind, "next_role": t.next_role, "next_state": t.next_state, "answer": answer(t)})',
    'print(json.dumps(out))',
  ].join('\n');
  const stdout = execFileSync(join(root, '.venv', 'bin', 'python'), ['-c', script, join(root, 'recipes', 'openclawrl', 'prompts')], {
    input: JSON.stringify(prompts),
    env: { ...process.env, PYTHONPATH: join(root, 'python_shim') },
    encoding: 'utf8',
  });
  return JSON.parse(stdout) as ReturnType<typeof ruleDouble>;
}

const step = (content: string): TurnText => ({
  task: 'Create notes.txt holding the word hello.',
  context: 'Create notes.txt holding the word hello.',
  reply: 'tool call: write_file({"path":"notes.txt","content":"hello"})',
  nextState: { role: 'tool', content },
});

describe('the step prompt', () => {
  it('is the score prompt of a turn whose next state is a tool output, and of no other', () => {
    expect(scoreKindOf(step('ok'))).toBe('step');
    expect(scoreKindOf({ nextState: { role: 'user', content: 'thanks' } })).toBe('score');
  });

  it('asks for +1 when the step advances the task with a valid tool call, -1 otherwise', () => {
    const text = loadTemplate('step');
    for (const words of ['tool call is valid', 'moves the task forward', 'malformed', 'does not exist', '\\boxed{1}', '\\boxed{-1}', '{{task}}']) expect(text).toContain(words);
    // The double, like a reader of the prompt, takes a prompt naming the hint markers for a hint vote.
    expect(text).not.toContain('[HINT_START]');
  });

  it('the rule PRM double reads it as a score vote on the tool output, and votes as its rules say', () => {
    const turns = [step('wrote 5 bytes to notes.txt'), step('Error: permission denied: notes.txt'), { ...step('x'), nextState: { role: 'user' as const, content: 'Thanks, that is right.' } }];
    const prompts = turns.map((t) => renderPrompt(scoreKindOf(t), t));
    const got = ruleDouble(prompts);
    expect(got.map((g) => [g.kind, g.next_role, g.next_state])).toEqual([
      ['score', 'tool', 'wrote 5 bytes to notes.txt'],
      ['score', 'tool', 'Error: permission denied: notes.txt'],
      ['score', 'user', 'Thanks, that is right.'],
    ]);
    expect(got.map((g) => parseVote(g.answer))).toEqual([1, -1, 1]);
  });
});
