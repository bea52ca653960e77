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

## On the Anthropic Messages API

Errors on \`/v1/messages\` and \`/v1/messages/count_tokens\` (and any other \`/v1/messages/...\` path),
whichever step refuses them (authentication, rate limits, the body's size, the request itself,
the engine), use Anthropic's body instead: \`{"type": "error", "error": {"type", "message",
"details": {"error_code"}}}\`, with the Reef code as \`details.error_code\` (the official SDK's
\`errorCode\`). Their status and \`type\` follow Anthropic's, from the code's HTTP status above; a
failure mid-stream is an \`error\` event with the same body.

| HTTP above | Anthropic status | Anthropic type |
| --- | --- | --- |
| 400 | 400 | invalid_request_error |
| 401 | 401 | authentication_error |
| 403 | 403 | permission_error |
| 404 | 404 | not_found_error |
| 409 | 409 | conflict_error |
| 413 | 413 | request_too_large |
| 429 | 429 | rate_limit_error |
| 503 | 529 | overloaded_error |
| 504 | 504 | timeout_error |
| other 4xx | the same | invalid_request_error |
| other 5xx | 500 | api_error |
`;
}
