import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ReefError } from '../actors/runtime/errors.js';
import { COMMAND_FLAGS, parseArgs, type ParsedArgs } from './args.js';
import { configCheck } from './config/index.js';
import { downCommand, keysCommand, scaleCommand, statusCommand } from './commands/control.js';
import { upCommand } from './commands/up.js';
import { exportCommand } from './commands/export.js';
import { correlateCommand } from './commands/correlate.js';
import { repoRoot } from './paths.js';

export interface Io {
  stdout: (s: string) => void;
  stderr: (s: string) => void;
}

const HELP = `reef — learn from a deployed agent's own conversations

usage:
  reef up -c FILE [--detach] [--a.b=value ...]   bring the stack up (foreground; --detach: background)
  reef status [--json] [-c FILE | --data-dir DIR] actors, placement groups, engines
  reef scale prm N [-c FILE | --data-dir DIR]     change the number of PRM actors live
  reef down [-c FILE | --data-dir DIR]            drain and stop everything reef up started
  reef keys reload [-c FILE | --data-dir DIR]     the gateway re-reads reef.api_keys (file and env) without a restart
  reef config check FILE [--a.b=value ...]        print the resolved config, or every error (exit 2)
  reef export records --scenario S [--out FILE] [-c FILE | --data-dir DIR]
                                                  write a scenario's records as JSON lines
  reef correlate FILE.jsonl [--json] [--session-ttl-s S] [--max-open-sessions N]
                                                  correlate exported traffic offline: sessions, turns, counters
  reef --version | --help

--a.b.c=value overrides that key of the config file.`;

const defaultIo: Io = { stdout: (s) => process.stdout.write(s.endsWith('\n') ? s : `${s}\n`), stderr: (s) => process.stderr.write(s.endsWith('\n') ? s : `${s}\n`) };

/** Why `cmd` cannot take the flags or arguments given, or null. */
function flagProblem(cmd: string, args: ParsedArgs): string | null {
  const takes = COMMAND_FLAGS[cmd];
  if (takes === undefined) return null;
  const extra = args.positionals.slice(1 + takes.args);
  if (extra.length > 0) {
    const what = takes.args === 0 ? 'no arguments' : `at most ${takes.args} argument${takes.args === 1 ? '' : 's'}`;
    return `reef ${cmd} takes ${what}; ${extra.map((a) => JSON.stringify(a)).join(' ')} would be ignored`;
  }
  for (const name of args.flags.keys()) {
    if (!takes.flags.includes(name)) {
      const list = takes.flags.length === 0 ? 'no flags' : takes.flags.map((f) => `--${f}`).join(', ');
      return `reef ${cmd} does not take --${name} (it takes ${list})`;
    }
  }
  if (!takes.overrides && args.overrides.length > 0) return `reef ${cmd} reads no config, so ${args.overrides[0]} would change nothing`;
  // --data-dir is read instead of any config: the other was ignored without a word.
  if (args.flags.has('data-dir')) {
    if (args.flags.has('config')) return `reef ${cmd} takes -c FILE or --data-dir DIR, not both`;
    if (args.overrides.length > 0) return `reef ${cmd} --data-dir reads no config, so ${args.overrides[0]} would change nothing`;
  }
  return null;
}

export async function main(argv: readonly string[], io: Io = defaultIo): Promise<number> {
  let args: ParsedArgs;
  try {
    args = parseArgs(argv);
  } catch (err) {
    io.stderr(`reef: ${(err as Error).message}`);
    return 2;
  }
  const [cmd, ...rest] = args.positionals;
  if (args.flags.has('version')) {
    io.stdout((JSON.parse(readFileSync(join(repoRoot(), 'package.json'), 'utf8')) as { version: string }).version);
    return 0;
  }
  if (cmd === undefined || cmd === 'help' || args.flags.has('help')) {
    io.stdout(HELP);
    return cmd === undefined && !args.flags.has('help') ? 2 : 0;
  }
  const problem = flagProblem(cmd, args);
  if (problem !== null) {
    io.stderr(`reef: ${problem}`);
    return 2;
  }
  try {
    switch (cmd) {
      case 'up':
        return await upCommand(args, io);
      case 'status':
        return await statusCommand(args, io);
      case 'scale':
        return await scaleCommand(args, rest, io);
      case 'down':
        return await downCommand(args, io);
      case 'keys':
        return await keysCommand(args, rest, io);
      case 'export':
        return await exportCommand(args, io);
      case 'correlate':
        return await correlateCommand(args, io);
      case 'config':
        if (rest[0] !== 'check' || rest.length !== 2) {
          io.stderr('usage: reef config check FILE [--a.b=value ...]');
          return 2;
        }
        return await configCheck([rest[1]!, ...args.overrides], { stdout: { write: io.stdout }, stderr: { write: io.stderr } });
      default:
        io.stderr(`reef: unknown command ${JSON.stringify(cmd)}\n\n${HELP}`);
        return 2;
    }
  } catch (err) {
    if (err instanceof ReefError) {
      io.stderr(`reef: ${err.code}: ${err.message}`);
      return err.code === 'REEF_ERR_CONFIG_INVALID' || err.code === 'REEF_ERR_CONFIG_FILE' ? 2 : 1;
    }
    // A failed system call (a data dir that is a file, a full disk) is the user's to fix, and its
    // message names the call and the path: the stack trace that came with it only buried that.
    if (typeof (err as NodeJS.ErrnoException).syscall === 'string') {
      io.stderr(`reef: ${(err as Error).message}`);
      return 1;
    }
    io.stderr(`reef: ${(err as Error).stack ?? String(err)}`);
    return 1;
  }
}
