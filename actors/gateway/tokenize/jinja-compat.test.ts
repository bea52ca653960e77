import { Template } from '@huggingface/jinja';
import { describe, expect, it } from 'vitest';
import { freezeValue } from './jinja-compat.js';

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
 * trim, so `.strip('\n')` in the official Qwen3 template also removed spaces and tabs.
 */
describe('Python str methods in the interpreter', () => {
  it.each([
    ['strip with chars', "{{ r.strip('\\n') }}|{{ r.lstrip('\\n') }}|{{ r.rstrip('\\n') }}", { r: '\n r \n\n' }, ' r | r \n\n|\n r '],
    ["Python's whitespace by default (U+001C-U+001F and U+0085 are, U+FEFF is not)", '[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ s.strip(none) }}]', { s: '\u001c\u0085 x \u00a0\ufeff' }, '[x \u00a0\ufeff][x \u00a0\ufeff][\u001c\u0085 x \u00a0\ufeff][x \u00a0\ufeff]'],
    ['chars as a set of code points', "{{ 'xyhixy'.strip('yx') }}|{{ e.strip('😀') }}|{{ e.lstrip('a😀') }}|{{ 'abc'.strip('') }}", { e: '😀a😀' }, 'hi|a||abc'],
    ["split() at Python's whitespace", "{{ s.split() | join('|') }}/{{ s.split(none, 1) | join('|') }}", { s: ' a\u0085b\ufeffc\u001fd  ' }, 'a|b\ufeffc|d/a|b\ufeffc\u001fd  '],
    ['the trim filter', '[{{ s | trim }}]', { s: '\u0085\u001e x \ufeff' }, '[x \ufeff]'],
  ])('%s', (_what, source, ctx, python) => {
    const template = new Template(source);
    expect(template.render(ctx)).toBe(python);
  });

  it.each([
    ['a chars argument that is not a string', "{{ 'a'.strip(1) }}"],
    ['two arguments', "{{ 'a'.strip('a', 'b') }}"],
    ['a keyword argument', "{{ 'a'.rstrip(chars='a') }}"],
  ])('%s raises, as in Python', (_what, source) => {
    expect(() => new Template(source).render({})).toThrow();
  });
});
