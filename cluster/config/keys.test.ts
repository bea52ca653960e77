import { describe, expect, it } from 'vitest';
import type { ConfigIssue } from './errors.js';
import { closest, editDistance, foldKeys, renderPath } from './keys.js';
import { applyOverrides, parseOverrides, parseOverrideValue } from './overrides.js';

describe('key helpers', () => {
  it.each([
    ['prm_url', 'prm_urll', 1],
    ['prm_url', 'rpm_url', 1],
    ['batch_size', 'batchsize', 1],
    ['gpus', 'cpus_per_bundle', 12],
    ['', 'abc', 3],
  ])('editDistance(%s, %s) = %i', (a, b, d) => expect(editDistance(a, b)).toBe(d));

  it('closest stays within distance 2', () => {
    expect(closest('prm_urll', ['prm_url', 'prm_m'])).toBe('prm_url');
    expect(closest('colour', ['host', 'port'])).toBeNull();
  });

  it('renders paths with list indices', () => {
    expect(renderPath(['reef', 'api_keys', 0, 'key'])).toBe('reef.api_keys[0].key');
  });

  it('folds hyphens in nested mappings and lists, keeps values', () => {
    const issues: ConfigIssue[] = [];
    expect(foldKeys({ 'a-b': [{ 'c-d': 'x-y' }], e: ['--f-g'] }, [], issues)).toEqual({ a_b: [{ c_d: 'x-y' }], e: ['--f-g'] });
    expect(issues).toEqual([]);
  });

  it('keeps __proto__ as an ordinary key instead of a prototype', () => {
    const out = foldKeys(JSON.parse('{"__proto__": {"polluted": true}}'), [], []) as Record<string, unknown>;
    expect(Object.keys(out)).toEqual(['__proto__']);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});

describe('parseOverrides', () => {
  it.each([
    [['serve.yaml', '--reef.port=1'], ['--reef.port=1'], ['serve.yaml']],
    [['--reef.port', '9', 'serve.yaml'], ['--reef.port=9'], ['serve.yaml']],
    [['-c', 'x.yaml', '--detach', '--a-b.c-d=[1, 2]'], ['--a-b.c-d=[1, 2]'], ['-c', 'x.yaml', '--detach']],
    [['--reef.api_keys[0].key=k'], ['--reef.api_keys[0].key=k'], []],
    [['--reef.port'], ['--reef.port'], []],
  ])('%j', (argv, overrides, rest) => {
    expect(parseOverrides(argv)).toEqual({ overrides, rest });
  });
});

describe('override values', () => {
  it.each([
    ['3', 3],
    ['1e-5', 1e-5],
    ['true', true],
    ['null', null],
    ['', ''],
    ['[a, 2]', ['a', 2]],
    ['http://h:1/x', 'http://h:1/x'],
    ['"quoted: yes"', 'quoted: yes'],
    ['[unclosed', '[unclosed'],
    // YAML reads these as a comment or a document marker: null, or the text cut short.
    ['#a1b2c3', '#a1b2c3'],
    ['abc #1', 'abc #1'],
    ['[a, b] # two', '[a, b] # two'],
    ['---', '---'],
    ['...', '...'],
    ['sk-abc#1', 'sk-abc#1'],
    ['"x #y"', 'x #y'],
    ['[a, "#b"]', ['a', '#b']],
    ['[a, b #c\n]', '[a, b #c\n]'],
  ])('%s', (text, want) => expect(parseOverrideValue(text)).toEqual(want));

  it('applies into lists and reports impossible paths', () => {
    const tree: Record<string, unknown> = { a: [{ b: 1 }], s: 'x' };
    expect(applyOverrides(tree, ['--a.0.b=2', '--a[1].b=3'])).toEqual([{ path: 'a[1]', message: 'no such list item (the list has 1)' }]);
    expect(tree.a).toEqual([{ b: 2 }]);
    expect(applyOverrides(tree, ['--s.t=1', '--a.b=1', '--x.__proto__.y=1'])).toEqual([
      { path: 's', message: 'is "x", not a mapping, so --s.t cannot be set' },
      { path: 'a.b', message: 'expected a list index' },
      { path: 'x.__proto__.y', message: 'unknown key' },
    ]);
  });
});
