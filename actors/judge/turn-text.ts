import { canonicalJson, contentText, nextStateOf } from './correlate/index.js';

/**
 * What the PRM reads of a turn, taken from the records: the message the reply answered, and the
 * reply with its tool calls. Non-text content is shown as canonical JSON rather than dropped, so
 * the PRM sees that something was there.
 */

function asText(content: unknown): string {
  const text = contentText(content);
  return text ?? canonicalJson(content);
}

/**
 * What the assistant was answering: the user or tool message(s) after the request's last assistant
 * message, read by the same rule as a next state. A harness may append a system reminder after
 * them, which the reply did not answer. Without such a message, the newest message.
 */
export function contextOf(messages: readonly unknown[]): string {
  const answered = nextStateOf(messages as unknown[], -1);
  if (answered !== null) return answered.content;
  const last = messages[messages.length - 1] as { role?: unknown; content?: unknown } | undefined;
  if (last === undefined || last === null || typeof last !== 'object') return '';
  return asText(last.content);
}

/**
 * The task an agent works on: the request's first user message (an agent loop resends it on each
 * call), or '' without one. The step prompt shows it; a chat turn's prompts do not.
 */
export function taskOf(messages: readonly unknown[]): string {
  const first = messages.find((m) => (m as { role?: unknown } | null)?.role === 'user') as { content?: unknown } | undefined;
  return first === undefined ? '' : asText(first.content);
}

/** The assistant's reply: its text, then one line per tool call (`tool call: name(args)`). */
export function replyOf(response: unknown): string {
  if (response === null || typeof response !== 'object') return '';
  const r = response as { content?: unknown; tool_calls?: unknown };
  const parts: string[] = [];
  const text = asText(r.content ?? '');
  if (text !== '') parts.push(text);
  if (Array.isArray(r.tool_calls)) {
    for (const call of r.tool_calls) {
      const fn = (call as { function?: { name?: unknown; arguments?: unknown } } | null)?.function;
      if (fn === undefined || fn === null) continue;
      const args = typeof fn.arguments === 'string' ? fn.arguments : canonicalJson(fn.arguments ?? null);
      parts.push(`tool call: ${String(fn.name)}(${args})`);
    }
  }
  return parts.join('\n');
}
