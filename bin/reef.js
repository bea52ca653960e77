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
const { main } = await import(entry);
process.exitCode = await main(process.argv.slice(2));
