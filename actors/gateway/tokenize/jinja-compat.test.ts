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
