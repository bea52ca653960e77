import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { beforeAll, describe, expect, it } from 'vitest';
import { pythonBin, pythonEnv, smolModelDir, tinyModelDir } from '../../cluster/paths.js';
import { freezeValue } from '../../actors/gateway/tokenize/jinja-compat.js';
import { normalizeMessages, templateViewOf, type TemplateMessage } from '../../actors/gateway/tokenize/normalize.js';
import { INTERPRETER_PYTHON_RENDERED, PYTHON_RENDERED } from '../../actors/gateway/tokenize/python-rendered.fixtures.js';
import { compileTemplate, Unsupported } from '../../actors/gateway/tokenize/template-compiler.js';
import { CORPUS, PY_STR_TEMPLATE, TWELVE_TOOLS } from './corpus.js';
import { pick, seeded, type Rand } from '../helpers/seeded.js';

/*
 * Differential test against transformers' own renderer: generated conversations go through the
 * compiled template, the interpreter (patched by jinja-compat.ts) and Python's jinja2 as
 * apply_chat_template sets it up. Wherever Python renders, the compiled renderer renders the same
 * text or declines (Unsupported), and the interpreter renders the same text or fails. The other
 * tests compare the two JS renderers with each other; this one holds both to Python.
 */

/** transformers' render: null keys dropped, reasoning aliased, its sandboxed environment. */
const RENDER_PY = `
import json, sys
from transformers.utils.chat_template_utils import _compile_jinja_template, _normalize_chat_messages, render_jinja_template
req = json.load(sys.stdin)
out = {'fixtures': [], 'cases': []}
for source, ctx in req['fixtures']:
    out['fixtures'].append(_compile_jinja_template(source).render(**ctx))
for c in req['cases']:
    try:
        r, _ = render_jinja_template([_normalize_chat_messages(c['messages'])], tools=c['tools'], chat_template=req['templates'][c['template']], add_generation_prompt=c['agp'], **c['extra'])
        out['cases'].append(r[0])
    except Exception as e:
        out['cases'].append({'error': f'{type(e).__name__}: {e}'})
json.dump(out, sys.stdout, ensure_ascii=False)
`;

/**
 * Constructs chat templates use where jinja2 and JS differ: == on messages (Mistral's last user
 * turn), scalars printed with `string` (Qwen3-Coder's tool-call arguments), `trim` of a content that
 * may be missing (Llama 3), `~` with undefined and none, output before break/continue, for-else.
 */
const CONSTRUCTS_TEMPLATE = `
{%- set users = messages | selectattr('role', 'equalto', 'user') | list -%}
{%- for m in messages -%}
  {{- '<|im_start|>' ~ m.role ~ (' [last user]' if users and m == users[-1] else '') ~ (' [seen]' if m in messages[:loop.index0] else '') ~ '\\n' -}}
  {{- m['content'] | trim -}}
  {%- if m.tool_calls is defined -%}
    {%- for call in m.tool_calls -%}
      {{- '\\n<call ' ~ call.function.name ~ '>' -}}
      {%- if call.function.arguments is mapping -%}
        {%- for k, v in call.function.arguments | items -%}
          {{- '<' ~ k ~ '>' ~ (v | tojson if v is mapping or (v is sequence and v is not string) else v | string) ~ '</' ~ k ~ '>' -}}
          {%- if loop.index == 2 -%}{{- '...' -}}{%- break -%}{%- endif -%}
        {%- else -%}
          {{- '(no arguments)' -}}
        {%- endfor -%}
      {%- else -%}
        {{- call.function.arguments -}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- for part in [m.reasoning_content, m.name, none] -%}
    {%- if part is none -%}{{- ' |' -}}{%- continue -%}{%- endif -%}
    {{- ' ' ~ part -}}
  {%- endfor -%}
  {{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}`;

/** SmolLM2-135M-Instruct's, where scripts/setup.sh has built it (its suite says so when skipped). */
const SMOL_TEMPLATE = join(smolModelDir(), 'chat_template.jinja');

const TEMPLATES: Record<string, string> = {
  tiny: readFileSync(join(tinyModelDir(), 'chat_template.jinja'), 'utf8'),
  py_str: PY_STR_TEMPLATE,
  constructs: CONSTRUCTS_TEMPLATE,
  ...(existsSync(SMOL_TEMPLATE) ? { smollm2: readFileSync(SMOL_TEMPLATE, 'utf8') } : {}),
};


const TEXTS = ['', ' ', 'Hello!', 'go on', 'naïve café — 東京 ǅ', '😀a astral a😀', '  padded  ', 'line\nbreaks\n', '<think>\nplan\n</think>\n\nanswer', '\u001c\u0085 ws \u3000', 'True', 'None'];
const VALUES: unknown[] = [true, false, null, 0, 3, -1, 0.5, 1e-5, 1e16, 2.5e-8, 'text', '', [1, 'a', true], { k: null }, {}];

