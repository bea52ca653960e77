import { parseArgs } from 'node:util';

type Options = Record<string, { type: 'string' } | { type: 'boolean' }>;

/**
 * The flags of a long-running bench command (`npm run soak`, `npm run powerloss`): parsed, with
 * `--help` answered, and `fail` for a bad value, which prints the usage and exits 2.
 */
export function commandLine<const O extends Options>(name: string, usage: string, options: O) {
  const fail = (message: string): never => {
    process.stderr.write(`${name}: ${message}\n\n${usage}\n`);
    process.exit(2);
  };
  const config = { options: { ...options, help: { type: 'boolean' } } } as const;
  let parsed: ReturnType<typeof parseArgs<typeof config>> | undefined;
  try {
    parsed = parseArgs(config);
  } catch (err) {
    fail((err as Error).message);
  }
  if ((parsed!.values as { help?: boolean }).help) {
    process.stdout.write(`${usage}\n`);
    process.exit(0);
  }
  return { values: parsed!.values, fail };
}
