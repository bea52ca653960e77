import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pythonBin, pythonEnv } from '../../cluster/paths.js';
import type { FakeGeneration } from '../helpers/fake-engine.js';
import { startStack, type Stack } from '../gateway/harness.js';

/**
 * The Python agent loop (python_shim/reef_shim/envs/agent.py) against the real gateway: tool
 * calls come back parsed from the engine's `<tool_call>` markup, each tool output goes back as a
 * `tool` message, the records carry the episode's session and group tags, and the outcome report
 * the loop files is stored with exactly the episode's receipts. The engine is the test double;
 * the terminal episode runs in a real sandbox.
 */

const run = promisify(execFile);

// The engine's replies in the order the two episodes (run one after the other) ask for them.
const SCRIPT: FakeGeneration[] = [
  { pieces: ['<tool_call>', '{"name": "run_shell", "arguments": {"command": "echo \'hello reef\' > greeting.txt"}}', '</tool_call>'] },
  { pieces: ['Done', '.'] },
  { pieces: ['<tool_call>', '{"name": "calculator", "arguments": {"expression": "17 * 23 + 4"}}', '</tool_call>'] },
  { pieces: ['It', ' is', ' 395', '.'] },
];

const EPISODES = `
import json, sys
from reef_shim.envs.agent import run_episode
from reef_shim.envs.workers import make_env
out = []
for kind, task in (("terminal", "write-file"), ("toolcall", "arith")):
    env = make_env(kind)
    try:
        r = run_episode(sys.argv[1], "tiny", env, task, session=f"s-{task}", group=f"g-{task}", max_steps=4)
    finally:
        env.close()
    out.append(r.to_json())
print(json.dumps(out))
`;

interface Episode { task: string; success: boolean; stopped: string; error: string | null; receipts: string[]; report: { id: string } | null; info: Record<string, unknown> }

describe('agent loop through the gateway', () => {
  let stack: Stack;
  let next = 0;
  beforeAll(async () => {
    stack = await startStack({ engine: { respond: () => SCRIPT[next++] ?? { pieces: ['(unscripted)'] } } });
  });
  afterAll(async () => {
    await stack?.close();
  });

  it('runs a terminal and a tool-call episode and files each outcome with its receipts', async () => {
    const { stdout } = await run(pythonBin(), ['-c', EPISODES, stack.url], { env: pythonEnv(), timeout: 60_000 });
    const episodes = JSON.parse(stdout) as Episode[];
    expect(episodes.map((e) => [e.task, e.success, e.stopped, e.error])).toEqual([
      ['write-file', true, 'answered', null],
      ['arith', true, 'answered', null],
    ]);
    expect(['bwrap', 'uid', 'rlimits']).toContain(episodes[0]!.info.isolation);

    const reports = (await (await fetch(`${stack.url}/reef/scenarios/default/reports`)).json()) as { data: { id: string; score: number; references: string[]; metadata: Record<string, unknown> }[] };
    expect(reports.data).toHaveLength(2);
    for (const [i, e] of episodes.entries()) {
      const rep = reports.data[i]!;
      expect(rep.id).toBe(e.report!.id);
      expect(rep.score).toBe(1);
      expect(e.receipts).toHaveLength(2);
      expect(rep.references).toEqual(e.receipts);
      expect(rep.metadata).toMatchObject({ kind: 'episode-outcome', task: e.task, session: `s-${e.task}`, group: `g-${e.task}` });
      // The second turn's request holds the first turn's tool call and the tool's output.
      const second = (await (await fetch(`${stack.url}/reef/scenarios/default/records/${e.receipts[1]}`)).json()) as { tags: Record<string, string>; request: { messages: { role: string; content: string | null; tool_calls?: unknown[] }[] } };
      expect(second.tags).toMatchObject({ session: `s-${e.task}`, group: `g-${e.task}` });
      const roles = second.request.messages.map((m) => m.role);
      expect(roles).toEqual(['system', 'user', 'assistant', 'tool']);
      expect(second.request.messages[2]!.tool_calls).toHaveLength(1);
      expect(second.request.messages[3]!.content).toBe(e.task === 'arith' ? '395' : 'exit code 0');
    }
  });
});
