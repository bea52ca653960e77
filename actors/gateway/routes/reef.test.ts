import { describe, expect, it } from 'vitest';
import { checkReport } from './reef.js';

describe('checkReport', () => {
  it('finds a duplicate reference in one pass (regression: a quadratic search held the event loop for seconds on a long list)', () => {
    const references = Array.from({ length: 50_000 }, (_, i) => `01M8NV70M0MR8ZXYQMS9${String(i).padStart(6, '0')}`);
    const t0 = performance.now();
    expect(checkReport({ score: 1, references })).toBeNull();
    // Quadratic, this took seconds; linear, a few milliseconds. The bound leaves room for a busy machine.
    expect(performance.now() - t0).toBeLessThan(1000);
    references.push(references[12_345]!);
    expect(checkReport({ score: 1, references })).toEqual(['references', `reference ${references[12_345]} appears twice`]);
  });
});
