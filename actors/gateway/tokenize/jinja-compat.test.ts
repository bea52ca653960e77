import { Template } from '@huggingface/jinja';
import { describe, expect, it } from 'vitest';
import { freezeValue } from './jinja-compat.js';
import { INTERPRETER_PYTHON_RENDERED, PYTHON_RENDERED } from './python-rendered.fixtures.js';

describe('frozen template values', () => {
  const tools = [{ name: 'a', n: 1.5, nested: { list: [1, 'two', null] } }];

  it.each([
    ['plain tojson', '{% for t in tools %}{{ t | tojson }}{% endfor %}'],
    ['tojson with literal arguments', '{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}'],
    ['tojson with a variable argument', '{% set w = 4 %}{% for t in tools %}{{ t | tojson(indent=w) }}{% endfor %}'],
    ['attribute access and loops', '{% for t in tools %}{{ t.name }}:{% for x in t.nested.list %}{{ x }},{% endfor %}{% endfor %}'],
  ])('%s renders the same as the plain value, every time', (_name, source) => {
    const template = new Template(source);
    const plain = template.render({ tools });
    const frozen = freezeValue(tools);
    expect(template.render({ tools: frozen })).toBe(plain);
    expect(template.render({ tools: frozen })).toBe(plain);
  });

  it('one frozen value serves templates that print it differently', () => {
    const frozen = freezeValue(tools);
    const compact = new Template('{{ tools | tojson }}').render({ tools: frozen });
    const indented = new Template('{{ tools | tojson(indent=2) }}').render({ tools: frozen });
    expect(indented).not.toBe(compact);
    expect(indented).toBe(new Template('{{ tools | tojson(indent=2) }}').render({ tools }));
  });
});

/*
 * What transformers' jinja2 renders (expected values printed by it): the interpreter used JS's
 * trim and number formatting, so `.strip('\n')` in the official Qwen3 template also removed spaces
 * and tabs, and `tojson` wrote `1e-7` for `1e-07`.
 */
describe('Python str methods and json floats in the interpreter', () => {
  it.each([
    ...PYTHON_RENDERED,
    ...INTERPRETER_PYTHON_RENDERED,
    ['tojson of an integral float', '{{ (3 / 2 * 2) | tojson }}', {}, '3.0'],
    // The compiled renderer refuses unique (compile time); jinja2's ignores case and takes 1, 1.0 and true for one value.
    ['unique', "{{ ['A', 'a', 'b', 'B', 1, 1.5, true, none, none] | unique | join(',') }}", {}, 'A,b,1,1.5,None'],
  ])('%s', (_what, source, ctx, python) => {
    const template = new Template(source);
    expect(template.render(ctx)).toBe(python);
  });

  it('a frozen value prints its floats the same way', () => {
    const tools = [{ minimum: 1e-5, step: 2.5e-7 }];
    expect(new Template('{{ tools | tojson }}').render({ tools: freezeValue(tools) })).toBe('[{"minimum": 1e-05, "step": 2.5e-07}]');
  });

  it.each([
    ['a chars argument that is not a string', "{{ 'a'.strip(1) }}"],
    ['two arguments', "{{ 'a'.strip('a', 'b') }}"],
    ['a keyword argument', "{{ 'a'.rstrip(chars='a') }}"],
    ['round with an unknown method', "{{ 1.5 | round(0, 'up') }}"],
    ['round of a string', "{{ '1.5' | round }}"],
    ['round of an undefined value', '{{ u | round }}'],
    ['round to a float precision', '{{ 1.5 | round(1.0) }}'],
    ['sum of a string item', "{{ [1, 'a'] | sum }}"],
    ['sum of a missing attribute', "{{ [{'n': 1}, {}] | sum(attribute='n') }}"],
    ['sum of an int', '{{ 3 | sum }}'],
    ['max of a string and a number', "{{ [1, 'a'] | max }}"],
    ['min with none', '{{ [none, 1] | min }}'],
    ['max of a missing attribute', "{{ [{'n': 1}, {}] | max(attribute='n') }}"],
    ['loop.cycle with no items', '{% for x in [1] %}{{ loop.cycle() }}{% endfor %}'],
    ['loop.cycle with a keyword argument', '{% for x in [1] %}{{ loop.cycle(a=1) }}{% endfor %}'],
  ])('%s raises, as in Python', (_what, source) => {
    expect(() => new Template(source).render({})).toThrow();
  });
});
