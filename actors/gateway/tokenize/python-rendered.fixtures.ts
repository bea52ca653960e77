/**
 * Templates with what transformers' jinja2 renders for them (printed by it): Python's str.strip,
 * lstrip, rstrip and split with their whitespace and chars argument, the trim filter, and tojson's
 * float format. The interpreter patch (jinja-compat.ts) and the compiled renderer are both held to
 * these.
 */
export const PYTHON_RENDERED: [what: string, source: string, ctx: Record<string, unknown>, python: string][] = [
  ['strip, lstrip and rstrip with chars', "{{ r.strip('\\n') }}|{{ r.lstrip('\\n') }}|{{ r.rstrip('\\n') }}", { r: '\n r \n\n' }, ' r | r \n\n|\n r '],
  ["Python's whitespace by default", '[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ s.strip(none) }}]', { s: '\u001c\u0085 x \u00a0\ufeff' }, '[x \u00a0\ufeff][x \u00a0\ufeff][\u001c\u0085 x \u00a0\ufeff][x \u00a0\ufeff]'],
  ['chars as a set of code points', "{{ 'xyhixy'.strip('yx') }}|{{ e.strip('😀') }}|{{ e.lstrip('a😀') }}|{{ 'abc'.strip('') }}", { e: '😀a😀' }, 'hi|a||abc'],
  ["split() at Python's whitespace", "{{ s.split() | join('|') }}/{{ s.split(none, 1) | join('|') }}", { s: ' a\u0085b\ufeffc\u001fd  ' }, 'a|b\ufeffc|d/a|b\ufeffc\u001fd  '],
  ['the trim filter', '[{{ s | trim }}]', { s: '\u0085\u001e x \ufeff' }, '[x \ufeff]'],
  ['tojson floats as json.dumps', "{{ x | tojson }}|{{ x | tojson(indent=1) }}|{{ {'k': x[0]} | tojson(separators=(',', ':')) }}", { x: [1e-5, 1e-7, 0.5, 1.5e-10, 123.25, -2.5e-5, 0.0001, 3] },
    '[1e-05, 1e-07, 0.5, 1.5e-10, 123.25, -2.5e-05, 0.0001, 3]|[\n 1e-05,\n 1e-07,\n 0.5,\n 1.5e-10,\n 123.25,\n -2.5e-05,\n 0.0001,\n 3\n]|{"k":1e-05}'],
  ['== and in compare lists and mappings by value, with Python\'s rules for the rest',
    "{% for x in [a == b, a != b, a in [b], [a] == [b], a == a, (1, 2) == [1, 2], (1, 2) == (1, 2), '1' == 1, 1 == true, 0 == '', none == u, u == v, {'k': 1} == {'k': true}, [1] in [[1]], a in [1, 'x'], 'x' in [a, 'x']] %}{{ 'T' if x else 'F' }}{% endfor %}",
    { a: { x: [1, { y: 'z' }], n: null }, b: { n: null, x: [1, { y: 'z' }] } }, 'TFTTTFTFTFFTTTFT'],
  ['the last user turn found by ==, as Mistral templates do (equal turns are all found)',
    "{% set users = messages | selectattr('role', 'equalto', 'user') | list %}{% for m in messages %}{% if m == users[-1] %}[LAST]{% endif %}{{ m.content }};{% endfor %}",
    { messages: [{ role: 'user', content: 'go on' }, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'go on' }] }, '[LAST]go on;ok;[LAST]go on;'],
  ['an undefined value is the empty string to ~ and trim (Llama 3 trims a content it may not have)',
    "[{{ u | trim }}][{{ 'a' ~ u }}][{{ u ~ 'b' }}][{{ u ~ u }}]{% for m in messages %}<{{ m['content'] | trim }}>{% endfor %}",
    { messages: [{ role: 'assistant' }, { role: 'user', content: ' hi ' }] }, '[][a][b][]<><hi>'],
  ['what an iteration printed before break or continue is kept; else runs when no iteration finished, outside the loop scope',
    "{% for m in ms %}y{% if m[0] == 1 %}X{% break %}{% endif %}z{% else %}E{% endfor %}|{% for m in ms %}{% for c in m %}{{ c }}{% if c == 2 %}!{% break %}{% endif %}-{% endfor %};{% endfor %}|{% set x = 'out' %}{% for x in [1, 2] %}a{% if x == 2 %}b{% continue %}{% endif %}c{% continue %}{% else %}[{{ x }}]{% endfor %}|{% for m in ms %}a{% set s %}q{% break %}{% endset %}{% filter upper %}q{% break %}{% endfilter %}b{% endfor %}[{{ s }}]",
    { ms: [[1, 2, 3], [2]] }, 'yXE|1-2!;2!;|acab[out]|a[]'],
  ['booleans, none and floats print as Python\'s str() writes them ({{ }}, ~, string), as Qwen3-Coder prints tool-call arguments',
    "{% for k, v in args | items %}<{{ k }}>{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}</{{ k }}>{% endfor %}|{{ args.flag }} {{ args.none }} {{ args.tiny }} {{ args.big }} {{ none }}|{{ 'a' ~ args.off ~ none ~ args.x ~ args.n }}",
    { args: { flag: true, off: false, none: null, n: 3, x: 0.5, tiny: 1e-5, big: 1e16, list: [1, 'a', true], obj: { k: true } } },
    '<flag>True</flag><off>False</off><none>None</none><n>3</n><x>0.5</x><tiny>1e-05</tiny><big>10000000000000000</big><list>[1, "a", true]</list><obj>{"k": true}</obj>|True None 1e-05 10000000000000000 None|aFalseNone0.53'],
  ['a subscript Python cannot look up is undefined (Hermes looks up a type map with a list of types)',
    "{% set m = {'string': 'str', 'number': 'float'} %}{% for s in specs %}[{{ m[s.type] if m[s.type] is defined else ('union' if s.type is iterable else 'any') }}]{% endfor %}|{{ [1, 2][k] }}{{ 'ab'[k] }}{{ m[0] is defined }}{{ m[none] is defined }}{{ xs[true] }}{{ xs['x'] is defined }}{{ none[0] is defined }}",
    { specs: [{ type: 'string' }, { type: ['string', 'null'] }, {}, { type: { a: 1 } }], k: [0], xs: [5, 6] }, '[str][union][union][union]|FalseFalse6FalseFalse'],
  ['mappings and undefined are iterable and sequences in jinja2',
    "{% for v in [s, l, d, u, n, 3, t] %}{{ 'I' if v is iterable else 'i' }}{{ 'S' if v is sequence else 's' }}{% endfor %}",
    { s: 'x', l: [1], d: { a: 1 }, n: null, t: true }, 'ISISISISisisis'],
];
