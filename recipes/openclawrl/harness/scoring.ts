import { findEquations, numberTokens } from './arith.js';

/**
 * The student's preferences as rules, and the session metrics of the example.
 *
 * A reply "looks AI-written" when it has any of: bold (`**x**`, `__x__`), a markdown header (ATX
 * `# x` or a setext underline), a bullet or numbered list item, `\boxed`, a "final answer:" line, a
 * horizontal rule, or a table (a GFM delimiter row). Markup inside code (fenced blocks and inline
 * code spans) does not count. A *calculation step* is one worked equation: numbers joined by
 * arithmetic operators, `=`, and a result (`3 × 4 = 12`, `12 + 5 = 17`, `(48 + 12) ÷ 6 = 10`); a
 * chain `3 × 4 = 12 + 5 = 17` is two steps. `2*3` without `= result` is not a step. The answer is
 * present when some number token equals the gold answer (`1,234` reads as 1234, `$12.00` as 12).
 */

export type Violation = 'bold' | 'header' | 'list' | 'boxed' | 'final-answer' | 'rule' | 'table';

export interface ReplyCheck {
  violations: Violation[];
  bold: boolean;
  list: boolean;
  /** Worked equations shown. */
  steps: number;
  /** Whether the gold answer appears as a number (null when no gold answer was given). */
  hasAnswer: boolean | null;
}

export interface SessionScore {
  accept: boolean;
  bold: boolean;
  list: boolean;
  header: boolean;
  violations: Violation[];
  /** Whether the reply has any formatting the rule's student dislikes (`PassRule.dislikes`). */
  habit: boolean;
  steps: number;
  hasAnswer: boolean;
  /** Whether the reply ends with a final answer (`endsWithAnswer`) and was not cut off. */
  answered: boolean;
  /** The last number the reply states, or null: its final answer as exact match reads it. */
  finalNumber: number | null;
}

/**
 * What a passing first reply must be. The example's homework student (`HOMEWORK_RULE`) dislikes
 * every AI-looking feature, wants at least MIN_STEPS worked equations and the gold answer stated;
 * the real-model experiment's student (`PLAIN_ANSWER_RULE`) dislikes the formatting the paper's
 * student dislikes (bold, lists, headings) and wants the reply to end with a final answer, right or
 * wrong: a 135M model's arithmetic is seldom right, and its correctness is measured apart.
 */
export interface PassRule {
  readonly dislikes: readonly Violation[];
  readonly minSteps: number;
  /** `gold`: the gold answer appears as a number; `final`: the reply ends with a final answer. */
  readonly answer: 'gold' | 'final';
}

/** Minimum worked equations a passing reply shows. */
export const MIN_STEPS = 2;

export const ALL_VIOLATIONS: readonly Violation[] = ['bold', 'header', 'list', 'boxed', 'final-answer', 'rule', 'table'];
export const HOMEWORK_RULE: PassRule = { dislikes: ALL_VIOLATIONS, minSteps: MIN_STEPS, answer: 'gold' };
export const PLAIN_ANSWER_RULE: PassRule = { dislikes: ['bold', 'list', 'header'], minSteps: 0, answer: 'final' };

