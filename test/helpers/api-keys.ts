import { createHash } from 'node:crypto';

/**
 * An API key long enough for the config (cluster/config/schema.ts MIN_API_KEY_LENGTH), the same on
 * every run and readable in a failure: `name-` and 32 hex digits derived from the name, so two names
 * never share a key (nor, in practice, a key id).
 */
export function testKey(name: string): string {
  return `${name}-${createHash('sha256').update(name).digest('hex').slice(0, 32)}`;
}
