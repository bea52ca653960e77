import { describe, expect, it } from 'vitest';
import { clip, loadTemplate, renderPrompt } from './prompts.js';
import { decide, majority, parseHint, parseVote, selectHints, verdict, type Vote } from './votes.js';

describe('parseVote: the last \\boxed{} counts, only 1, -1, 0', () => {
  it.each<[string | null, Vote | null]>([
    ['\\boxed{1}', 1],
    ['\\boxed{-1}', -1],
    ['\\boxed{0}', 0],
    ['reasoning... \\boxed{ -1 }', -1],
    ['\\boxed{\u22121}', -1],
    ['first \\boxed{1} then on reflection \\boxed{-1}', -1],
    ['first \\boxed{-1} then \\boxed{1}', 1],
    ['\\boxed{1} but finally \\boxed{2}', null],
    // A sign on the accept verdict, and the dashes a model may write for a minus.
    ['\\boxed{+1}', 1],
    ['\\boxed{\\text{+1}}', 1],
    ['\\boxed{+0}', null],
    ['\\boxed{\u20131}', -1],
    ['\\boxed{\uff0d1}', -1],
    ['\\boxed{\\text{-1}}', -1],
    ['\\boxed{ \\textbf{1} }', 1],
    ['first \\boxed{1} then on reflection \\boxed{\\text{-1}}', -1],
    ['\\boxed{-1} then \\boxed{\\frac{1}{2}}', null],
    ['\\boxed{1} then a cut-off \\boxed{-', 1],
    ['\\boxed{yes}', null],
    ['\\boxed{}', null],
    ['boxed{1}', null],
    ['no verdict at all', null],
    // Reasoning weighs the verdicts; only the answer after it counts.
    ['<think>\\boxed{1} if accepted, \\boxed{0} if I cannot tell</think>\n\\boxed{-1}', -1],
    ['<think>It was redone, so \\boxed{-1}</think>\nThe user moved on.', null],
    ['The template opened it: \\boxed{1} if accepted.</think>\\boxed{0}', 0],
    ['<think>cut off at prm_max_tokens: \\boxed{0} if I cannot tell', null],
    ['\\boxed{1} <think>a second block, cut off: \\boxed{-1}', 1],
    ['', null],
    [null, null],
  ])('%j → %j', (text, want) => {
    expect(parseVote(text)).toBe(want);
  });
});

describe('majority: tie or no valid vote → 0', () => {
  it.each<[(Vote | null)[], Vote]>([
    [[1, 1, -1], 1],
    [[-1, -1, 1], -1],
    [[1, -1, 0], 0],
    [[1, -1], 0],
    [[1, null, null], 1],
    [[-1, null, 0, -1], -1],
    [[0, 0, 1], 0],
    [[null, null, null], 0],
    [[], 0],
    [[1, 1, -1, -1, 0], 0],
  ])('%j → %j', (votes, want) => {
    expect(majority(votes)).toBe(want);
  });
});

describe('hints', () => {
  it('parseHint takes the last complete pair, trimmed', () => {
    expect(parseHint('[HINT_START] Use plain prose. [HINT_END] \\boxed{1}')).toBe('Use plain prose.');
    expect(parseHint('[HINT_START]a[HINT_END] [HINT_START]b b[HINT_END]')).toBe('b b');
    expect(parseHint('[HINT_START]never closed')).toBeNull();
    expect(parseHint('I end with [HINT_START] and the closing marker.\n[HINT_START]Use plain prose.[HINT_END]')).toBe('Use plain prose.');
    expect(parseHint(null)).toBeNull();
    // A hint drafted in the reasoning is not the answer's hint.
    expect(parseHint('<think>Maybe [HINT_START]Use a table.[HINT_END]? No.</think>\n\\boxed{1}')).toBeNull();
    expect(parseHint('<think>[HINT_START]Use a table.[HINT_END]</think>[HINT_START]Use plain prose.[HINT_END]\\boxed{1}')).toBe('Use plain prose.');
    expect(parseHint('<think>cut off: [HINT_START]Use a table.[HINT_END] \\boxed{1}')).toBeNull();
  });

  const h = (hint: string, vote = '1') => `[HINT_START]${hint}[HINT_END]\n\\boxed{${vote}}`;
  it.each<[string, (string | null)[], number, string[]]>([
    ['only accepting votes', [h('Reply without any lists.', '-1'), h('Reply in plain prose please.')], 3, ['Reply in plain prose please.']],
    ['longer than 10 characters', [h('Be brief.'), h('0123456789'), h('0123456789a')], 3, ['0123456789a']],
    ['de-duplicated up to whitespace', [h('Show every step.'), h('Show  every\nstep.'), h('Show every step, no bold.')], 3, ['Show every step.', 'Show every step, no bold.']],
    ['shortest first, at most max', [h('A much longer hint text here.'), h('Medium hint text.'), h('Short hint!')], 2, ['Short hint!', 'Medium hint text.']],
    ['failed calls and missing hints', [null, '\\boxed{1}', h('Use the search tool first.')], 3, ['Use the search tool first.']],
    ['accept box must be the last box', ['[HINT_START]Write it in French.[HINT_END] \\boxed{1} \\boxed{-1}'], 3, []],
  ])('%s', (_name, outputs, max, want) => {
    expect(selectHints(outputs, max)).toEqual(want);
  });
});

