#!/usr/bin/env node
/**
 * `node dist/recipes/openclawrl/harness/cli.js`: runs the example's sessions against a running Reef
 * gateway with the built-in agent and a simulated student, printing one progress line per session
 * and, at the end, the learning curve and where the results are.
 */
import { realpathSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { ReefError } from '../../../actors/runtime/errors.js';
import { loadConfig, type ReefConfig } from '../../../cluster/config/index.js';
import { generateProblems, loadGsm8k } from './problems.js';
import { curveTable, type RunSummary } from './report.js';
import { runSessions, type RunOptions } from './run.js';
import { LlmStudent, ScriptedStudent, type Student } from './student.js';

const USAGE = `usage: node dist/recipes/openclawrl/harness/cli.js [-c serve.yaml | --gateway URL] [options]

  -c, --config FILE      take the gateway address, API key and prm_record_file from this serve.yaml
  --gateway URL          the Reef gateway (default from -c, else http://127.0.0.1:8600)
  --api-key-env NAME     environment variable holding the gateway key (never the key itself on the command line)
  --scenario NAME        x-reef-scenario of the agent (default homework)
  --sessions N           sessions to run in order (default 72)
  --student KIND         scripted (default) or llm
  --student-url URL      OpenAI-compatible URL of the student model (required for llm)
  --student-model NAME   the student's model name (default: the server's first model)
  --student-timeout-s S  per-turn timeout of the LLM student (default 300)
  --problems FILE        a GSM8K-format JSONL (question, answer ending in "#### N"); default: generated
  --seed N               seed of the generated problems (default 20260310)
  --out DIR              results in DIR/results, saved homework in DIR/homework (default .)
  --prm-record-file F    read each batch's reward split from F (default from -c)
  --model NAME           model name sent to the gateway (default: the gateway's model)
  --temperature T        agent sampling temperature (default 0.7)
  --max-tokens N         agent completion limit per request (default: the gateway's)
  --max-turns N          student messages per session at most (default 8)
  --no-steps-rule        the scripted student does not ask for worked calculations`;

export interface CliOptions {
  run: Omit<RunOptions, 'student' | 'onProgress'>;
  student: { kind: 'scripted'; requireSteps: boolean } | { kind: 'llm'; url: string; model: string | null; timeoutMs: number };
}

function num(name: string, v: string | undefined, fallback: number, check: (n: number) => boolean): number {
  if (v === undefined) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || !check(n)) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--${name}: invalid value ${JSON.stringify(v)}` });
  return n;
}

/** The gateway key from the config: the first entry, literal or from its environment variable. */
function configKey(cfg: ReefConfig, env: NodeJS.ProcessEnv): string | null {
  const k = cfg.reef.api_keys[0];
  if (!k) return null;
  return k.key ?? (k.key_env ? (env[k.key_env] ?? null) : null);
}

/** parseArgs, with its errors (unknown option, missing value) as argument errors: usage, exit 2. */
function parseCliArgs<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (err) {
    if ((err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS_')) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${(err as Error).message} (--help lists the options)` });
    throw err;
  }
}

