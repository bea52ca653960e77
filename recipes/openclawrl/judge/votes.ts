/**
 * Reading PRM outputs into a judgment (ARCHITECTURE §2 step 5). Pure: the PRM actor calls it with
 * the raw replies of its score and hint votes; tests drive it with tables.
 */

export type Vote = 1 | -1 | 0;
export type Decision = 'hint' | 'anchor' | 'dropped';

/** Hints of this many characters or fewer say too little to condition a teacher on. */
export const MIN_HINT_CHARS = 10;

// A hint runs from the LAST start marker before its end marker: a reply that names the markers
// in its reasoning ("I put the hint after [HINT_START]") must not pass that text on as the hint.
const HINT = /\[HINT_START\]((?:(?!\[HINT_START\])[\s\S])*?)\[HINT_END\]/g;
/** A verdict a model wrapped in formatting: `\text{-1}`, `\textbf{1}`, `\mathbf{0}`, `\mathrm{1}`. */
const WRAPPED = /^\\(?:text|textbf|mathbf|mathrm)\{([^{}]*)\}$/;

const THINK_OPEN = '<think>';
const THINK_CLOSE = '</think>';

/**
 * A PRM reply without its reasoning: a thinking model writes `<think>…</think>` before its answer,
 * and reasoning that weighs the verdicts ("\boxed{0} if I cannot tell") or drafts a hint is
 * neither the verdict nor the hint. A reply cut off inside its reasoning (at `prm_max_tokens`)
 * has no answer.
 */
export function answerOf(text: string): string {
  const close = text.lastIndexOf(THINK_CLOSE);
  const answer = close < 0 ? text : text.slice(close + THINK_CLOSE.length);
  const open = answer.indexOf(THINK_OPEN);
  return open < 0 ? answer : answer.slice(0, open);
}

/**
 * The contents of each complete `\boxed{…}`, braces balanced: a box holding braces of its own
 * (`\boxed{\text{-1}}`) is still a box, so an earlier one never stands in for it as the last.
 */
function boxes(text: string): string[] {
  const out: string[] = [];
  const open = '\\boxed{';
  for (let i = text.indexOf(open); i >= 0; i = text.indexOf(open, i + 1)) {
    let depth = 1;
    let j = i + open.length;
    for (; j < text.length && depth > 0; j++) {
      if (text[j] === '{') depth++;
      else if (text[j] === '}') depth--;
    }
    if (depth === 0) out.push(text.slice(i + open.length, j - 1));
  }
  return out;
}

/**
 * The verdict of one PRM reply: the LAST `\boxed{…}` counts (a model that reconsiders ends with
 * its final answer), and only 1, -1 and 0 are valid; anything else, or no box, is null.
 * A typographic minus or dash (−, –, ‐) is read as a minus, `+1` as 1, and a verdict wrapped in
 * `\text{}` and the like as the verdict. Boxes in the reply's reasoning do not count (`answerOf`).
 */
export function parseVote(text: string | null): Vote | null {
  if (text === null) return null;
  const last = boxes(answerOf(text)).at(-1);
  if (last === undefined) return null;
  const trimmed = last.trim();
  const v = (WRAPPED.exec(trimmed)?.[1] ?? trimmed).trim().replace(/^[\u2010-\u2015\u2212\ufe63\uff0d]/, '-').replace(/^\+(?=1$)/, '');
  if (v === '1') return 1;
  if (v === '-1') return -1;
  if (v === '0') return 0;
  return null;
}

/** The most frequent valid vote; a tie between the top votes, or no valid vote, gives 0. */
export function majority(votes: readonly (Vote | null)[]): Vote {
  const counts = new Map<Vote, number>();
  for (const v of votes) if (v !== null) counts.set(v, (counts.get(v) ?? 0) + 1);
  let best: Vote = 0;
  let bestCount = 0;
  let tied = false;
  for (const [v, n] of counts) {
    if (n > bestCount) {
      best = v;
      bestCount = n;
      tied = false;
    } else if (n === bestCount) {
      tied = true;
    }
  }
  return bestCount === 0 || tied ? 0 : best;
}

/** The text of the last complete `[HINT_START]…[HINT_END]` pair after the reasoning, trimmed; null when there is none. */
export function parseHint(text: string | null): string | null {
  if (text === null) return null;
  let last: string | null = null;
  for (const m of answerOf(text).matchAll(HINT)) last = m[1]!;
  return last === null ? null : last.trim();
}

/**
 * Teacher hints from the hint votes: only votes that accept (`\boxed{1}`), only hints longer than
 * MIN_HINT_CHARS, duplicates (same text up to whitespace) once, shortest first, at most `max`.
 */
export function selectHints(outputs: readonly (string | null)[], max: number): string[] {
  const seen = new Set<string>();
  const hints: string[] = [];
  for (const text of outputs) {
    if (parseVote(text) !== 1) continue;
    const hint = parseHint(text);
    if (hint === null || hint.length <= MIN_HINT_CHARS) continue;
    const key = hint.replace(/\s+/g, ' ');
    if (seen.has(key)) continue;
    seen.add(key);
    hints.push(hint);
  }
  // Array.prototype.sort is stable: equal lengths keep the order the votes came in.
  return hints.sort((a, b) => a.length - b.length).slice(0, max);
}

export interface Outcome {
  decision: Decision;
  /** The majority score; what the RL term uses as the turn's advantage. */
  reward: number;
  /** A hint to append to the last user message, or null for the plain prompt. */
  teacherCandidates: (string | null)[];
}

/**
 * The decision table: accepted hints → reward = score, the hints are the teachers; no hint but a
 * score of ±1 → reward = score, the plain prompt is the only teacher (anchor); neither → dropped.
 */
export function decide(score: Vote, hints: readonly string[]): Outcome {
  if (hints.length > 0) return { decision: 'hint', reward: score, teacherCandidates: [...hints] };
  if (score !== 0) return { decision: 'anchor', reward: score, teacherCandidates: [null] };
  return { decision: 'dropped', reward: 0, teacherCandidates: [] };
}

/** One PRM call as the actor saw it: the reply text, or the error that stood in for it. */
export interface CallResult {
  output: string | null;
  error: string | null;
}

export interface VoteSet {
  votes: (Vote | null)[];
  outputs: (string | null)[];
  errors: (string | null)[];
}

export interface Verdict extends Outcome {
  score: VoteSet & { result: Vote };
  hint: VoteSet & { hints: string[] };
  /** Calls that returned a reply / that failed or timed out. */
  votesOk: number;
  votesFailed: number;
  /** Replies without a valid `\boxed{}`. */
  votesInvalid: number;
}

const voteSet = (calls: readonly CallResult[]): VoteSet => ({
  votes: calls.map((c) => parseVote(c.output)),
  outputs: calls.map((c) => c.output),
  errors: calls.map((c) => c.error),
});

/** Everything the judgment records about a turn, from its score and hint calls. */
export function verdict(scoreCalls: readonly CallResult[], hintCalls: readonly CallResult[], maxHints: number): Verdict {
  const score = voteSet(scoreCalls);
  const hint = voteSet(hintCalls);
  const result = majority(score.votes);
  const hints = selectHints(hint.outputs, maxHints);
  const all = [...scoreCalls, ...hintCalls];
  const ok = all.filter((c) => c.error === null);
  return {
    score: { ...score, result },
    hint: { ...hint, hints },
    ...decide(result, hints),
    votesOk: ok.length,
    votesFailed: all.length - ok.length,
    votesInvalid: ok.filter((c) => parseVote(c.output) === null).length,
  };
}
