import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { renderErrorsDoc } from '../../actors/runtime/errors-doc.js';
import { repoRoot } from '../../cluster/paths.js';

describe('docs/errors.md', () => {
  it('is what npm run errors:doc writes from the registry (run it; do not edit the doc by hand)', () => {
    expect(readFileSync(join(repoRoot(), 'docs/errors.md'), 'utf8')).toBe(renderErrorsDoc());
  });

  it('shows a retired code as retired and escapes a | in a message', () => {
    const doc = renderErrorsDoc({ REEF_ERR_X: { message: 'a | b', status: null, retryable: false, type: 'server_error', retired: true } });
    expect(doc).toContain('| `REEF_ERR_X` | — | no | server_error | a \\| b (retired) |');
  });
});
