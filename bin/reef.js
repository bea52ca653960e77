#!/usr/bin/env node
// The CLI is written in TypeScript and compiled to dist/; run `npm run build` (or `npm run setup`) first.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const entry = join(root, 'dist', 'cluster', 'cli.js');
if (!existsSync(entry)) {
  console.error(`reef: ${entry} is missing; run \`npm run build\` in ${root} first`);
  process.exit(2);
}
// A reader that goes away (`reef up 2>&1 | grep -m1 'reef is up'`) made the next log line throw
// EPIPE, which killed a running stack without draining it: its output is dropped instead.
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (err) => {
    if (err.code !== 'EPIPE') throw err;
  });
}
const { main } = await import(entry);
process.exitCode = await main(process.argv.slice(2));
