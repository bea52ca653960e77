import { resolve } from 'node:path';
import { tinyModelDir } from '../../../cluster/paths.js';
import type { AgentArmOptions } from './run.js';
import { SCRIPTED_TASKS, scriptedTask } from './script.js';

/** The options of `npm run agents` (main.ts), and the stand-ins and model choice it names. */

export const STAND_INS = {
  policy: 'scripted replies forced by the hf engine on sampled requests (recipes/openclawrl/agents/script.ts, --scripted-outputs): a good and a bad first step per task, given in turn to the rollouts of a group; tokens forced, logprobs the model\'s own. Greedy requests (the before/after evaluation) are the model\'s own.',
  judge: 'rule-following PRM double (python_shim/reef_shim/engines/rule_prm_server.py), not a model: a tool output that reports an error scores −1 and gets a hint, any other +1',
  model: 'Reef\'s tiny test model (a 2-layer Qwen3-shaped decoder, random weights, .cache/tiny-model), not a pretrained model',
};

export const WHY_MODEL = 'SmolLM2-135M-Instruct cannot be used for tool calls here: its chat template renders only role and content (a tools list and an assistant\'s tool_calls are dropped, and a tool result is shown as a "tool" turn it was never trained on), and the gateway parses tool-call markup only for Qwen-family models (SmolLM2 is model_type llama, so its output would stay plain text). The tiny model has a Qwen3-style tool template and <tool_call> tokens, so the gateway, the judge and the trainer see real tool-call turns; it cannot produce them on its own, hence the scripted policy. --model takes any Qwen-family model directory instead (not run).';

const KNOWN = '--out --n --rounds --eval --lr --seed --arms --workers --max-tokens --tasks --model --group-timeout-s';

export interface AgentsOptions {
  out: string;
  arms: Array<'control' | 'trained'>;
  arm: Omit<AgentArmOptions, 'control' | 'out' | 'log' | 'signal'>;
}

export function agentsOptions(argv: readonly string[]): AgentsOptions {
  const arm: AgentsOptions['arm'] = { tasks: SCRIPTED_TASKS, n: 4, rounds: 3, evalEpisodes: 2, workers: 8, lr: 0.05, seed: 1, maxTokens: 128, modelDir: tinyModelDir(), groupTimeoutS: 120 };
  let out = resolve('results', 'agents');
  let arms: AgentsOptions['arms'] = ['control', 'trained'];
  for (let i = 0; i < argv.length; i++) {
    const eq = argv[i]!.indexOf('=');
    const flag = eq < 0 ? argv[i]! : argv[i]!.slice(0, eq);
    const value = eq < 0 ? argv[++i] : argv[i]!.slice(eq + 1);
    if (!KNOWN.split(' ').includes(flag)) throw new Error(`unknown option ${flag} (known: ${KNOWN})`);
    if (value === undefined) throw new Error(`${flag} needs a value`);
    const int = (min: number) => {
      const n = Number(value);
      if (value.trim() === '' || !Number.isInteger(n) || n < min) throw new Error(`${flag}: expected an integer of at least ${min}, got ${value}`);
      return n;
    };
    switch (flag) {
      case '--out': out = resolve(value); break;
      case '--n': arm.n = int(2); if (arm.n % 2 !== 0) throw new Error(`--n: expected an even number (a group holds as many good as bad first steps), got ${value}`); break;
      case '--rounds': arm.rounds = int(1); break;
      case '--eval': arm.evalEpisodes = int(0); break;
      case '--workers': arm.workers = int(1); break;
      case '--seed': arm.seed = int(0); break;
      case '--max-tokens': arm.maxTokens = int(16); break;
      case '--group-timeout-s': arm.groupTimeoutS = int(1); break;
      case '--model': arm.modelDir = resolve(value); break;
      case '--tasks': arm.tasks = value.split(',').map((t) => scriptedTask(t.trim())); break;
      case '--lr': {
        const n = Number(value);
        if (value.trim() === '' || !Number.isFinite(n) || n <= 0) throw new Error(`--lr: expected a positive number, got ${value}`);
        arm.lr = n;
        break;
      }
      case '--arms': {
        const names = value.split(',').map((a) => a.trim());
        const bad = names.find((a) => a !== 'control' && a !== 'trained');
        if (bad !== undefined || names.length === 0) throw new Error(`--arms: expected control and/or trained, got ${value}`);
        arms = names as AgentsOptions['arms'];
        break;
      }
    }
  }
  return { out, arms, arm };
}
