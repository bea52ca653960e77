import { describe, expect, it } from 'vitest';
import type { JudgedPoint } from '../store/types.js';
import { curves, HABIT_CHARS, HabitCache, habitsOf } from './judged.js';

const point = (offset: number, reward: number, reply: string | null, decision: JudgedPoint['decision'] = 'hint'): JudgedPoint => ({ offset, createdAt: 1000 + offset, decision, reward, reply });

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

  it('HabitCache reads each offset once and keeps at most `max` of them', () => {
    const cache = new HabitCache(2);
    expect(cache.of(1, '**a**')).toEqual(['bold']);
    // The offset's first answer stands: a turn's reply never changes.
    expect(cache.of(1, 'plain')).toEqual(['bold']);
    cache.of(2, 'plain');
    cache.of(3, '- x');
    expect(cache.size).toBe(2);
    expect(cache.of(1, 'plain')).toEqual([]);
  });
});

describe('curves', () => {
  it('rolls the reward over trained turns only and the habit over turns with a reply, each over the last `window` points', () => {
    const points = [point(1, -1, '**a**'), point(2, 0, 'b', 'dropped'), point(3, -1, '**c**'), point(4, 1, 'd'), point(5, 1, null, 'anchor')];
    const c = curves(points, 2);
    expect(c.reward.map((p) => [p.offset, p.value, p.rolling])).toEqual([[1, -1, -1], [3, -1, -1], [4, 1, 0], [5, 1, 1]]);
    expect(c.habit.map((p) => [p.offset, p.value, p.rolling])).toEqual([[1, 1, 1], [2, 0, 0.5], [3, 1, 0.5], [4, 0, 0.5]]);
    expect(c.reward[0]!.at).toBe(1001);
    expect(curves([], 10)).toEqual({ reward: [], habit: [] });
  });
});