describe('decision table', () => {
  it.each<[Vote, string[], ReturnType<typeof decide>]>([
    [1, ['Keep it short.'], { decision: 'hint', reward: 1, teacherCandidates: ['Keep it short.'] }],
    [-1, ['Keep it short.', 'No lists at all.'], { decision: 'hint', reward: -1, teacherCandidates: ['Keep it short.', 'No lists at all.'] }],
    [0, ['Keep it short.'], { decision: 'hint', reward: 0, teacherCandidates: ['Keep it short.'] }],
    [1, [], { decision: 'anchor', reward: 1, teacherCandidates: [null] }],
    [-1, [], { decision: 'anchor', reward: -1, teacherCandidates: [null] }],
    [0, [], { decision: 'dropped', reward: 0, teacherCandidates: [] }],
  ])('score %j, hints %j', (score, hints, want) => {
    expect(decide(score, hints)).toEqual(want);
  });
});

describe('verdict', () => {
  it('counts failed and invalid votes and keeps the raw outputs', () => {
    const v = verdict(
      [{ output: '\\boxed{-1}', error: null }, { output: null, error: 'REEF_ERR_TIMEOUT' }, { output: 'hmm', error: null }],
      [{ output: '[HINT_START]Do not use bold text.[HINT_END]\\boxed{1}', error: null }, { output: null, error: 'boom' }, { output: '\\boxed{-1}', error: null }],
      3,
    );
    expect(v.score).toEqual({ votes: [-1, null, null], outputs: ['\\boxed{-1}', null, 'hmm'], errors: [null, 'REEF_ERR_TIMEOUT', null], result: -1 });
    expect(v.hint.hints).toEqual(['Do not use bold text.']);
    expect(v).toMatchObject({ decision: 'hint', reward: -1, teacherCandidates: ['Do not use bold text.'], votesOk: 4, votesFailed: 2, votesInvalid: 1 });
  });

  it('every call failed → dropped', () => {
    const failed = [{ output: null, error: 'x' }];
    expect(verdict(failed, failed, 3)).toMatchObject({ decision: 'dropped', reward: 0, votesOk: 0, votesFailed: 2 });
  });
});

describe('prompts', () => {
  const turn = { task: 'Sum it up {{reply}}', context: 'What is 2+2? {{reply}}', reply: '**4**', nextState: { role: 'user' as const, content: 'Thanks!' } };
  it('fill every placeholder once; turn text is never expanded again', () => {
    for (const kind of ['score', 'step', 'hint'] as const) {
      const text = renderPrompt(kind, turn);
      expect(text).not.toMatch(/\{\{(task|context|next_role|next_state)\}\}/);
      expect(text).toContain('What is 2+2? {{reply}}');
      expect(text).toContain('**4**');
      expect(text).toContain('(from the user)');
      expect(text).toContain('Thanks!');
    }
  });

  it('clip keeps head and tail, and never cuts an emoji in half', () => {
    expect(clip('abcdefghij', 10)).toBe('abcdefghij');
    expect(clip('0123456789abcdef', 10)).toBe('0123\n[… 6 characters left out …]\nabcdef');
    // 4 + 6 of 10: the head would end, and the tail start, between the halves of a pair.
    const text = `abc\u{1F600}${'x'.repeat(10)}\u{1F600}defgh`;
    const clipped = clip(text, 10);
    expect(clipped).toBe(`abc\n[… 14 characters left out …]\ndefgh`);
    expect(clipped.isWellFormed()).toBe(true);
    expect(clip('\u{1F600}'.repeat(10), 10).isWellFormed()).toBe(true);
  });

  it('say what counts as acceptance and rejection, and how to answer', () => {
    const score = loadTemplate('score');
    for (const words of ['moves on', 'thanks', 'tool', 'redone', 'corrects', 'complains', 'fails', '\\boxed{1}', '\\boxed{-1}', '\\boxed{0}']) expect(score).toContain(words);
    const hint = loadTemplate('hint');
    for (const words of ['[HINT_START]', '[HINT_END]', '\\boxed{1}', '\\boxed{-1}', 'up front']) expect(hint).toContain(words);
  });
});
