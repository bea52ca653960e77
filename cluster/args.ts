import { closest } from './config/keys.js';

/**
 * A small argv parser for the reef CLI: flags (`--json`, `-c FILE`, `--config=FILE`), config
 * overrides (`--a.b.c=value`, kept aside for the config loader) and positionals.
 */
export interface ParsedArgs {
  positionals: string[];
  flags: Map<string, string | true>;
  /** `--a.b=c` config overrides, in order. */
  overrides: string[];
}

const ALIASES: Record<string, string> = { c: 'config', h: 'help', d: 'detach' };
/** Flags that take a value when written as `--flag value`. */
const VALUED = new Set(['config', 'data-dir', 'scenario', 'out', 'session-ttl-s', 'max-open-sessions']);

/**
 * The flags each command reads (besides --help and --version). Another one is a mistake that would
 * otherwise run the command without it: `reef config check F --data-dir D` checked F and said
 * nothing of D. Config overrides count only where a config is loaded. `args`: the most arguments
 * the command reads after its name; more were ignored (`reef up -c a.yaml b.yaml` started a.yaml,
 * `reef down prm` stopped the whole stack).
 */
export const COMMAND_FLAGS: Readonly<Record<string, { flags: readonly string[]; overrides: boolean; args: number }>> = {
  up: { flags: ['config', 'detach'], overrides: true, args: 0 },
  status: { flags: ['config', 'data-dir', 'json'], overrides: true, args: 0 },
  scale: { flags: ['config', 'data-dir'], overrides: true, args: 2 },
  down: { flags: ['config', 'data-dir'], overrides: true, args: 0 },
  keys: { flags: ['config', 'data-dir'], overrides: true, args: 1 },
  export: { flags: ['config', 'data-dir', 'scenario', 'out'], overrides: true, args: 1 },
  correlate: { flags: ['json', 'session-ttl-s', 'max-open-sessions'], overrides: false, args: 1 },
  config: { flags: [], overrides: true, args: 2 },
};

/** Every flag some command reads: any other one is a typo, caught before the command is known. */
const KNOWN = new Set([...Object.values(COMMAND_FLAGS).flatMap((c) => c.flags), 'help', 'version']);

export function parseArgs(argv: readonly string[]): ParsedArgs {
  const positionals: string[] = [];
  const flags = new Map<string, string | true>();
  const overrides: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '--') {
      positionals.push(...argv.slice(i + 1));
      break;
    }
    if (arg.startsWith('--') && arg.slice(2).split('=')[0]!.includes('.')) {
      // A dotted flag is a config override, never a CLI flag.
      if (!arg.includes('=')) throw new Error(`config override ${arg} needs a value: ${arg}=VALUE`);
      overrides.push(arg);
      continue;
    }
    const long = arg.startsWith('--') ? arg.slice(2) : arg.startsWith('-') && arg.length > 1 ? arg.slice(1) : null;
    if (long === null) {
      positionals.push(arg);
      continue;
    }
    const eq = long.indexOf('=');
    const rawName = eq >= 0 ? long.slice(0, eq) : long;
    const name = ALIASES[rawName] ?? rawName;
    if (!KNOWN.has(name)) {
      const hint = closest(name, KNOWN);
      throw new Error(`unknown flag ${arg.slice(0, arg.length - long.length + rawName.length)}${hint === null ? '' : ` (did you mean --${hint}?)`}`);
    }
    if (VALUED.has(name)) {
      const value = eq >= 0 ? long.slice(eq + 1) : argv[++i];
      // An empty value read as no flag: `reef down --data-dir "$DIR"` with DIR unset stopped the
      // stack of the default data dir.
      if (value === undefined || value === '' || (eq < 0 && value.startsWith('-'))) throw new Error(`--${name} needs a value`);
      flags.set(name, value);
    } else if (eq < 0 || long.slice(eq + 1) === 'true') flags.set(name, true);
    // Any other value read as false: `reef up --detach=yes` ran in the foreground.
    else if (long.slice(eq + 1) !== 'false') throw new Error(`--${name} takes no value (or =true, =false), not ${JSON.stringify(long.slice(eq + 1))}`);
  }
  return { positionals, flags, overrides };
}

export function flagString(args: ParsedArgs, name: string): string | null {
  const v = args.flags.get(name);
  return typeof v === 'string' ? v : null;
}

export function flagBool(args: ParsedArgs, name: string): boolean {
  return args.flags.get(name) === true;
}
