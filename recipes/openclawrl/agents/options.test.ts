import { describe, expect, it } from 'vitest';
import { agentsOptions } from './options.js';
import { SCRIPTED_TASKS, scriptFor } from './script.js';

describe('npm run agents options', () => {
  it('defaults to both arms of both scripted tasks, 4 rollouts, 3 rounds', () => {
    const o = agentsOptions([]);
    expect(o.arms).toEqual(['control', 'trained']);
    expect(o.arm.tasks.map((t) => t.id)).toEqual(['terminal:write-file', 'toolcall:arith']);
    expect([o.arm.n, o.arm.rounds, o.arm.evalEpisodes]).toEqual([4, 3, 2]);
    expect(agentsOptions(['--n=2', '--arms', 'trained', '--tasks', 'toolcall:arith']).arm.n).toBe(2);
  });

  it('refuses what it cannot run, naming the option', () => {
    expect(() => agentsOptions(['--n', '3'])).toThrow(/--n: expected an even number/);
    expect(() => agentsOptions(['--n', '0'])).toThrow(/--n: expected an integer of at least 2/);
    expect(() => agentsOptions(['--arms', 'both'])).toThrow(/--arms: expected control and\/or trained/);
    expect(() => agentsOptions(['--tasks', 'terminal:fix-script'])).toThrow(/no scripted task terminal:fix-script \(scripted: terminal:write-file, toolcall:arith\)/);
    expect(() => agentsOptions(['--sessions', '3'])).toThrow(/unknown option --sessions \(known: --out/);
    expect(() => agentsOptions(['--lr', '0'])).toThrow(/--lr: expected a positive number/);
    expect(() => agentsOptions(['--rounds'])).toThrow(/--rounds needs a value/);
  });
});

describe('the scripted policy', () => {
  it('puts each task\'s later-step rules before its first-step rule, which alternates a good and a bad reply', () => {
    for (const t of SCRIPTED_TASKS) {
      const first = t.rules.at(-1)!;
      expect(first.when.some((w) => w.includes('<tool_response>'))).toBe(false);
      expect(first.replies).toHaveLength(2);
      for (const r of t.rules.slice(0, -1)) expect(r.when.some((w) => w.includes('<tool_response>'))).toBe(true);
    }
    expect(scriptFor(SCRIPTED_TASKS).rules).toHaveLength(SCRIPTED_TASKS.reduce((a, t) => a + t.rules.length, 0));
  });

  it('counts the steps a group trains: the bad terminal episodes\' extra step is alone with 2 rollouts, all equal with more', () => {
    const [terminal, arith] = SCRIPTED_TASKS;
    expect([terminal!.trainedSteps(2), terminal!.trainedSteps(4), arith!.trainedSteps(4)]).toEqual([3, 4, 4]);
    expect(arith!.variant([{ name: 'calc', arguments: '{}' }])).toBe('bad');
    expect(terminal!.variant([{ name: 'run_shell', arguments: '{"command":"echo \'hello reef\' > greeting.txt"}' }])).toBe('good');
    expect(terminal!.variant([])).toBe('other');
  });
});
