/**
 * The smallest logger that serves the runtime: one line per event on stderr, so that stdout stays
 * free for machine-readable output (a child's ready line, a CLI's JSON).
 */
export type LogFn = (line: string) => void;

export const stderrLog: LogFn = (line) => {
  process.stderr.write(`${line}\n`);
};

export const silentLog: LogFn = () => {};

/** A logger whose lines start with `prefix: `. */
export function prefixed(log: LogFn, prefix: string): LogFn {
  return (line) => log(`${prefix}: ${line}`);
}