export async function parseCli(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<CliOptions | null> {
  const { values: v } = parseCliArgs({
    args: argv,
    options: {
      config: { type: 'string', short: 'c' },
      gateway: { type: 'string' },
      'api-key': { type: 'string' },
      'api-key-env': { type: 'string' },
      scenario: { type: 'string', default: 'homework' },
      sessions: { type: 'string' },
      student: { type: 'string', default: 'scripted' },
      'student-url': { type: 'string' },
      'student-model': { type: 'string' },
      'student-timeout-s': { type: 'string' },
      problems: { type: 'string' },
      seed: { type: 'string' },
      out: { type: 'string', default: '.' },
      'prm-record-file': { type: 'string' },
      model: { type: 'string' },
      temperature: { type: 'string' },
      'max-tokens': { type: 'string' },
      'max-turns': { type: 'string' },
      'no-steps-rule': { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (v.help) return null;
  const cfg = v.config ? await loadConfig(v.config) : null;
  const host = cfg ? (cfg.reef.host === '0.0.0.0' || cfg.reef.host === '::' ? '127.0.0.1' : cfg.reef.host) : '127.0.0.1';
  const gateway = v.gateway ?? `http://${host}:${cfg?.reef.port ?? 8600}`;
  // Declared only to be refused with this message rather than as an unknown option.
  if (v['api-key'] !== undefined) {
    throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: '--api-key: a key on the command line can be read by every user of this machine (ps, /proc/<pid>/cmdline); put it in an environment variable and pass --api-key-env NAME, or take it from the config with -c serve.yaml' });
  }
  let apiKey: string | null = null;
  if (v['api-key-env']) {
    apiKey = env[v['api-key-env']] ?? null;
    if (apiKey === null) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--api-key-env: environment variable ${v['api-key-env']} is not set` });
  }
  apiKey ??= cfg ? configKey(cfg, env) : null;
  const stage = cfg?.pipeline.task2batch.config as { prm_record_file?: string | null } | undefined;
  const prmRecordFile = v['prm-record-file'] ? resolve(v['prm-record-file']) : (stage?.prm_record_file ?? null);
  const sessions = num('sessions', v.sessions, 72, (n) => Number.isInteger(n) && n >= 1);
  const seed = num('seed', v.seed, 20260310, Number.isInteger);
  const problems = v.problems ? loadGsm8k(v.problems) : generateProblems(Math.min(sessions, 72), seed);
  let student: CliOptions['student'];
  if (v.student === 'scripted') student = { kind: 'scripted', requireSteps: !v['no-steps-rule'] };
  else if (v.student === 'llm') {
    if (!v['student-url']) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: '--student llm needs --student-url (the student engine: `reef status --json` lists it)' });
    student = { kind: 'llm', url: v['student-url'], model: v['student-model'] ?? null, timeoutMs: num('student-timeout-s', v['student-timeout-s'], 300, (n) => n > 0) * 1000 };
  } else throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `--student: expected scripted or llm, got ${JSON.stringify(v.student)}` });
  return {
    student,
    run: {
      gateway,
      apiKey,
      scenario: v.scenario,
      problems,
      sessions,
      outputDir: resolve(v.out),
      prmRecordFile,
      maxTurns: num('max-turns', v['max-turns'], 8, (n) => Number.isInteger(n) && n >= 1),
      agent: {
        model: v.model ?? null,
        temperature: num('temperature', v.temperature, 0.7, (n) => n >= 0 && n <= 2),
        maxTokens: v['max-tokens'] === undefined ? null : num('max-tokens', v['max-tokens'], 0, (n) => Number.isInteger(n) && n >= 1),
      },
    },
  };
}

export function makeStudent(s: CliOptions['student']): Student {
  return s.kind === 'scripted' ? new ScriptedStudent({ requireSteps: s.requireSteps }) : new LlmStudent({ url: s.url, model: s.model, timeoutMs: s.timeoutMs });
}

export function closingLines(s: RunSummary): string {
  const pct = (v: number | undefined) => (v === undefined ? '-' : `${Math.round(v * 100)}%`);
  return [
    '',
    `learning curve (rates over the last ${s.rolling_window} sessions):`,
    curveTable(s),
    '',
    `passed ${s.passed}/${s.sessions}; bold rate ${pct(s.rolling_start?.bold)} at session ${s.rolling_start?.session ?? '-'} -> ${pct(s.rolling_end?.bold)} at the end; list rate ${pct(s.rolling_start?.list)} -> ${pct(s.rolling_end?.list)}`,
    `sessions_to_adaptation: ${s.sessions_to_adaptation ?? 'not reached'}; wall time ${s.wall_time_s} s`,
    `results: ${s.files.sessions}`,
    `summary: ${s.files.summary}`,
    `plots:   ${s.files.rates_plot}, ${s.files.rewards_plot}`,
  ].join('\n');
}

async function main(argv: string[]): Promise<number> {
  const opts = await parseCli(argv);
  if (opts === null) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  const student = makeStudent(opts.student);
  const ac = new AbortController();
  // First Ctrl-C finishes the session in progress and writes the results; a second one exits.
  process.once('SIGINT', () => {
    process.stderr.write('stopping after this session (Ctrl-C again to quit now)\n');
    ac.abort();
    process.once('SIGINT', () => process.exit(130));
  });
  process.stdout.write(`running ${opts.run.sessions} sessions against ${opts.run.gateway} (scenario ${opts.run.scenario}, ${opts.student.kind} student)\n`);
  try {
    const summary = await runSessions({ ...opts.run, student, signal: ac.signal, onProgress: (p) => process.stdout.write(`${p.line}\n`) });
    process.stdout.write(`${closingLines(summary)}\n`);
  } finally {
    await student.close();
  }
  return 0;
}

/**
 * Whether `script` (process.argv[1]) names the module at `moduleUrl`. Node loads the main module by
 * its real path and percent-encodes its URL, so a path through a symlink or with `#` or `%` in it
 * only matches once both are real paths.
 */
export function isMainModule(script: string | undefined, moduleUrl: string): boolean {
  if (script === undefined) return false;
  try {
    return realpathSync(script) === realpathSync(fileURLToPath(moduleUrl));
  } catch {
    return false;
  }
}

if (isMainModule(process.argv[1], import.meta.url)) {
  main(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (err) => {
      process.stderr.write(`openclawrl example: ${err instanceof ReefError ? `${err.code}: ` : ''}${(err as Error).message}\n`);
      process.exit(err instanceof ReefError && err.code === 'REEF_ERR_INVALID_ARGUMENT' ? 2 : 1);
    },
  );
}
