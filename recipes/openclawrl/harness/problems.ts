import { readFileSync } from 'node:fs';
import { ReefError } from '../../../actors/runtime/errors.js';
import { equationHolds, findEquations, parseNumber } from './arith.js';

/**
 * Homework problems for the example: our own deterministic generator of grade-school word
 * problems (several families, integer answers, worked steps that are checked to compute), or a
 * GSM8K-format JSONL file.
 */

export interface Problem {
  id: string;
  family: string;
  question: string;
  answer: number;
  /** Worked steps; each generated step holds an equation that evaluates to its stated result. */
  solution_steps: string[];
}

export { prng } from '../../../actors/runtime/prng.js';
import { prng } from '../../../actors/runtime/prng.js';

type Rng = () => number;
const int = (rng: Rng, lo: number, hi: number): number => lo + Math.floor(rng() * (hi - lo + 1));
const pick = <T>(rng: Rng, xs: readonly T[]): T => xs[Math.floor(rng() * xs.length)]!;

const NAMES = ['Maya', 'Leo', 'Aisha', 'Tom', 'Priya', 'Jonas', 'Sofia', 'Kenji', 'Amara', 'Diego', 'Lena', 'Omar'];
const ITEMS = [['notebooks', 'notebook'], ['pencils', 'pencil'], ['apples', 'apple'], ['stickers', 'sticker'], ['comic books', 'comic book']] as const;

type Draft = Omit<Problem, 'id'>;

const FAMILIES: Record<string, (rng: Rng) => Draft> = {
  shopping(rng) {
    const name = pick(rng, NAMES);
    const [items] = pick(rng, ITEMS);
    const n = int(rng, 3, 9);
    const price = int(rng, 2, 12);
    const extra = int(rng, 3, 15);
    const cost = n * price;
    const total = cost + extra;
    const bill = (Math.floor(total / 10) + 1 + int(rng, 0, 2)) * 10;
    const change = bill - total;
    return {
      family: 'shopping',
      question: `${name} buys ${n} ${items} that cost $${price} each and a backpack for $${extra}. ${name} pays with $${bill}. How many dollars of change does ${name} get back?`,
      answer: change,
      solution_steps: [
        `The ${items} cost ${n} × ${price} = ${cost} dollars.`,
        `With the backpack the bill is ${cost} + ${extra} = ${total} dollars.`,
        `The change is ${bill} - ${total} = ${change} dollars.`,
      ],
    };
  },
  sharing(rng) {
    const name = pick(rng, NAMES);
    const groups = int(rng, 3, 8);
    const each = int(rng, 4, 15);
    // Choose the share first so the division comes out even, then split the total into trays.
    const total = groups * each;
    const trayCounts = [2, 3, 4, 5, 6].filter((d) => total % d === 0 && d !== groups);
    const trays = trayCounts.length > 0 ? pick(rng, trayCounts) : groups;
    const perTray = total / trays;
    return {
      family: 'sharing',
      question: `${name} baked ${trays} trays with ${perTray} cookies on each tray and shares all of them equally among ${groups} groups of friends. How many cookies does each group get?`,
      answer: each,
      solution_steps: [`${name} has ${trays} × ${perTray} = ${total} cookies.`, `Each group gets ${total} ÷ ${groups} = ${each} cookies.`],
    };
  },
  rates(rng) {
    const name = pick(rng, NAMES);
    const rate = int(rng, 8, 25);
    const hours = int(rng, 3, 8);
    const days = int(rng, 2, 6);
    const daily = rate * hours;
    const total = daily * days;
    return {
      family: 'rates',
      question: `${name} earns $${rate} per hour walking dogs and works ${hours} hours a day for ${days} days. How many dollars does ${name} earn in total?`,
      answer: total,
      solution_steps: [`Each day ${name} earns ${rate} × ${hours} = ${daily} dollars.`, `Over ${days} days that is ${daily} × ${days} = ${total} dollars.`],
    };
  },
  ages(rng) {
    const name = pick(rng, NAMES);
    const age = int(rng, 4, 12);
    const older = int(rng, 1, 6);
    const later = int(rng, 2, 9);
    const twice = 2 * age;
    const sister = twice + older;
    const future = sister + later;
    return {
      family: 'ages',
      question: `${name} is ${age} years old. ${name}'s cousin is ${older} years older than twice ${name}'s age. How old will the cousin be in ${later} years?`,
      answer: future,
      solution_steps: [`Twice ${name}'s age is 2 × ${age} = ${twice}.`, `The cousin is ${twice} + ${older} = ${sister} years old now.`, `In ${later} years the cousin will be ${sister} + ${later} = ${future}.`],
    };
  },
  distance(rng) {
    const name = pick(rng, NAMES);
    const v1 = int(rng, 4, 12) * 5;
    const h1 = int(rng, 2, 5);
    const v2 = int(rng, 4, 12) * 5;
    const h2 = int(rng, 1, 4);
    const d1 = v1 * h1;
    const d2 = v2 * h2;
    const d = d1 + d2;
    return {
      family: 'distance',
      question: `${name}'s family drives at ${v1} km per hour for ${h1} hours, then at ${v2} km per hour for ${h2} more hours. How many kilometres do they drive in all?`,
      answer: d,
      solution_steps: [`First part: ${v1} × ${h1} = ${d1} km.`, `Second part: ${v2} × ${h2} = ${d2} km.`, `Altogether ${d1} + ${d2} = ${d} km.`],
    };
  },
  percentages(rng) {
    const name = pick(rng, NAMES);
    const pct = pick(rng, [10, 20, 25, 30, 40, 50]);
    // A price that is a multiple of 20 makes every listed percentage an integer discount.
    const price = int(rng, 2, 12) * 20;
    const off = (price * pct) / 100;
    const sale = price - off;
    return {
      family: 'percentages',
      question: `A bike costs $${price}. In a sale it is ${pct}% off. How many dollars does ${name} pay for the bike in the sale?`,
      answer: sale,
      solution_steps: [`The discount is ${price} × ${pct} ÷ 100 = ${off} dollars.`, `${name} pays ${price} - ${off} = ${sale} dollars.`],
    };
  },
};

