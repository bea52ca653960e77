/**
 * docs/errors.md as `npm run errors:doc` writes it from the registry. The doc is generated, never
 * edited by hand: test/docs/errors-doc.test.ts compares it with this text, byte for byte.
 */
import { ERRORS, type ErrorSpec } from './errors.js';

export function renderErrorsDoc(errors: Readonly<Record<string, ErrorSpec>> = ERRORS): string {
  const rows = Object.entries(errors).map(
    ([code, s]) => `| \`${code}\` | ${s.status ?? '—'} | ${s.retryable ? 'yes' : 'no'} | ${s.type} | ${s.message.replace(/\|/g, '\\|')}${s.retired ? ' (retired)' : ''} |`,
  );
  return `# Error codes

Every error Reef raises carries a stable code from one registry (\`actors/runtime/errors.ts\`).
Match on the code, never on the message. HTTP errors use the OpenAI error body
\`{"error": {"message", "type", "param", "code"}}\` with \`code\` set to the Reef code; actor and
bridge replies use \`{type: "error", code, message, retryable}\`. A retired code is never reused.

| code | HTTP | retryable | type | message template |
| --- | --- | --- | --- | --- |
${rows.join('\n')}
`;
}
