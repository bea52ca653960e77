import { describe, expect, it } from 'vitest';
import { findEquations, numberTokens } from './arith.js';
import { checkReply, endsWithAnswer, finalNumber, PLAIN_ANSWER_RULE, rollingRates, scoreSession, sessionsToAdaptation, stripCode, type Violation } from './scoring.js';

const PLAIN = 'She buys 4 pens, so 4 × 3 = 12 dollars.\nWith the bag it is 12 + 5 = 17 dollars, so she pays 17.';

describe('formatting rules', () => {
  const cases: Array<[string, string, Violation[]]> = [
    ['plain prose', PLAIN, []],
    ['bold with stars', 'The total is **17** dollars.', ['bold']],
    ['bold with underscores', 'The total is __17 dollars__.', ['bold']],
    ['bold spanning words', 'So **she pays 17** in total.', ['bold']],
    ['bold italic', 'It is ***17***.', ['bold']],
    ['one-letter bold', 'Answer **x** here', ['bold']],
    ['stars around spaces are not bold', '2 ** 3 = 8 and 4 ** 2 = 16', []],
    ['single star multiplication', 'multiply 2*3 to get 6', []],
    ['bold inside inline code', 'In Python `2**3**2` is big.', []],
    ['bold inside a fenced block', 'See:\n```\nx = **y**\n```\nDone.', []],
    ['bold after an unterminated fence', 'See:\n```\n**y**', []],
    ['snake_case is not bold', 'the variable total__sum__value', []],
    ['dunder word is bold', 'call __init__ first', ['bold']],
    ['bold does not cross a blank line', 'a ** b\n\nc d**', []],
    ['ATX header', '# Solution\nIt is 17.', ['header']],
    ['deep ATX header', '### Step 1\nIt is 17.', ['header']],
    ['hashtag is not a header', '#1 fan of math', []],
    ['setext header', 'Solution\n========\nIt is 17.', ['header']],
    ['setext h2 under text', 'Solution\n---\nIt is 17.', ['header']],
    ['horizontal rule', 'Part one.\n\n---\n\nPart two.', ['rule']],
    ['starred rule', 'Part one.\n\n* * *\n\nPart two.', ['rule']],
    ['bullet list', 'Steps:\n- 4 × 3 = 12\n- 12 + 5 = 17', ['list']],
    ['star bullet', '* first\n* second', ['list']],
    ['plus bullet', '+ first', ['list']],
    ['unicode bullet', '• first', ['list']],
    ['numbered list', '1. Multiply.\n2. Add.', ['list']],
    ['numbered with paren', '1) Multiply.', ['list']],
    ['a sentence with a minus is not a list', 'We get 20 -3 = 17 in the end.', []],
    ['negative number at line start is not a list', '-3 + 20 = 17 is the sum.', []],
    ['a number ending a sentence is not a list', 'Total: 17. That is all.', []],
    ['boxed', 'So the answer is $\\boxed{17}$.', ['boxed']],
    ['final answer line', 'Final answer: 17', ['final-answer']],
    ['final answer in bold', '**Final Answer:** 17', ['bold', 'final-answer']],
    ['final answer mid-line', 'So my final answer: 17', ['final-answer']],
    ['final answer without colon', 'That is my final answer.', []],
    ['table', '| item | cost |\n| --- | --- |\n| pens | 12 |', ['table']],
    ['aligned table', 'a | b\n:--- | ---:\n1 | 2', ['table']],
    ['pipes without a delimiter row', 'a | b and c | d', []],
    ['everything', '# Hi\n**17**\n- a\n\\boxed{1}\nFinal answer: 1\n\n---\n\n| a | b |\n|---|---|', ['bold', 'header', 'list', 'boxed', 'final-answer', 'rule', 'table']],
  ];
  it.each(cases)('%s', (_name, text, want) => {
    expect(checkReply(text).violations).toEqual(want);
  });

  it('reports bold and list flags', () => {
    expect(checkReply('**a**\n- b')).toMatchObject({ bold: true, list: true });
    expect(checkReply(PLAIN)).toMatchObject({ bold: false, list: false });
  });

  it('strips code but keeps the line structure', () => {
    const text = 'a `b` c\n```\nx\ny\n```\nz';
    expect(stripCode(text).split('\n')).toHaveLength(text.split('\n').length);
    expect(stripCode(text)).not.toContain('b');
  });
});

