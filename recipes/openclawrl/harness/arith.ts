/**
 * Arithmetic as it appears in homework prose: numbers such as `1,234`, `$12.50` or `20%`, and
 * worked equations such as `3 × 4 = 12` or `(48 + 12) ÷ 6 = 10`. Shared by the problem generator
 * (which checks that its own steps compute) and the scoring rules (which count shown steps).
 */

const NUM = String.raw`\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?`;
const OP = String.raw`[-+−–×xX*·/÷]`;

/**
 * One worked equation: a number, then one or more (operator, number) pairs, `=`, and a result.
 * Parentheses may wrap parts. The left edge must not be glued to a word or a longer number.
 * Each run of spaces has exactly one way to match (spaces go before a parenthesis, or after the
 * last): written as `\s*\)*\s*`, the two `\s*` could share every space, so a chain without `=`
 * was retried 2^k ways for k operators. A trained SmolLM2 wrote `7 * 5 * 5 * … * 100.` (14
 * operators), and scoring that one reply blocked the experiment's process for 345 s: its
 * supervisor missed every heartbeat and the arm's stack drained mid-evaluation.
 */
const EQUATION = new RegExp(
  String.raw`(?<![\w.,$])(?:\(\s*)*${NUM}(?:(?:\s*\))*\s*${OP}\s*(?:\(\s*)*${NUM})+(?:\s*\))*\s*=\s*(-?${NUM})`,
  'g',
);

/** A number token: not part of a word or a longer number. */
const NUMBER = /(?<![\w.,$])-?\$?((?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(?![\d]|,\d{3}|\.\d)/g;

export interface Equation {
  /** The equation as written, e.g. `3 × 4 = 12`. */
  text: string;
  /** The part left of `=`. */
  expression: string;
  /** The stated result. */
  result: number;
  index: number;
}

/** Parses `1,234`, `$12.50`, `20%` (as 20) into a number. */
export function parseNumber(token: string): number {
  return Number(token.replace(/[$,%]/g, ''));
}

/**
 * Every worked equation in `text`, left to right. A chain `3 × 4 = 12 + 5 = 17` gives two: the
 * result of one may start the next.
 */
export function findEquations(text: string): Equation[] {
  const out: Equation[] = [];
  EQUATION.lastIndex = 0;
  for (let m = EQUATION.exec(text); m !== null; m = EQUATION.exec(text)) {
    const full = m[0];
    const eq = full.lastIndexOf('=');
    const start = m.index + (full.length - full.trimStart().length);
    out.push({ text: full.trim(), expression: full.slice(0, eq).trim(), result: parseNumber(m[1]!), index: start });
    // Resume at the result so that it can be the first operand of a chained equation.
    const resultAt = m.index + full.length - m[1]!.length;
    EQUATION.lastIndex = resultAt > m.index ? resultAt : m.index + 1;
  }
  return out;
}

/** Every number token in `text` as a value (`1,234` → 1234, `$5` → 5). */
export function numberTokens(text: string): number[] {
  const out: number[] = [];
  NUMBER.lastIndex = 0;
  for (let m = NUMBER.exec(text); m !== null; m = NUMBER.exec(text)) {
    const negative = m[0].startsWith('-');
    out.push((negative ? -1 : 1) * parseNumber(m[1]!));
  }
  return out;
}

type Token = { kind: 'num'; value: number } | { kind: 'op'; op: string } | { kind: 'paren'; open: boolean };

function tokenize(expr: string): Token[] {
  const tokens: Token[] = [];
  const re = new RegExp(String.raw`\s*(?:(${NUM})|(${OP})|([()]))`, 'y');
  let pos = 0;
  while (pos < expr.length) {
    if (/^\s*$/.test(expr.slice(pos))) break;
    re.lastIndex = pos;
    const m = re.exec(expr);
    if (m === null) throw new Error(`cannot read arithmetic at ${JSON.stringify(expr.slice(pos))}`);
    if (m[1] !== undefined) tokens.push({ kind: 'num', value: m[1].endsWith('%') ? parseNumber(m[1]) / 100 : parseNumber(m[1]) });
    else if (m[2] !== undefined) tokens.push({ kind: 'op', op: m[2] });
    else tokens.push({ kind: 'paren', open: m[3] === '(' });
    pos = re.lastIndex;
  }
  return tokens;
}

const PLUS = new Set(['+']);
const MINUS = new Set(['-', '−', '–']);
const TIMES = new Set(['×', 'x', 'X', '*', '·']);
const DIVIDE = new Set(['/', '÷']);

/** Evaluates an expression left of `=` with the usual precedence; throws on anything malformed. */
export function evaluate(expr: string): number {
  const tokens = tokenize(expr);
  let i = 0;
  const peekOp = (set: Set<string>): string | null => {
    const t = tokens[i];
    return t?.kind === 'op' && set.has(t.op) ? t.op : null;
  };
  const primary = (): number => {
    const t = tokens[i++];
    if (t?.kind === 'num') return t.value;
    if (t?.kind === 'paren' && t.open) {
      const v = sum();
      const close = tokens[i++];
      if (close?.kind !== 'paren' || close.open) throw new Error(`unbalanced parentheses in ${JSON.stringify(expr)}`);
      return v;
    }
    throw new Error(`expected a number in ${JSON.stringify(expr)}`);
  };
  const product = (): number => {
    let v = primary();
    for (;;) {
      if (peekOp(TIMES)) (i++, (v *= primary()));
      else if (peekOp(DIVIDE)) (i++, (v /= primary()));
      else return v;
    }
  };
  const sum = (): number => {
    let v = product();
    for (;;) {
      if (peekOp(PLUS)) (i++, (v += product()));
      else if (peekOp(MINUS)) (i++, (v -= product()));
      else return v;
    }
  };
  const v = sum();
  if (i !== tokens.length) throw new Error(`unexpected ${JSON.stringify(expr)} after position ${i}`);
  return v;
}

/** Whether an equation's stated result is what its expression computes. */
export function equationHolds(eq: Equation): boolean {
  return Math.abs(evaluate(eq.expression) - eq.result) < 1e-9;
}
