import { describe, expect, it } from 'vitest';
import { sampleRecord } from '../../actors/gateway/store/fixtures.js';
import type { AgentRecord } from '../../actors/gateway/store/types.js';
import { recordFromJson, recordToJson } from './export.js';

describe('reef export lines', () => {
  it('read back every logprob as recorded: a missing one (NaN) does not come back as a masked one (-Infinity)', () => {
    const base = sampleRecord(1, { outputTokens: 3, topK: 2 });
    // The gateway records NaN where the engine gave no logprob for a token, -Infinity for a masked candidate.
    const record = {
      ...base, id: '01ARZ3NDEKTSV4RRFFQ69G5FAV', offset: 1,
      logprobs: Float32Array.from([Number.NaN, -0.5, Number.NEGATIVE_INFINITY]),
      topkLogprobs: Float32Array.from([-0.25, Number.NEGATIVE_INFINITY, Number.NaN, Number.POSITIVE_INFINITY, -1, -2]),
    } as AgentRecord;
    const back = recordFromJson(recordToJson(record));
    expect(Array.from(back.logprobs)).toEqual(Array.from(record.logprobs));
    expect(Array.from(back.topkLogprobs)).toEqual(Array.from(record.topkLogprobs));
    expect(Array.from(back.promptIds)).toEqual(Array.from(record.promptIds));
    // A masked candidate stays null, as earlier exports wrote it.
    expect(JSON.parse(recordToJson(record)).topkLogprobs[1]).toBeNull();
  });
});