describe('calculation steps', () => {
  const cases: Array<[string, number]> = [
    ['3 × 4 = 12', 1],
    ['3 × 4 = 12 and 12 + 5 = 17', 2],
    ['chain 3 × 4 = 12 + 5 = 17', 2],
    ['3*4=12, 12-2=10, 10/2=5', 3],
    ['(48 + 12) ÷ 6 = 10', 1],
    ['2 × (3 + 4) = 14', 1],
    ['$1,200 - $200 = $1,000', 1],
    ['20% × 50 = 10', 1],
    ['3 x 4 = 12', 1],
    ['12.5 + 0.5 = 13', 1],
    ['multiply 2*3 to get six', 0],
    ['the answer = 17', 0],
    ['x = 5', 0],
    ['17 dollars', 0],
    ['page 3-4 of the book', 0],
    ['abc3 + 4 = 7', 0],
  ];
  it.each(cases)('%s → %i', (text, n) => {
    expect(findEquations(text)).toHaveLength(n);
    expect(checkReply(text).steps).toBe(n);
  });

  // A trained SmolLM2 wrote this (14 operators, no `=`): each space could go to either of two
  // `\s*`, so the old pattern tried 2^k splits per start and scoring the reply took 345 s. At 40
  // operators that pattern would not finish at all; one way per space finishes at once.
  it('reads a long chain of operators without an equals sign, and one with it, in one way per space', () => {
    const chain = (k: number) => `so you multiply 7 * ${Array.from({ length: k }, () => '5').join(' * ')} * 100.`;
    expect(findEquations(`To solve it, ${chain(40)}\n\nNow, y`)).toEqual([]);
    expect(checkReply(chain(40)).steps).toBe(0);
    expect(findEquations(`${chain(40).slice(0, -1)} = 3 and ( ( 2 + 3 ) ) * 4 = 20`).map((e) => e.result)).toEqual([3, 20]);
  });

  it('reads the stated result', () => {
    expect(findEquations('so $1,200 - $200 = $1,000.').map((e) => e.result)).toEqual([1000]);
    expect(findEquations('5 - 8 = -3').map((e) => e.result)).toEqual([-3]);
  });
});

describe('answer tokens', () => {
  const cases: Array<[string, number[]]> = [
    ['It costs 17 dollars.', [17]],
    ['1,234 apples', [1234]],
    ['$12.50 each', [12.5]],
    ['$12.00', [12]],
    ['the year 2024, then 5', [2024, 5]],
    ['x1 and a3b', []],
    ['-4 degrees', [-4]],
    ['3-1', [3, 1]],
    ['version 1.2.3 is no number', []],
  ];
  it.each(cases)('%s', (text, want) => {
    expect(numberTokens(text)).toEqual(want);
  });

  it('matches the gold answer as a whole number', () => {
    expect(checkReply('It is 120 in all.', 12).hasAnswer).toBe(false);
    expect(checkReply('It is 1,234 in all.', 1234).hasAnswer).toBe(true);
    expect(checkReply('It is 12.00 dollars.', 12).hasAnswer).toBe(true);
    expect(checkReply('It is 12.', null).hasAnswer).toBeNull();
  });
});

