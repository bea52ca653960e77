import { describe, expect, it } from 'vitest';
import type { Violation } from '../../../recipes/openclawrl/harness/scoring.js';
import type { JudgedPoint } from '../store/types.js';
import { curves, HABIT_CHARS, HabitCache, habitsOf } from './judged.js';

const point = (offset: number, reward: number, decision: JudgedPoint['decision'] = 'hint'): JudgedPoint => ({ offset, createdAt: 1000 + offset, decision, reward });

describe('habitsOf', () => {
  it('finds the formatting the paper\'s student dislikes, as the recipe scores it, and nothing in code or plain prose', () => {
    expect(habitsOf('**Answer:** 4\n- two\n- two')).toEqual(['bold', 'list']);
    expect(habitsOf('## Steps\nTwo and two are four.')).toEqual(['header']);
    // Other AI-looking features (\boxed, a final-answer line) are not what this student minds.
    expect(habitsOf('The final answer: \\boxed{4}')).toEqual([]);
    expect(habitsOf('Use `**x**` in markdown for bold.')).toEqual([]);
    expect(habitsOf(null)).toEqual([]);
  });

  it('reads only the first HABIT_CHARS of a reply (a reply built to make the patterns slow is cut there)', () => {
    expect(habitsOf(`${'x'.repeat(HABIT_CHARS - 12)} **bold**`)).toEqual(['bold']);
    expect(habitsOf(`${'x'.repeat(HABIT_CHARS)} **late bold**`)).toEqual([]);
  });

  it('HabitCache checks each offset once, remembers a turn without reply text, and keeps at most `max` offsets', () => {
    const cache = new HabitCache(2);
    expect(cache.get(1)).toBeUndefined();
    expect(cache.put(1, '**a**')).toEqual(['bold']);
    // The offset's first answer stands: a turn's reply never changes.
    expect(cache.put(1, 'plain')).toEqual(['bold']);
    expect(cache.put(2, null)).toBeNull();
    expect(cache.get(2)).toBeNull();
    cache.put(3, '- x');
    expect(cache.size).toBe(2);
    expect(cache.get(1)).toBeUndefined();
  });
});

describe('curves', () => {
  it('rolls the reward over trained turns only and the habit over turns with reply text, each over the last `window` points', () => {
    const points = [point(1, -1), point(2, 0, 'dropped'), point(3, -1), point(4, 1), point(5, 1, 'anchor')];
    const habits = new Map<number, Violation[] | null>([[1, ['bold']], [2, []], [3, ['list']], [4, []], [5, null]]);
    const c = curves(points, 2, (o) => habits.get(o) ?? null);
    expect(c.reward.map((p) => [p.offset, p.value, p.rolling])).toEqual([[1, -1, -1], [3, -1, -1], [4, 1, 0], [5, 1, 1]]);
    expect(c.habit.map((p) => [p.offset, p.value, p.rolling])).toEqual([[1, 1, 1], [2, 0, 0.5], [3, 1, 0.5], [4, 0, 0.5]]);
    expect(c.reward[0]!.at).toBe(1001);
    expect(curves([], 10, () => null)).toEqual({ reward: [], habit: [] });
  });
});
