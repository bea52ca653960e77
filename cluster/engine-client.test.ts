import { describe, expect, it } from 'vitest';
import { generateBody } from './engine-client.js';

describe('generateBody', () => {
  it('writes typed and plain id arrays as the same JSON as JSON.stringify', () => {
    const req = { sampling_params: { max_new_tokens: 4, stop: null }, return_logprob: true, rid: 'r' };
    const ids = [0, 7, 2041, 151_643, -1];
    const expected = { ...req, stream: true, input_ids: ids };
    expect(JSON.parse(generateBody({ ...req, input_ids: Int32Array.from(ids) }, true))).toEqual(expected);
    expect(JSON.parse(generateBody({ ...req, input_ids: ids }, true))).toEqual(expected);
    expect(JSON.parse(generateBody({ ...req, input_ids: [] }, false))).toEqual({ ...req, stream: false, input_ids: [] });
  });

  it('leaves input_ids out when absent and refuses non-integers', () => {
    expect(JSON.parse(generateBody({ text: 'hi', sampling_params: {} }, false))).toEqual({ text: 'hi', sampling_params: {}, stream: false });
    expect(() => generateBody({ input_ids: [1, 2.5], sampling_params: {} }, false)).toThrow(/input_ids\[1\] is not an integer/);
  });
});
