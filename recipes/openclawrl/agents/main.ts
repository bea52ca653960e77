import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { repoRoot } from '../../../cluster/paths.js';
import { modelDirProblem } from '../demo/experiment.js';
import { describeAgents, type AgentsSummary } from './report.js';
import { agentsOptions, STAND_INS, WHY_MODEL, type AgentsOptions } from './options.js';
import { runAgentArm, type ArmResult } from './run.js';

/**
 * `npm run agents -- [--out DIR] [--n 4] [--rounds 3] [--eval 2] [--lr 0.05] [--seed 1]
 * [--arms control,trained] [--workers 8] [--max-tokens 128] [--tasks terminal:write-file,toolcall:arith] [--model DIR]`
 *
 * Agent episodes through the whole stack on this machine, a control arm (training off) and a
 * trained arm, one after the other; `summary.json` in `--out` (default results/agents).
 */

function commit(): string | null {
  try {
    return execFileSync('git', ['rev-parse', 'HEAD'], { cwd: repoRoot(), encoding: 'utf8' }).trim();
  } catch {
    return null;
  }
}

async function main(): Promise<number> {
  const log = (line: string) => process.stdout.write(`${line}\n`);
  let o: AgentsOptions;
  try {
    o = agentsOptions(process.argv.slice(2));
    const problem = modelDirProblem(o.arm.modelDir);
    if (problem !== null) throw new Error(problem.replace('`npm run demo` builds SmolLM2 (scripts/setup.sh)', '`npm run setup` builds the tiny model'));
  } catch (err) {
    process.stderr.write(`agents: ${(err as Error).message}\n`);
    return 2;
  }
  const stop = new AbortController();
  const onSignal = (sig: NodeJS.Signals) => {
    if (stop.signal.aborted) process.exit(130);
    process.stderr.write(`agents: ${sig}: stopping the stack (again quits at once and may leave processes behind)\n`);
    stop.abort(new Error(`interrupted by ${sig}`));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  mkdirSync(o.out, { recursive: true });
  const started = new Date();
  log(`agents example: ${o.arm.tasks.map((t) => t.id).join(', ')}; ${o.arm.n} rollouts per task per round, ${o.arm.rounds} round(s), ${o.arm.evalEpisodes} greedy evaluation episode(s) per task before and after; arms ${o.arms.join(', ')}`);
  log(`model: ${basename(o.arm.modelDir)} (${o.arm.modelDir}). ${WHY_MODEL}`);
  for (const [k, v] of Object.entries(STAND_INS)) log(`stand-in (${k}): ${v}`);
  const arms: Partial<Record<'control' | 'trained', ArmResult>> = {};
  try {
    for (const name of o.arms) {
      log(`arm ${name}${name === 'control' ? ' (training.enabled: false: batches formed and recorded, not trained)' : ` (lr ${o.arm.lr})`}`);
      arms[name] = await runAgentArm({ ...o.arm, control: name === 'control', out: join(o.out, name), log, signal: stop.signal });
    }
  } catch (err) {
    process.stderr.write(stop.signal.aborted ? 'agents: stopped\n' : `agents failed: ${(err as Error).stack ?? String(err)}\n`);
    return stop.signal.aborted ? 130 : 1;
  }
  const summary: AgentsSummary = {
    command: `npm run agents -- ${process.argv.slice(2).join(' ')}`.trim(),
    date: started.toISOString(),
    commit: commit(),
    model: { dir: o.arm.modelDir, why: WHY_MODEL },
    stand_ins: STAND_INS,
    settings: { tasks: o.arm.tasks.map((t) => t.id), n: o.arm.n, rounds: o.arm.rounds, eval_episodes: o.arm.evalEpisodes, workers: o.arm.workers, lr: o.arm.lr, seed: o.arm.seed, max_tokens: o.arm.maxTokens, group_timeout_s: o.arm.groupTimeoutS, outcome_coef: 1, prm_coef: 1, outcome_discount: 1 },
    arms,
    wall_time_s: Math.round((Date.now() - started.getTime()) / 100) / 10,
  };
  const path = join(o.out, 'summary.json');
  writeFileSync(path, `${JSON.stringify(summary, null, 1)}\n`);
  log(describeAgents(summary));
  log(`summary: ${path}${existsSync(join(o.out, 'trained')) ? `; each arm's config, data dir, record lines and episodes under ${o.out}/<arm>/` : ''}`);
  return 0;
}

process.exitCode = await main();
