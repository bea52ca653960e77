/** `reef config check FILE [--a.b=c ...]`: print the resolved config, or every problem with it. */
import { ConfigError, formatIssue } from './errors.js';
import { parseOverrides } from './overrides.js';
import { loadConfig } from './resolve.js';
import type { ReefConfig } from './types.js';

export interface Output {
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
}

const USAGE = 'usage: reef config check FILE [--path.to.key=value ...]\n';

/** The config as printed: literal API keys are masked so the output can be shared. */
export function redact(cfg: ReefConfig): unknown {
  return { ...cfg, reef: { ...cfg.reef, api_keys: cfg.reef.api_keys.map((k) => ({ ...k, key: k.key === null ? null : '***' })) } };
}

/** Returns the exit code: 0 valid, 2 invalid (or bad usage). */
export async function configCheck(argv: readonly string[], out: Output): Promise<number> {
  const { overrides, rest } = parseOverrides(argv);
  if (rest.length !== 1 || rest[0]!.startsWith('-')) {
    out.stderr.write(USAGE);
    return 2;
  }
  try {
    const cfg = await loadConfig(rest[0]!, overrides);
    out.stdout.write(`${JSON.stringify(redact(cfg), null, 2)}\n`);
    return 0;
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    for (const issue of err.issues) out.stderr.write(`${formatIssue(issue)}\n`);
    return 2;
  }
}
