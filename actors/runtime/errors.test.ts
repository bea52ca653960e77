import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../cluster/paths.js';
import { ERRORS, ReefError } from './errors.js';

describe('error registry', () => {
  const doc = readFileSync(join(repoRoot(), 'docs/errors.md'), 'utf8');

  it('is documented in docs/errors.md, code by code (regenerate: node scripts/gen-errors-doc.mjs)', () => {
    for (const [code, spec] of Object.entries(ERRORS)) {
      const row = doc.split('\n').find((l) => l.startsWith(`| \`${code}\` |`));
      expect(row, `${code} is missing from docs/errors.md`).toBeDefined();
      expect(row).toContain(`| ${spec.status ?? '—'} | ${spec.retryable ? 'yes' : 'no'} | ${spec.type} |`);
    }
    const documented = [...doc.matchAll(/^\| `(REEF_ERR_\w+)` \|/gm)].map((m) => m[1]);
    expect(documented.filter((c) => !(c! in ERRORS)), 'documented codes that are not in the registry').toEqual([]);
  });

  it('uses REEF_ERR_ codes and HTTP statuses in the 4xx/5xx range', () => {
    for (const [code, spec] of Object.entries(ERRORS)) {
      expect(code).toMatch(/^REEF_ERR_[A-Z0-9_]+$/);
      if (spec.status !== null) expect(spec.status >= 400 && spec.status < 600).toBe(true);
    }
  });

  it('fills message templates and round-trips through the wire shape', () => {
    const err = new ReefError('REEF_ERR_TIMEOUT', { what: 'ping', ms: 5 });
    expect(err.message).toBe('ping timed out after 5 ms');
    const back = ReefError.fromReply(err.toReply('r1'));
    expect([back.code, back.message, back.retryable]).toEqual(['REEF_ERR_TIMEOUT', err.message, true]);
  });

  it('keeps an unknown code from a newer peer readable instead of throwing', () => {
    const back = ReefError.fromReply({ type: 'error', requestId: null, code: 'REEF_ERR_FROM_THE_FUTURE', message: 'x', retryable: false });
    expect(back.code).toBe('REEF_ERR_HANDLER');
    expect(back.message).toBe('x');
  });
});
