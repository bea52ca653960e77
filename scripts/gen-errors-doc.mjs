// Writes docs/errors.md from the error registry (actors/runtime/errors.ts, compiled in dist/).
// errors.test.ts fails when the two drift apart: run `npm run build && node scripts/gen-errors-doc.mjs`.
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const { ERRORS } = await import(join(root, 'dist/actors/runtime/errors.js'));
const rows = Object.entries(ERRORS).map(([code, s]) =>
  `| \`${code}\` | ${s.status ?? '—'} | ${s.retryable ? 'yes' : 'no'} | ${s.type} | ${s.message.replace(/\|/g, '\\|')}${s.retired ? ' (retired)' : ''} |`);
const doc = `# Error codes

Every error Reef raises carries a stable code from one registry (\`actors/runtime/errors.ts\`).
Match on the code, never on the message. HTTP errors use the OpenAI error body
\`{"error": {"message", "type", "param", "code"}}\` with \`code\` set to the Reef code; actor and
bridge replies use \`{type: "error", code, message, retryable}\`. A retired code is never reused.

| code | HTTP | retryable | type | message template |
| --- | --- | --- | --- | --- |
${rows.join('\n')}
`;
writeFileSync(join(root, 'docs/errors.md'), doc);
console.log(`docs/errors.md: ${rows.length} codes`);