/** Blanks out fenced code blocks and inline code spans, keeping line structure. */
export function stripCode(text: string): string {
  const blank = (s: string) => s.replace(/[^\n]/g, ' ');
  return text
    .replace(/^[ \t]*(```|~~~)[^\n]*\n[\s\S]*?(?:^[ \t]*\1[^\n]*$|(?![\s\S]))/gm, blank)
    .replace(/(`+)(?!`)[\s\S]*?[^`]\1(?!`)/g, blank);
}

const BOLD_STAR = /\*\*(?=[^\s*])(?:(?!\n[ \t]*\n)[\s\S])*?[^\s*]\*\*|\*\*[^\s*]\*\*/;
const BOLD_UNDERSCORE = /(?<![\p{L}\p{N}_])__(?=[^\s_])(?:(?!\n[ \t]*\n)[\s\S])*?[^\s_]__(?![\p{L}\p{N}_])|(?<![\p{L}\p{N}_])__[^\s_]__(?![\p{L}\p{N}_])/u;
const ATX_HEADER = /^ {0,3}#{1,6}(?:[ \t]|$)/m;
const SETEXT = /^ {0,3}(?:=+|-+)[ \t]*$/;
const RULE = /^ {0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,})$/;
const BULLET = /^[ \t]*[-*+•][ \t]+\S/m;
const NUMBERED = /^[ \t]*\d{1,9}[.)][ \t]+\S/m;
const BOXED = /\\boxed\b/;
const FINAL_ANSWER = /\bfinal[ \t]+answer[ \t]*[*_]*[ \t]*[:：]/i;
const TABLE_DELIMITER = /^[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*$/;

function headerOrRule(lines: string[]): { header: boolean; rule: boolean } {
  let header = ATX_HEADER.test(lines.join('\n'));
  let rule = false;
  for (const [i, line] of lines.entries()) {
    const prev = i > 0 ? lines[i - 1]! : '';
    const prevIsText = prev.trim() !== '' && !RULE.test(prev) && !ATX_HEADER.test(prev);
    // A `---` or `===` line right under text underlines a header; `---` after a blank is a rule.
    if (SETEXT.test(line) && prevIsText) header = true;
    else if (RULE.test(line)) rule = true;
  }
  return { header, rule };
}

function hasTable(lines: string[]): boolean {
  return lines.some((line, i) => TABLE_DELIMITER.test(line) && line.includes('|') && i > 0 && lines[i - 1]!.includes('|'));
}

/** The AI-looking formatting of a reply (the violations of `checkReply`), without counting its steps. */
export function formattingOf(text: string): Violation[] {
  const prose = stripCode(text);
  const lines = prose.split('\n');
  const { header, rule } = headerOrRule(lines);
  const found: Record<Violation, boolean> = {
    bold: BOLD_STAR.test(prose) || BOLD_UNDERSCORE.test(prose),
    header,
    // A rule line (`* * *`) also matches the bullet pattern; it is reported as a rule only.
    list: lines.some((l) => (BULLET.test(l) && !RULE.test(l)) || NUMBERED.test(l)),
    boxed: BOXED.test(prose),
    'final-answer': FINAL_ANSWER.test(prose),
    rule,
    table: hasTable(lines),
  };
  return (Object.keys(found) as Violation[]).filter((k) => found[k]);
}

/** Checks one reply against the rules; `gold` null skips the answer check. */
export function checkReply(text: string, gold: number | null = null): ReplyCheck {
  const violations = formattingOf(text);
  return {
    violations,
    bold: violations.includes('bold'),
    list: violations.includes('list'),
    steps: findEquations(text).length,
    hasAnswer: gold === null ? null : numberTokens(text).some((n) => Math.abs(n - gold) < 1e-9),
  };
}

/**
 * The sentences of a reply's prose, in order: split after `.`, `!` or `?` followed by space, and
 * at line breaks, so that a `#### 12` line or a list item counts as one. Code is blanked first.
 */
function sentences(text: string): string[] {
  return stripCode(text)
    .split(/(?<=[.!?])\s+|\n+/)
    .map((s) => s.trim())
    .filter((s) => s !== '');
}

/**
 * Whether a reply ends with a final answer: one of its last two sentences states a number, and it
 * was not cut off by the token limit (`finishReason` 'length'). Two, not one: "So Leo earns 48
 * dollars. I hope this helps!" ends with its answer as a reader sees it.
 */
export function endsWithAnswer(text: string, finishReason: string | null = null): boolean {
  if (finishReason === 'length') return false;
  return sentences(text).slice(-2).some((s) => numberTokens(s).length > 0);
}

/** The last number a reply states (its final answer, as exact match reads it), or null. */
export function finalNumber(text: string): number | null {
  return numberTokens(stripCode(text)).at(-1) ?? null;
}

/** Scores a session by the agent's first solution reply, under `rule` (default: the homework student's). */
export function scoreSession(firstReply: string, gold: number, rule: PassRule = HOMEWORK_RULE, finishReason: string | null = null): SessionScore {
  const c = checkReply(firstReply, gold);
  const hasAnswer = c.hasAnswer === true;
  const habit = c.violations.some((v) => rule.dislikes.includes(v));
  const answered = endsWithAnswer(firstReply, finishReason);
  const answerOk = rule.answer === 'gold' ? hasAnswer : answered;
  return {
    accept: !habit && c.steps >= rule.minSteps && answerOk,
    bold: c.bold,
    list: c.list,
    header: c.violations.includes('header'),
    violations: c.violations,
    habit,
    steps: c.steps,
    hasAnswer,
    answered,
    finalNumber: finalNumber(firstReply),
  };
}

export interface RollingPoint {
  /** 1-based session index. */
  session: number;
  pass: number;
  /** Sessions whose first reply had formatting the student dislikes. */
  habit: number;
  bold: number;
  list: number;
}

/** Fractions over the last `window` sessions (fewer at the start), one point per session. */
export function rollingRates(scores: readonly Pick<SessionScore, 'accept' | 'bold' | 'list' | 'habit'>[], window = 10): RollingPoint[] {
  return scores.map((_, i) => {
    const w = scores.slice(Math.max(0, i - window + 1), i + 1);
    const rate = (f: (s: (typeof w)[number]) => boolean) => w.filter(f).length / w.length;
    return { session: i + 1, pass: rate((s) => s.accept), habit: rate((s) => s.habit), bold: rate((s) => s.bold), list: rate((s) => s.list) };
  });
}

/** The 1-based index of the first session that starts `run` passes in a row, or null. */
export function sessionsToAdaptation(accepts: readonly boolean[], run = 3): number | null {
  for (let i = 0; i + run <= accepts.length; i++) {
    if (accepts.slice(i, i + run).every(Boolean)) return i + 1;
  }
  return null;
}
