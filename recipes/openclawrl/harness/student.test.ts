import { describe, expect, it } from 'vitest';
import { generateProblems } from './problems.js';
import { DONE, ScriptedStudent, studentText, v1Url, type ScriptedStudentOptions } from './student.js';

const problem = generateProblems(1)[0]!;
const PLAIN = 'First 4 × 3 = 12, then 12 + 5 = 17, so it is 17.';

async function afterReplies(replies: Array<{ reply: string; saved?: boolean; finishReason?: string }>, opts: ScriptedStudentOptions = {}, index = 1) {
  const s = new ScriptedStudent(opts).begin(problem, index);
  const opening = await s.opening();
  const moves = [];
  for (const r of replies) moves.push(await s.respond({ reply: r.reply, saved: r.saved ?? false, finishReason: r.finishReason ?? null }));
  return { opening, moves };
}

describe('scripted student of the real-model experiment', () => {
  const plainAnswer: ScriptedStudentOptions = { dislikes: ['bold', 'list', 'header'], requireSteps: false, requireAnswer: true, save: false, maxReplies: 3 };

  it('minds only what it dislikes, and ends the session on the first acceptable reply', async () => {
    const { moves } = await afterReplies([{ reply: 'He earns 48. \\boxed{48}' }], plainAnswer);
    expect(moves[0]!.done).toBe(true);
    expect(moves[0]!.text).toContain(DONE);
    expect(moves[0]!.text).not.toMatch(/save/i);
  });

  it('asks for the answer when a reply does not end with one, or was cut off', async () => {
    for (const r of [{ reply: 'You multiply the rate by the hours.' }, { reply: 'He earns 12 × 4 = 48 a day, so over', finishReason: 'length' }]) {
      const { moves } = await afterReplies([r], plainAnswer);
      expect(moves[0]).toEqual({ text: expect.stringMatching(/answer/), done: false });
    }
  });

  it('after its last allowed reply still complains, so that reply is judged too, and ends', async () => {
    const bad = { reply: '#### 48\nThe answer is 48.' };
    const { moves } = await afterReplies([bad, bad, bad], plainAnswer);
    expect(moves.map((m) => m.done)).toEqual([false, false, true]);
    expect(moves[2]!.text).toMatch(/headings/);
    expect(moves[2]!.text).toContain(DONE);
  });
});

describe('scripted student', () => {
  it('opens with the problem and asks for help', async () => {
    const { opening } = await afterReplies([]);
    expect(opening).toContain(problem.question);
    expect(opening).toMatch(/help|stuck|solve/i);
  });

  it.each([
    ['bold', 'It is **17**. 4 × 3 = 12, 12 + 5 = 17', /bold text/],
    ['a list', '- 4 × 3 = 12\n- 12 + 5 = 17', /bullet points or numbered lists/],
    ['a header', '# Solution\n4 × 3 = 12, 12 + 5 = 17', /headings/],
    ['boxed', '4 × 3 = 12, 12 + 5 = 17 \\boxed{17}', /\\boxed/],
    ['a final answer line', '4 × 3 = 12, 12 + 5 = 17\nFinal answer: 17', /Final answer:/],
    ['a table', '| a | b |\n|---|---|\n4 × 3 = 12, 12 + 5 = 17', /tables/],
  ])('asks for a rewrite naming %s', async (_name, reply, named) => {
    const { moves } = await afterReplies([{ reply }]);
    expect(moves[0]!.done).toBe(false);
    expect(moves[0]!.text).toMatch(named);
    expect(moves[0]!.text).not.toMatch(/save/i);
  });

  it('names every violation at once', async () => {
    const { moves } = await afterReplies([{ reply: '**17**\n- 4 × 3 = 12\n- 12 + 5 = 17' }]);
    expect(moves[0]!.text).toContain('bold text and bullet points or numbered lists');
  });

  it('asks for the calculations when too few are shown, unless told not to', async () => {
    const few = await afterReplies([{ reply: 'It is 17.' }]);
    expect(few.moves[0]!.text).toMatch(/calculations|sums/);
    const bold = await afterReplies([{ reply: 'It is **17**.' }]);
    expect(bold.moves[0]!.text).toMatch(/bold text[\s\S]*calculations/);
    const lax = await afterReplies([{ reply: 'It is 17.' }], { requireSteps: false });
    expect(lax.moves[0]!.text).toMatch(/save/i);
  });

  it('asks to save in a separate message, then ends after the save', async () => {
    const { moves } = await afterReplies([{ reply: '**17**' + PLAIN }, { reply: PLAIN }, { reply: 'Saved!', saved: true }]);
    expect(moves.map((m) => m.done)).toEqual([false, false, true]);
    expect(moves[1]!.text).toMatch(/save/i);
    expect(moves[1]!.text).not.toContain(DONE);
    expect(moves[2]!.text).toContain(DONE);
    expect(moves[2]!.text).not.toMatch(/never mind|didn't/);
  });

  it('ends even when the agent does not save', async () => {
    const { moves } = await afterReplies([{ reply: PLAIN }, { reply: 'Sure, here it is again.' }]);
    expect(moves[1]!.done).toBe(true);
    expect(moves[1]!.text).toContain(DONE);
    expect(moves[1]!.text).toMatch(/never mind|didn't save/);
  });

  it('asks again after an empty reply', async () => {
    const { moves } = await afterReplies([{ reply: '  ' }]);
    expect(moves[0]).toMatchObject({ done: false });
    expect(moves[0]!.text).toMatch(/solution|solve/);
  });

  it('is deterministic, and its wording varies across sessions', async () => {
    const a = await afterReplies([{ reply: '**17**' }], {}, 3);
    const b = await afterReplies([{ reply: '**17**' }], {}, 3);
    expect(b).toEqual(a);
    const texts = new Set<string>();
    for (let i = 1; i <= 12; i++) texts.add((await afterReplies([{ reply: '**17**' }], {}, i)).moves[0]!.text);
    expect(texts.size).toBeGreaterThan(1);
  });
});

describe('LLM student helpers', () => {
  it.each([
    ['<think>the helper used bold</think>\n\nno bold please', 'no bold please'],
    ['reasoning without an opening tag</think> ok', 'ok'],
    ['  plain  ', 'plain'],
    // Regression: reasoning cut off by max_tokens was sent to the agent as the student's message.
    ['<think>\nthe helper used bold, so I should', ''],
    ['<think>a</think> keep this <think>cut off', 'keep this'],
    [null, ''],
  ])('studentText(%j)', (raw, want) => {
    expect(studentText(raw)).toBe(want);
  });

  it.each([
    ['http://h:1', 'http://h:1/v1'],
    ['http://h:1/', 'http://h:1/v1'],
    ['http://h:1/v1', 'http://h:1/v1'],
    ['http://h:1/v1/', 'http://h:1/v1'],
  ])('v1Url(%s)', (url, want) => {
    expect(v1Url(url)).toBe(want);
  });
});