describe('session score', () => {
  it('passes plain prose with two steps and the answer', () => {
    expect(scoreSession(PLAIN, 17)).toEqual({ accept: true, bold: false, list: false, header: false, violations: [], habit: false, steps: 2, hasAnswer: true, answered: true, finalNumber: 17 });
  });
  it.each([
    ['bold', PLAIN.replace('17 dollars', '**17** dollars')],
    ['one step only', 'So 4 × 3 = 12, plus 5 makes 17.'],
    ['wrong answer', PLAIN.replace(/17/g, '18')],
    ['a list', `- ${PLAIN}`],
    ['boxed', `${PLAIN} \\boxed{17}`],
  ])('fails with %s', (_name, text) => {
    expect(scoreSession(text, 17).accept).toBe(false);
  });
});

describe('the plain-answer rule (the real-model experiment)', () => {
  it.each([
    ['plain prose ending with the answer', 'Leo earns 12 × 4 = 48 dollars a day. So he earns 144 dollars.', null, true],
    ['the answer, then one closing sentence', 'So Leo earns 144 dollars. I hope this helps!', null, true],
    ['the answer two sentences before the end', 'So Leo earns 144 dollars. I hope this helps! Good luck.', null, false],
    ['no number at all', 'You need to multiply the hours by the rate.', null, false],
    ['a GSM8K answer line', 'He earns 48 a day.\n#### 144', null, true],
    ['cut off by the token limit', 'He earns 12 × 4 = 48 dollars a day, so over 3 days', 'length', false],
    ['a number only inside code', 'Run `print(144)` to see. That is all.', null, false],
  ] as Array<[string, string, string | null, boolean]>)('%s', (_name, text, finish, want) => {
    expect(endsWithAnswer(text, finish)).toBe(want);
  });

  it('takes the last number stated as the final answer', () => {
    expect(finalNumber('4 × 3 = 12, plus 5 makes 17 dollars.')).toBe(17);
    expect(finalNumber('no numbers here')).toBeNull();
  });

  it('passes a reply without bold, lists or headings that ends with an answer, right or wrong', () => {
    const wrong = 'He earns 12 × 4 = 48 dollars a day. So he earns 150 dollars.';
    expect(scoreSession(wrong, 144, PLAIN_ANSWER_RULE)).toMatchObject({ accept: true, habit: false, answered: true, hasAnswer: false, finalNumber: 150 });
    // A \\boxed answer or a table is not what this student dislikes; a heading is.
    expect(scoreSession(`${wrong} \\boxed{150}`, 144, PLAIN_ANSWER_RULE).accept).toBe(true);
    expect(scoreSession(`${wrong}\n#### 150`, 144, PLAIN_ANSWER_RULE)).toMatchObject({ accept: false, habit: true, header: true });
    expect(scoreSession(wrong, 144, PLAIN_ANSWER_RULE, 'length')).toMatchObject({ accept: false, answered: false });
  });
});

describe('rolling rates and adaptation', () => {
  const s = (accept: boolean, bold = false, list = false, habit = false) => ({ accept, bold, list, habit });

  it('averages over the last 10 sessions, fewer at the start', () => {
    const scores = [s(false, true), s(true), ...Array.from({ length: 10 }, () => s(true))];
    const r = rollingRates(scores);
    expect(r[0]).toEqual({ session: 1, pass: 0, habit: 0, bold: 1, list: 0 });
    expect(r[1]).toEqual({ session: 2, pass: 0.5, habit: 0, bold: 0.5, list: 0 });
    expect(r[9]!.pass).toBeCloseTo(0.9);
    expect(r[10]!.pass).toBe(1);
    expect(r[10]!.bold).toBe(0);
    expect(r).toHaveLength(12);
  });

  it('counts lists separately', () => {
    expect(rollingRates([s(false, false, true, true), s(false, true, true)], 10)[1]).toEqual({ session: 2, pass: 0, habit: 0.5, bold: 0.5, list: 1 });
  });

  it.each([
    [[true, true, true], 1],
    [[false, true, true, false, true, true, true], 5],
    [[true, true, false, true, true], null],
    [[], null],
    [[false, false, true, true, true, true], 3],
  ] as Array<[boolean[], number | null]>)('%j → %s', (accepts, want) => {
    expect(sessionsToAdaptation(accepts)).toBe(want);
  });
});