function args(r: Rand): Record<string, unknown> | string {
  const out: Record<string, unknown> = {};
  for (let i = Math.floor(r() * 4); i > 0; i--) out[pick(r, ['city', 'flag', 'n', 'x', 'opts'])] = pick(r, VALUES);
  return r() < 0.25 ? JSON.stringify(out) : out;
}

function conversation(r: Rand): Record<string, unknown>[] {
  const msgs: Record<string, unknown>[] = [];
  if (r() < 0.5) msgs.push({ role: 'system', content: pick(r, TEXTS) });
  for (let t = 1 + Math.floor(r() * 3); t > 0; t--) {
    // Repeated user turns: == compares messages by value in jinja2.
    msgs.push({ role: 'user', content: r() < 0.3 ? 'go on' : pick(r, TEXTS) });
    const a: Record<string, unknown> = { role: 'assistant', content: r() < 0.2 ? null : pick(r, TEXTS) };
    if (r() < 0.3) a.reasoning_content = pick(r, TEXTS);
    if (r() < 0.4) {
      a.tool_calls = [{ id: 'call_0001', type: 'function', function: { name: pick(r, ['get_weather', 'calculator']), arguments: args(r) } }];
      msgs.push(a, { role: 'tool', tool_call_id: 'call_0001', content: pick(r, TEXTS) });
    } else msgs.push(a);
  }
  return msgs;
}

interface Case { template: string; messages: TemplateMessage[]; tools: unknown[] | null; agp: boolean; extra: Record<string, unknown> }

function cases(): Case[] {
  const r = seeded(20261130);
  const out: Case[] = [];
  for (const template of Object.keys(TEMPLATES)) {
    const raw = [...CORPUS.map((c) => ({ messages: c.messages, tools: c.tools })), ...Array.from({ length: 120 }, () => ({ messages: conversation(r), tools: r() < 0.3 ? TWELVE_TOOLS.slice(0, 2) : null }))];
    for (const c of raw) out.push({ template, messages: normalizeMessages(c.messages), tools: c.tools, agp: r() < 0.8, extra: { bos_token: '<s>', eos_token: '</s>' } });
  }
  return out;
}

describe('chat templates render what transformers renders', () => {
  const all = cases();
  let py: { fixtures: string[]; cases: (string | { error: string })[] };

  beforeAll(() => {
    const input = JSON.stringify({ templates: TEMPLATES, fixtures: [...PYTHON_RENDERED, ...INTERPRETER_PYTHON_RENDERED].map(([, source, ctx]) => [source, ctx]), cases: all });
    const proc = spawnSync(pythonBin(), ['-c', RENDER_PY], { input, env: pythonEnv(), encoding: 'utf8', maxBuffer: 64 << 20, timeout: 120_000 });
    if (proc.status !== 0) throw new Error(`python failed (${proc.status}): ${proc.stderr}`);
    py = JSON.parse(proc.stdout) as typeof py;
  });

  it('the Python-rendered fixtures are what jinja2 renders', () => {
    expect(py.fixtures).toEqual([...PYTHON_RENDERED, ...INTERPRETER_PYTHON_RENDERED].map(([, , , python]) => python));
  });

  if (TEMPLATES.smollm2 === undefined) it.skip(`smollm2 (skipped: ${SMOL_TEMPLATE} is absent; scripts/setup.sh builds it)`, () => {});

  it.each(Object.keys(TEMPLATES))('%s: compiled and interpreted renders equal Python\'s', (name) => {
    const compiled = compileTemplate(TEMPLATES[name]!);
    if (compiled.template === null) throw new Error(compiled.reason);
    const interpreter = new Template(TEMPLATES[name]!);
    const problems: string[] = [];
    let rendered = 0;
    all.forEach((c, i) => {
      if (c.template !== name) return;
      const expected = py.cases[i]!;
      if (typeof expected !== 'string') return;
      const tools = c.tools === null ? null : freezeValue(c.tools);
      const base = { messages: c.messages.map(templateViewOf), documents: null, add_generation_prompt: c.agp, ...c.extra };
      try {
        const text = compiled.template!.render({ ...base, tools: tools === null ? null : tools.plain });
        rendered++;
        if (text !== expected) problems.push(`case ${i} compiled: ${JSON.stringify(text)} python: ${JSON.stringify(expected)}`);
      } catch (err) {
        if (!(err instanceof Unsupported)) throw err;
      }
      let text: string | null = null;
      try {
        text = interpreter.render({ ...base, tools });
      } catch {
        // A failure is no wrong text; the gateway answers with an error.
      }
      if (text !== null && text !== expected) problems.push(`case ${i} interpreted: ${JSON.stringify(text)} python: ${JSON.stringify(expected)}`);
    });
    expect(problems.slice(0, 3)).toEqual([]);
    // Most of them render compiled: the comparison is not vacuous.
    expect(rendered).toBeGreaterThan(60);
  });
});