export const PROBLEM_FAMILIES: readonly string[] = Object.keys(FAMILIES);

/**
 * Checks that every step shows at least one equation, that each equation computes, and that the
 * last equation's result is the answer. Returns what is wrong (empty = verified).
 */
export function verifyProblem(p: Problem): string[] {
  const errors: string[] = [];
  if (!Number.isInteger(p.answer)) errors.push(`answer ${p.answer} is not an integer`);
  let last: number | null = null;
  for (const [i, step] of p.solution_steps.entries()) {
    const eqs = findEquations(step);
    if (eqs.length === 0) errors.push(`step ${i + 1} shows no equation: ${step}`);
    for (const eq of eqs) {
      if (!equationHolds(eq)) errors.push(`step ${i + 1}: ${eq.text} does not hold`);
      last = eq.result;
    }
  }
  if (last !== p.answer) errors.push(`last result ${last} is not the answer ${p.answer}`);
  return errors;
}

/**
 * `count` problems, families in rotation so every family appears, the same list for the same seed.
 * @default count 72, seed 20260310
 */
export function generateProblems(count = 72, seed = 20260310): Problem[] {
  const rng = prng(seed);
  const out: Problem[] = [];
  const seen = new Set<string>();
  for (let i = 0; i < count; i++) {
    const family = PROBLEM_FAMILIES[i % PROBLEM_FAMILIES.length]!;
    let draft = FAMILIES[family]!(rng);
    // Small number ranges repeat now and then; draw again so every session is a new problem.
    for (let tries = 0; seen.has(draft.question) && tries < 100; tries++) draft = FAMILIES[family]!(rng);
    seen.add(draft.question);
    const p: Problem = { id: `gen-${String(i + 1).padStart(3, '0')}`, ...draft };
    const errors = verifyProblem(p);
    if (errors.length > 0) throw new Error(`generator bug in ${p.id} (${family}): ${errors.join('; ')}`);
    out.push(p);
  }
  return out;
}

/** One GSM8K record: `answer` is the worked solution ending in `#### N`. */
export function parseGsm8kRecord(rec: unknown, id: string): Problem {
  const r = rec as { question?: unknown; answer?: unknown };
  if (typeof r?.question !== 'string' || typeof r.answer !== 'string') throw new Error('needs string fields question and answer');
  const at = r.answer.lastIndexOf('####');
  if (at < 0) throw new Error('answer has no "#### N" line');
  const final = r.answer.slice(at + 4).trim();
  if (!/^-?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.0+)?$/.test(final)) throw new Error(`final answer ${JSON.stringify(final)} is not an integer`);
  const steps = r.answer
    .slice(0, at)
    .split('\n')
    // GSM8K marks calculator calls as <<48/2=24>>; the prose around them already shows the step.
    .map((line) => line.replace(/<<[^>]*>>/g, '').trim())
    .filter((line) => line.length > 0);
  return { id, family: 'gsm8k', question: r.question.trim(), answer: parseNumber(final.replace(/^-/, '')) * (final.startsWith('-') ? -1 : 1), solution_steps: steps };
}

/** Loads a GSM8K-format JSONL file (one `{question, answer}` per line; blank lines skipped). */
export function loadGsm8k(path: string, limit: number | null = null): Problem[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `cannot read problems file ${path}: ${(err as Error).message}` });
  }
  const out: Problem[] = [];
  for (const [i, line] of text.split('\n').entries()) {
    if (line.trim() === '') continue;
    if (limit !== null && out.length >= limit) break;
    try {
      out.push(parseGsm8kRecord(JSON.parse(line), `gsm8k-${String(i + 1).padStart(4, '0')}`));
    } catch (err) {
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${path}:${i + 1}: ${(err as Error).message}` });
    }
  }
  if (out.length === 0) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `${path}: no problems` });
  return out;
}
