import { copyFileSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Template } from '@huggingface/jinja';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { repoRoot, tinyModelDir } from '../../../cluster/paths.js';
import { CORPUS, TWELVE_TOOLS } from '../../../test/parity/corpus.js';
import { ChatTokenizer, type ChatTokenizerOptions } from './chat-tokenizer.js';
import { freezeValue } from './jinja-compat.js';
import { normalizeMessages, templateView, type TemplateMessage } from './normalize.js';
import { CompiledTemplate, compileTemplate, Unsupported } from './template-compiler.js';
import { INTERPRETER_PYTHON_RENDERED, PYTHON_RENDERED } from './python-rendered.fixtures.js';
import { pick, seeded, type Rand } from '../../../test/helpers/seeded.js';

/*
 * Differential tests: every render of the compiled template is compared with @huggingface/jinja's
 * interpreter (patched by jinja-compat.ts, as in production) on the same context. The compiled
 * renderer may decline (Unsupported), never differ.
 */

/** One object reachable twice: the interpreter converts it twice, so two distinct values there. */
const SHARED = { k: 1 };

const TINY_TEMPLATE = readFileSync(join(repoRoot(), 'python_shim/reef_shim/tiny_chat_template.jinja'), 'utf8');

// ---------------------------------------------------------------------------------------------
// Seeded conversations

const chance = (r: Rand, p: number): boolean => r() < p;
const upTo = (r: Rand, n: number): number => Math.floor(r() * (n + 1));

const TEXTS = [
  '', ' ', '\n', 'Hello there!', 'What is 2+2?', 'The answer is 4.', 'naïve café — 東京 · مرحبا · Ünïcödé ß ǅ',
  '👩‍💻 family 👨‍👩‍👧 flags 🇫🇷🇯🇵 astral 𝔘𝔫𝔦', '  padded both ends  ', 'line one\nline two\n\nline four\n', 'crlf\r\nline\r\n',
  '<think>\nreasoning goes here\n</think>\n\nThe final answer.', '\n<think>plan</think>answer', '<tool_response>\n{"ok": true}\n</tool_response>',
  'ends with </think>', 'UPPER lower Title mIxEd', 'quotes "double" and \'single\' and back\\slash', 'tab\tseparated\tvalues',
  'a', 'apple banana cherry', '\ud83d lone surrogate', 'e'.repeat(40), '{"json": [1, 2.5, null], "k": {"n": -3}}', 'mixed. sentences. here.',
  'x\u0000y\u007f\u0085z', '<|im_end|> looks like a control token', '<｜tool▁calls▁begin｜>', '   \t  ', 'a,b,,c', 'ends with a dot.',
  '\u001c\u0085 Python-only whitespace \u3000\ufeff', '\ufeff\u001f', '😀a astral edges a😀', '\n\t reasoning with a tab \n',
];
const TOOL_NAMES = ['get_weather', 'search_web', 'calculator', 'write_file', 'read_file', 'x', 'ünïcode_tool'];
const KEYS = ['city', 'units', 'q', 'n', 'nested', 'list', 'flag', 'über', '10', '2', 'empty'];
const NUMBERS = [0, 1, -1, 42, 0.5, -2.25, 1e-7, 3.14159, 1e21, 2 ** 53, -0, 1.5e300, 7, 1e-5, -2.5e-5, 0.0001];

function randomJson(r: Rand, depth = 0): unknown {
  switch (upTo(r, depth > 2 ? 4 : 7)) {
    case 0: return pick(r, NUMBERS);
    case 1: return chance(r, 0.5);
    case 2: return null;
    case 3:
    case 4: return pick(r, TEXTS);
    case 5: return Array.from({ length: upTo(r, 3) }, () => randomJson(r, depth + 1));
    default: {
      const out: Record<string, unknown> = {};
      for (let i = upTo(r, 4); i > 0; i--) out[pick(r, KEYS)] = randomJson(r, depth + 1);
      return out;
    }
  }
}

function randomText(r: Rand): string {
  return chance(r, 0.75) ? pick(r, TEXTS) : pick(r, TEXTS) + pick(r, TEXTS);
}

/** Content as clients send it: a string mostly, sometimes text parts (joined by normalizeMessages), empty or null. */
function randomContent(r: Rand): unknown {
  const k = r();
  if (k < 0.78) return randomText(r);
  if (k < 0.9) return Array.from({ length: upTo(r, 3) }, () => ({ type: 'text', text: randomText(r) }));
  if (k < 0.95) return null;
  return '';
}

function randomToolCall(r: Rand): Record<string, unknown> {
  const args = chance(r, 0.5) ? JSON.stringify(randomJson(r, 1)) : randomJson(r, 1);
  const fn = { name: pick(r, TOOL_NAMES), arguments: args };
  const id = chance(r, 0.7) ? pick(r, ['abcdefghi', 'call_0001', '123456789']) : pick(r, ['c', 'call_123456789', '']);
  if (chance(r, 0.1)) return fn; // some clients send calls without the `function` wrapper
  return { id, type: 'function', function: fn };
}

/** A chat in request shape (before normalisation); `strict`: user/assistant alternate, no tools or system. */
function randomConversation(r: Rand, strict: boolean): Record<string, unknown>[] {
  const msgs: Record<string, unknown>[] = [];
  if (!strict && chance(r, 0.6)) msgs.push({ role: chance(r, 0.9) ? 'system' : 'developer', content: randomContent(r) });
  const turns = upTo(r, strict ? 4 : 6);
  for (let t = 0; t < turns; t++) {
    msgs.push({ role: 'user', content: strict ? randomText(r) : randomContent(r) });
    if (strict) {
      if (t < turns - 1 || chance(r, 0.3)) msgs.push({ role: 'assistant', content: randomText(r) });
      continue;
    }
    if (!chance(r, 0.85)) continue;
    const assistant: Record<string, unknown> = { role: 'assistant', content: chance(r, 0.6) ? randomContent(r) : null };
    if (chance(r, 0.3)) assistant[pick(r, ['reasoning_content', 'reasoning_content', 'reasoning', 'thinking'])] = randomText(r);
    if (chance(r, 0.4)) {
      const calls = Array.from({ length: 1 + upTo(r, 2) }, () => randomToolCall(r));
      assistant.tool_calls = calls;
      msgs.push(assistant);
      for (const c of calls) msgs.push({ role: 'tool', tool_call_id: (c.id as string | undefined) ?? 'x', content: chance(r, 0.8) ? randomText(r) : JSON.stringify(randomJson(r, 1)) });
      if (chance(r, 0.7)) msgs.push({ role: 'assistant', content: randomText(r) });
    } else msgs.push(assistant);
  }
  if (!strict && chance(r, 0.05)) msgs.push({ role: pick(r, ['ipython', 'function', 'narrator']), content: randomText(r) });
  return msgs;
}

function toolDef(name: string, r: Rand): Record<string, unknown> {
  return { type: 'function', function: { name, description: randomText(r), parameters: { type: 'object', properties: { a: { type: 'string', description: randomText(r) }, b: { type: 'number', minimum: 0.5 } }, required: ['a'] } } };
}

interface Case {
  /** The interpreter's context (tools possibly pre-converted, as ChatTokenizer does). */
  interp: Record<string, unknown>;
  /** The compiled renderer's context: the same values, plain. */
  compiled: Record<string, unknown>;
}

/**
 * Contexts shaped like ChatTokenizer's (messages through templateView, special tokens, extras),
 * with some raw variants: null keys kept, content-part lists not joined, a shared object.
 */
function randomCases(seed: number, count: number, opts: { strict?: number } = {}): Case[] {
  const r = seeded(seed);
  const out: Case[] = [];
  for (let i = 0; i < count; i++) {
    const raw = randomConversation(r, chance(r, opts.strict ?? 0));
    let messages: unknown[];
    const shape = r();
    if (shape < 0.6) {
      try {
        messages = templateView(normalizeMessages(raw));
      } catch {
        messages = templateView(raw as TemplateMessage[]);
      }
    } else if (shape < 0.85) messages = templateView(raw as TemplateMessage[]);
    else messages = raw;
    if (chance(r, 0.03) && messages.length > 1) messages.push(messages[0]); // one object twice in the context
    const toolKind = r();
    const tools: unknown[] | null = toolKind < 0.35 ? TWELVE_TOOLS.slice(0, 1 + upTo(r, 11)) : toolKind < 0.55 ? Array.from({ length: 1 + upTo(r, 3) }, (_, k) => toolDef(TOOL_NAMES[k]!, r)) : toolKind < 0.8 ? null : [];
    const base: Record<string, unknown> = { messages, documents: null, add_generation_prompt: chance(r, 0.7), bos_token: '<s>', eos_token: '</s>' };
    if (chance(r, 0.3)) base.enable_thinking = chance(r, 0.5);
    if (chance(r, 0.1)) base.extra_note = randomText(r);
    if (chance(r, 0.04)) base.builtin_tools = ['code_interpreter', 'brave_search'];
    if (chance(r, 0.05)) base.date_string = '01 Jan 2025';
    if (chance(r, 0.05)) base.tools_in_user_message = false;
    if (tools !== null && chance(r, 0.5)) {
      const frozen = freezeValue(tools);
      out.push({ interp: { ...base, tools: frozen }, compiled: { ...base, tools: frozen.plain } });
    } else out.push({ interp: { ...base, tools }, compiled: { ...base, tools } });
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The differential harness

interface Outcome { compiled: number; fallbacks: number; interpreterErrors: number; reasons: Record<string, number> }

function firstDifference(a: string, b: string): number {
  let i = 0;
  while (i < a.length && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
}

function differential(source: string, cases: readonly Case[]): Outcome {
  const result = compileTemplate(source);
  if (result.template === null) throw new Error(`did not compile: ${result.reason}`);
  const interpreter = new Template(source);
  const outcome: Outcome = { compiled: 0, fallbacks: 0, interpreterErrors: 0, reasons: {} };
  const problems: string[] = [];
  cases.forEach((c, i) => {
    let expected: string | Error;
    try {
      expected = interpreter.render(c.interp);
    } catch (err) {
      expected = err as Error;
    }
    let actual: string;
    try {
      actual = result.template.render(c.compiled);
    } catch (err) {
      if (!(err instanceof Unsupported)) {
        problems.push(`case ${i}: the compiled renderer threw ${String(err)}`);
        return;
      }
      outcome.fallbacks++;
      outcome.reasons[err.reason] = (outcome.reasons[err.reason] ?? 0) + 1;
      if (typeof expected !== 'string') outcome.interpreterErrors++;
      return;
    }
    if (typeof expected !== 'string') problems.push(`case ${i}: compiled rendered, the interpreter raised ${expected.message}`);
    else if (actual !== expected) {
      const at = firstDifference(actual, expected);
      problems.push(`case ${i}: differs at ${at}: compiled ${JSON.stringify(actual.slice(Math.max(0, at - 40), at + 40))} interpreter ${JSON.stringify(expected.slice(Math.max(0, at - 40), at + 40))}`);
    } else outcome.compiled++;
  });
  expect(problems.slice(0, 5)).toEqual([]);
  return outcome;
}

// ---------------------------------------------------------------------------------------------
// Test templates, written for this suite after the constructs of real chat-template families.

const TEMPLATES: Record<string, { source: string; strict?: number; minCompiled: number }> = {
  /** ChatML with thinking: tools block, reverse scan with a namespace, think-tag splitting, tool grouping. */
  chatml_reasoning: {
    minCompiled: 0.6,
    source: `
{%- set has_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
  {{- '<|im_start|>system\\n' -}}
  {%- if has_system -%}{{- messages[0].content ~ '\\n\\n' -}}{%- endif -%}
  {{- '# Tools\\n\\nCall these functions when useful. Signatures:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nAnswer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>\\n' -}}
{%- elif has_system -%}
  {{- '<|im_start|>system\\n' ~ messages[0].content ~ '<|im_end|>\\n' -}}
{%- endif -%}
{%- set scan = namespace(searching=true, last_user=messages | length - 1) -%}
{%- for m in messages[::-1] -%}
  {%- set at = messages | length - 1 - loop.index0 -%}
  {%- if scan.searching and m.role == 'user' and m.content is string -%}
    {%- if not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
      {%- set scan.searching = false -%}
      {%- set scan.last_user = at -%}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- set text = m.content if m.content is string else '' -%}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + m.role + '\\n' + text + '<|im_end|>\\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set thought = '' -%}
    {%- if m.reasoning_content is string -%}
      {%- set thought = m.reasoning_content -%}
    {%- elif '</think>' in text -%}
      {%- set thought = text.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}
      {%- set text = text.split('</think>')[-1].lstrip('\\n') -%}
    {%- endif -%}
    {%- if loop.index0 > scan.last_user and (loop.last or thought) -%}
      {{- '<|im_start|>assistant\\n<think>\\n' + thought.strip('\\n') + '\\n</think>\\n\\n' + text.lstrip('\\n') -}}
    {%- else -%}
      {{- '<|im_start|>assistant\\n' + text -}}
    {%- endif -%}
    {%- if m.tool_calls -%}
      {%- for call in m.tool_calls -%}
        {%- if (loop.first and text) or not loop.first -%}{{- '\\n' -}}{%- endif -%}
        {%- set fn = call.function if call.function is defined else call -%}
        {{- '<tool_call>\\n{"name": "' -}}{{- fn.name -}}{{- '", "arguments": ' -}}
        {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
        {{- '}\\n</tool_call>' -}}
      {%- endfor -%}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}`,
  },

  /** Header-id turns: reassigned context variables, date from strftime_now, tools in the first user turn, one call per turn. */
  header_turns: {
    minCompiled: 0.4,
    strict: 0.6,
    source: `
{{- bos_token -}}
{%- if custom_tools is defined -%}{%- set tools = custom_tools -%}{%- endif -%}
{%- if tools_in_user_message is not defined -%}{%- set tools_in_user_message = true -%}{%- endif -%}
{%- if date_string is not defined -%}
  {%- if strftime_now is defined -%}{%- set date_string = strftime_now('%d %b %Y') -%}{%- else -%}{%- set date_string = '26 Jul 2024' -%}{%- endif -%}
{%- endif -%}
{%- if messages[0] is defined and messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] | trim -%}
  {%- set messages = messages[1:] -%}
{%- else -%}
  {%- set system_text = '' -%}
{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}
{%- if builtin_tools is defined or tools is not none -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}
{%- if builtin_tools is defined -%}{{- 'Tools: ' + builtin_tools | reject('equalto', 'code_interpreter') | join(', ') + '\\n\\n' -}}{%- endif -%}
{{- 'Knowledge cutoff: 2023-12\\nToday: ' + date_string + '\\n\\n' -}}
{%- if tools is not none and not tools_in_user_message -%}
  {{- 'You may call these functions; answer with JSON {"name": ..., "parameters": ...}.\\n\\n' -}}
  {%- for t in tools -%}{{- t | tojson(indent=4) -}}{{- '\\n\\n' -}}{%- endfor -%}
{%- endif -%}
{{- system_text + '<|eot_id|>' -}}
{%- if tools_in_user_message and tools is not none -%}
  {%- if messages | length != 0 -%}
    {%- set first_user = messages[0]['content'] | trim -%}
    {%- set messages = messages[1:] -%}
  {%- else -%}
    {{- raise_exception('There is no user turn to carry the tools.') -}}
  {%- endif -%}
  {{- '<|start_header_id|>user<|end_header_id|>\\n\\nFunctions you can call:\\n\\n' -}}
  {%- for t in tools -%}{{- t | tojson(indent=4) -}}{{- '\\n\\n' -}}{%- endfor -%}
  {{- first_user + '<|eot_id|>' -}}
{%- endif -%}
{%- for message in messages -%}
  {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) -%}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' -}}
  {%- elif 'tool_calls' in message -%}
    {%- if not message.tool_calls | length == 1 -%}{{- raise_exception('One tool call per assistant turn, please.') -}}{%- endif -%}
    {%- set call = message.tool_calls[0].function -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}<|eot_id|>' -}}
  {%- else -%}
    {{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' -}}
    {%- if message.content is mapping or message.content is iterable -%}{{- message.content | tojson -}}{%- else -%}{{- message.content -}}{%- endif -%}
    {{- '<|eot_id|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}`,
  },

  /** [INST] turns: identity of the last user message, tool listing from items(), 9-character call ids, a block set, role checks. */
  inst_turns: {
    minCompiled: 0.4,
    strict: 0.6,
    source: `
{%- if messages | length > 0 and messages[0]['role'] == 'system' -%}
  {%- set sys_text = messages[0]['content'] -%}
  {%- set convo = messages[1:] -%}
{%- else -%}
  {%- set convo = messages -%}
{%- endif -%}
{%- set users = convo | selectattr('role', 'equalto', 'user') | list -%}
{%- set ns = namespace(last='') -%}
{{- bos_token -}}
{%- for message in convo -%}
  {%- if message.role == 'user' -%}
    {%- if ns.last == 'user' -%}{{- raise_exception('Two user turns in a row') -}}{%- endif -%}
    {%- if tools and message == users[-1] -%}
      {{- '[AVAILABLE_TOOLS] [' -}}
      {%- for tool in tools -%}
        {{- '{"type": "function", "function": {' -}}
        {%- for key, val in tool.function | items -%}
          {%- if key == 'return' -%}{%- continue -%}{%- endif -%}
          {{- '"' ~ key ~ '": ' ~ (val | tojson) -}}{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
        {%- endfor -%}
        {{- '}}' -}}{{- ', ' if not loop.last else '' -}}
      {%- endfor -%}
      {{- '][/AVAILABLE_TOOLS]' -}}
    {%- endif -%}
    {%- if message == users[-1] and sys_text is defined -%}
      {{- '[INST] ' + sys_text + '\\n\\n' + message.content + '[/INST]' -}}
    {%- else -%}
      {{- '[INST] ' + message.content + '[/INST]' -}}
    {%- endif -%}
  {%- elif message.role == 'assistant' and message.tool_calls is defined and message.tool_calls is not none -%}
    {{- '[TOOL_CALLS] [' -}}
    {%- for call in message.tool_calls -%}
      {%- if call.id is not defined or call.id | length != 9 -%}{{- raise_exception('Tool call ids must be 9 characters') -}}{%- endif -%}
      {%- set args = call.function.arguments -%}
      {{- '{"name": "' + call.function.name + '", "arguments": ' + (args if args is string else args | tojson) + ', "id": "' + call.id + '"}' -}}
      {{- ', ' if not loop.last -}}
    {%- endfor -%}
    {{- ']' + eos_token -}}
  {%- elif message.role == 'assistant' -%}
    {{- ' ' + message.content | trim + eos_token -}}
  {%- elif message.role == 'tool' -%}
    {%- set result %}{"content": {{ message.content | tojson }}, "call_id": "{{ message.tool_call_id }}"}{% endset -%}
    {{- '[TOOL_RESULTS] ' + result + '[/TOOL_RESULTS]' -}}
  {%- else -%}
    {{- raise_exception('Only user, assistant and tool roles here, with an optional system message first') -}}
  {%- endif -%}
  {%- set ns.last = message.role -%}
{%- endfor -%}`,
  },

  /** Turn markers with the system text folded into the first user turn, strict alternation, content parts. */
  folded_system: {
    minCompiled: 0.3,
    strict: 0.6,
    source: `
{{- bos_token -}}
{%- if messages and messages[0].role == 'system' -%}
  {%- if messages[0].content is string -%}{%- set prefix = messages[0].content + '\\n\\n' -%}
  {%- else -%}{%- set prefix = (messages[0].content | map(attribute='text') | join('')) + '\\n\\n' -%}{%- endif -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set prefix = '' -%}{%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
  {%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}
    {{- raise_exception('roles must alternate user/assistant') -}}
  {%- endif -%}
  {%- set who = 'model' if m.role == 'assistant' else m.role -%}
  {{- '<start_of_turn>' ~ who ~ '\\n' ~ (prefix if loop.first else '') -}}
  {%- if m.content is string -%}
    {{- m.content | trim -}}
  {%- elif m.content is iterable -%}
    {%- for part in m.content -%}
      {%- if part.type == 'image' -%}{{- '<start_of_image>' -}}
      {%- elif part.type == 'text' -%}{{- part.text | trim -}}
      {%- endif -%}
    {%- endfor -%}
  {%- else -%}
    {{- raise_exception('Invalid content type') -}}
  {%- endif -%}
  {{- '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}`,
  },

  /** Full-width marker tokens: namespace flags across a loop, tool output grouping, think-tag stripping. */
  marker_tokens: {
    minCompiled: 0.5,
    source: `
{%- if not add_generation_prompt is defined -%}{%- set add_generation_prompt = false -%}{%- endif -%}
{%- set ns = namespace(sys='', first=true, in_tool=false) -%}
{%- for m in messages -%}
  {%- if m['role'] == 'system' -%}
    {%- if ns.first -%}{%- set ns.sys = m['content'] -%}{%- set ns.first = false -%}
    {%- else -%}{%- set ns.sys = ns.sys + '\\n\\n' + m['content'] -%}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
{{- bos_token + ns.sys -}}
{%- for m in messages -%}
  {%- if m['role'] == 'user' -%}
    {%- set ns.in_tool = false -%}
    {{- '<｜User｜>' + m['content'] -}}
  {%- endif -%}
  {%- if m['role'] == 'assistant' and 'tool_calls' in m -%}
    {%- set ns.in_tool = false -%}
    {%- for tc in m['tool_calls'] -%}
      {%- set args = tc['function']['arguments'] if tc['function']['arguments'] is string else tc['function']['arguments'] | tojson -%}
      {%- if loop.first -%}
        {{- '<｜Assistant｜>' + (m['content'] if m['content'] is string else '') + '<｜tool▁calls▁begin｜>' -}}
      {%- else -%}
        {{- '\\n' -}}
      {%- endif -%}
      {{- '<｜tool▁call▁begin｜>' + tc['type'] + '<｜tool▁sep｜>' + tc['function']['name'] + '\\n\`\`\`json\\n' + args + '\\n\`\`\`<｜tool▁call▁end｜>' -}}
    {%- endfor -%}
    {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' -}}
  {%- endif -%}
  {%- if m['role'] == 'assistant' and 'tool_calls' not in m -%}
    {%- if ns.in_tool -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- set ns.in_tool = false -%}{%- endif -%}
    {%- set c = m['content'] if m['content'] is defined else '' -%}
    {%- if '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}
    {{- '<｜Assistant｜>' + c + '<｜end▁of▁sentence｜>' -}}
  {%- endif -%}
  {%- if m['role'] == 'tool' -%}
    {%- if not ns.in_tool -%}{{- '<｜tool▁outputs▁begin｜>' -}}{%- set ns.in_tool = true -%}{%- else -%}{{- '\\n' -}}{%- endif -%}
    {{- '<｜tool▁output▁begin｜>' + m['content'] + '<｜tool▁output▁end｜>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if ns.in_tool -%}{{- '<｜tool▁outputs▁end｜>' -}}{%- endif -%}
{%- if add_generation_prompt -%}{{- '<｜Assistant｜><think>\\n' -}}{%- endif -%}`,
  },

  /** Tag-per-role without whitespace control: lstrip_blocks/trim_blocks and plain newlines decide the output. */
  plain_tags: {
    minCompiled: 0.6,
    source: `{% for message in messages %}
{% if message['role'] == 'system' and message['content'] %}
<|system|>
{{ message['content'] }}<|end|>
{% elif message['role'] == 'user' %}
<|user|>
{{ message['content'] }}<|end|>
{% elif message['role'] == 'assistant' %}
<|assistant|>
{{ message['content'] or '' }}<|end|>
    {% endif %}
{% if loop.last and add_generation_prompt %}
<|assistant|>
{% endif %}
{% endfor %}
{% if messages | length == 0 %}{{ eos_token }}{% endif %}
  {# a comment #}   trailing text {{ 'and' }} {{- ' tight' -}}   end
`,
  },

  /** Macros: defaults, recursion, caller with and without arguments, filter blocks, list filters. */
  macros_and_filters: {
    minCompiled: 0.6,
    source: `
{%- macro render_value(v, depth=0) -%}
  {%- if v is mapping -%}
    {{- '{' -}}{%- for k, x in v | items -%}{{- k ~ '=' -}}{{- render_value(x, depth + 1) -}}{{- ';' if not loop.last -}}{%- endfor -%}{{- '}' -}}
  {%- elif v is string -%}{{- '"' ~ v ~ '"' -}}
  {%- elif v is sequence -%}{{- '[' -}}{%- for x in v -%}{{- render_value(x, depth + 1) -}}{%- if not loop.last -%},{%- endif -%}{%- endfor -%}{{- ']' -}}
  {%- elif v is none -%}{{- 'null' -}}
  {%- elif v is boolean -%}{{- 'yes' if v else 'no' -}}
  {%- else -%}{{- v -}}
  {%- endif -%}
{%- endmacro -%}
{%- macro tag(name, attrs='', close=true) -%}<{{ name }}{{ ' ' ~ attrs if attrs }}>{{ caller() if caller is defined else '' }}{% if close %}</{{ name }}>{% endif %}{%- endmacro -%}
{%- macro each(items, sep='\\n') -%}{%- for it in items -%}{{- caller(it, loop.index) -}}{{- sep if not loop.last -}}{%- endfor -%}{%- endmacro -%}
{%- macro role_of(m) -%}{{- m.role | upper if m.role is defined else 'NONE' -}}{%- endmacro -%}
{%- call tag('system', 'n="' ~ (messages | length) ~ '"') -%}
  {%- if tools -%}{{- tools | map(attribute='function.name') | join(', ') -}}{%- else -%}none{%- endif -%}
{%- endcall -%}
{{- tag('br', close=false) -}}
{%- call(m, i) each(messages, sep=' | ') -%}
  {{- i ~ '. ' ~ role_of(m) ~ ': ' -}}
  {%- if m.content is string -%}{{- m.content | replace('\\n', '\\\\n') -}}{%- else -%}{{- render_value(m.content) -}}{%- endif -%}
  {%- if m.tool_calls is defined -%}
    {%- for c in m.tool_calls -%}{{- ' -> ' ~ (c.function.name if c.function is defined else c.name) ~ render_value(c.function.arguments if c.function is defined else c.arguments) -}}{%- endfor -%}
  {%- endif -%}
{%- endcall -%}
{%- set roles = messages | map(attribute='role') | list -%}
{{- '\\nroles: ' ~ roles | join('/') ~ ' first=' ~ (roles | first if roles else 'none') ~ ' last=' ~ (roles | last if roles else 'none') -}}
{{- '\\nsorted: ' ~ roles | sort | join(',') ~ ' rev: ' ~ roles | reverse | join(',') ~ ' desc: ' ~ roles | sort(reverse=true) | join(',') -}}
{{- '\\nusers: ' ~ messages | selectattr('role', 'equalto', 'user') | list | length ~ ' with calls: ' ~ messages | selectattr('tool_calls', 'defined') | list | length ~ ' others: ' ~ messages | rejectattr('role', 'equalto', 'user') | list | length ~ ' truthy content: ' ~ messages | selectattr('content') | list | length -}}
{%- filter upper -%}{{- '\\nshout ' ~ (messages | length) ~ ' ' ~ (extra_note | default('no note')) -}}{%- endfilter -%}
{%- filter indent(2) -%}{{- '\\nindented\\nlines\\n\\nhere' -}}{%- endfilter -%}
{{- '\\n' ~ ('' | default('empty', true)) ~ '|' ~ (none | default('was none', true)) ~ '|' ~ (5 | string) ~ (-3 | abs) ~ ('42' | int + 1) ~ ('x7' | int) ~ ('0.25' | float) ~ (3.75 | int) ~ (roles | string) ~ (true | string) -}}
{%- for n in range(3) -%}{{- n -}}{%- endfor -%}{%- for n in range(5, 0, -2) -%}{{- n -}}{%- endfor -%}{%- for n in range(messages | length, 2) -%}{{- n -}}{%- endfor -%}
{{- '\\n' ~ 'hello world' | title ~ ' ' ~ 'hELLO' | capitalize ~ ' ' ~ 'MiXeD' | lower ~ ' ' ~ (messages | length | string | indent) -}}
{%- set by_role = messages | sort(attribute='role') -%}{{- '\\n' ~ by_role | map(attribute='role') | join(' ') -}}
{{- '\\n' ~ (tools | selectattr('type', 'equalto', 'function') | list | length if tools else 0) ~ (roles | join) ~ ('abc' | join('-')) ~ ('a\\nb' | indent(3, true)) -}}`,
  },

  /** Control flow and expressions: loop variables, filtered loops, break/continue, for-else, unpacking, tests, operators, slices. */
  control_flow: {
    minCompiled: 0.6,
    source: `
{%- set counts = namespace(user=0, assistant=0, other=0) -%}
{%- for m in messages if m.role != 'tool' -%}
  {%- if m.role == 'user' -%}{%- set counts.user = counts.user + 1 -%}
  {%- elif m.role == 'assistant' -%}{%- set counts.assistant = counts.assistant + 1 -%}
  {%- else -%}{%- set counts.other = counts.other + 1 -%}{%- endif -%}
  {{- loop.index ~ '/' ~ loop.length ~ ':' ~ loop.revindex ~ ':' ~ loop.revindex0 ~ (' first' if loop.first else '') ~ (' last' if loop.last else '') ~ ' ' -}}
  {%- if loop.previtem is defined -%}{{- '(after ' ~ loop.previtem.role ~ ')' -}}{%- endif -%}
  {%- if loop.nextitem is defined -%}{{- '(before ' ~ loop.nextitem.role ~ ')' -}}{%- endif -%}
{%- else -%}
  {{- 'nothing but tools' -}}
{%- endfor -%}
{{- '\\n' ~ counts.user ~ ',' ~ counts.assistant ~ ',' ~ counts.other -}}
{%- for m in messages -%}
  {%- if m.role == 'tool' -%}{%- continue -%}{%- endif -%}
  {%- if loop.index > 6 -%}{%- break -%}{%- endif -%}
  {{- '[' ~ loop.index0 ~ ']' -}}
{%- endfor -%}
{%- for m in messages -%}{{- 'y' -}}{%- if m.role == 'system' -%}{{- 'X' -}}{%- continue -%}{%- endif -%}{%- else -%}{{- '(else)' -}}{%- endfor -%}
{%- for m in messages -%}{%- for c in (m.tool_calls if m.tool_calls is defined else []) -%}{%- if loop.index > 1 -%}{%- break -%}{%- endif -%}{{- '<' ~ c.id ~ '>' -}}{%- else -%}{%- if m.role == 'user' -%}{%- continue -%}{%- endif -%}{%- endfor -%}{{- '.' -}}{%- endfor -%}
{%- set leak = 'outer' -%}{%- for m in messages -%}{%- set leak = m.role -%}{%- endfor -%}{{- '\\nleak=' ~ leak -}}
{%- for m in messages -%}{%- set outer = loop.index -%}{%- for c in m.tool_calls or [] -%}{{- ' ' ~ outer ~ '.' ~ loop.index ~ '/' ~ loop.length -}}{%- endfor -%}{%- endfor -%}
{%- set a, b = (messages | length) // 2, (messages | length) % 3 -%}
{{- '\\nmath ' ~ a ~ ' ' ~ b ~ ' ' ~ (a * 3 - b) ~ ' ' ~ (2 ** a) ~ ' ' ~ (a > b) ~ ' ' ~ (a <= b) ~ ' ' ~ (-a) ~ ' ' ~ (a + 0.5) ~ ' ' ~ (7 // 2) ~ (-7 // 2) ~ (-7 % 3) ~ (7 / 2) -}}
{%- for k, v in {'x': 1, 'y': [1, 2], 'z': none, 'w': {'n': true}} | items -%}{{- ' ' ~ k ~ '=' -}}{{- v -}}{%- endfor -%}
{%- set probe = [messages | length, 'text', 'low', none, true, false, {'a': 1}, [1, 2], undefined_thing, 2.5, ('t', 'u')] -%}
{%- for p in probe -%}
  {{- ' ' ~ loop.index0 ~ ':' -}}
  {%- if p is defined -%}D{%- endif -%}{%- if p is undefined -%}U{%- endif -%}{%- if p is none -%}N{%- endif -%}
  {%- if p is string -%}S{%- endif -%}{%- if p is number -%}#{%- endif -%}{%- if p is integer -%}I{%- endif -%}
  {%- if p is boolean -%}B{%- endif -%}{%- if p is true -%}T{%- endif -%}{%- if p is false -%}F{%- endif -%}
  {%- if p is mapping -%}M{%- endif -%}{%- if p is sequence -%}Q{%- endif -%}{%- if p is iterable -%}It{%- endif -%}{%- if p is callable -%}C{%- endif -%}
  {%- if p is integer and p is even -%}E{%- endif -%}{%- if p is integer and p is odd -%}O{%- endif -%}
  {%- if p is string and p is lower -%}l{%- endif -%}{%- if p is string and p is upper -%}u{%- endif -%}{%- if p is not none and p -%}+{%- endif -%}
{%- endfor -%}
{%- set last = messages[-1] if messages else none -%}
{%- if last is not none -%}
  {{- '\\nlast=' ~ last.role ~ (' in' if last.role in ('user', 'tool') else ' out') ~ (' hasContent' if 'content' in last else '') ~ (' notool' if 'tool_calls' not in last else '') -}}
  {{- ' sys' if last.role in ['system', 'developer'] else '' -}}{{- ' same' if last == messages[-1] -}}{{- ' listed' if last in messages -}}
  {%- if last.content is string -%}{{- ' has-e' if 'e' in last.content -}}{{- ' no-zz' if 'zz' not in last.content -}}{%- endif -%}
{%- endif -%}
{{- '\\n' ~ (messages[1:3] | length) ~ (messages[:-1] | length) ~ (messages[::2] | length) ~ (messages[-2:] | map(attribute='role') | join('+')) ~ (messages[5:1] | length) ~ (messages[::-2] | length) -}}
{%- if messages | length > 2 and messages[1].content is string -%}{{- '\\n' ~ messages[1].content[:5] ~ '|' ~ messages[1].content[-3:] ~ '|' ~ messages[1].content[::-1] ~ '|' ~ messages[1].content[1::3] -}}{%- endif -%}
{%- if add_generation_prompt is true and not (messages | length == 0) -%}{{- '\\nGO' -}}{%- endif -%}
{{- '\\n' ~ (1 if messages else 0) ~ ('a' if none else 'b') ~ ('c' if [] else 'd') ~ ('e' if {} else 'f') ~ ('g' if 0 else 'h') ~ ('i' if 'x' else 'j') ~ (none or 'k') ~ (0 and 'l') ~ ('m' ~ 1 ~ true) ~ (messages | length == 3) ~ (1 == 1) ~ (none == undefined_thing) ~ ('1' == 1) -}}`,
  },

  /** JSON and printing: tojson options, printed mappings and lists, mapping methods. */
  json_printing: {
    minCompiled: 0.6,
    source: `
{{- tools | tojson -}}
{{- '\\n' ~ (tools | tojson(indent=2)) -}}
{%- for t in tools or [] -%}
  {{- '\\n' ~ t.function | tojson(sort_keys=true) -}}
  {{- '\\n' ~ t.function.parameters | tojson(ensure_ascii=true, separators=(',', ':')) -}}
  {{- '\\n' ~ t | tojson(indent=4, sort_keys=true) -}}
  {{- '\\n' ~ t | tojson(indent=0) -}}
{%- endfor -%}
{%- for m in messages -%}
  {{- '\\n' -}}{{- m -}}
  {{- '\\n' -}}{{- m | tojson -}}
  {%- if m.tool_calls is defined -%}{%- for c in m.tool_calls -%}{{- '\\n' -}}{{- (c.function.arguments if c.function is defined else c.arguments) | tojson(indent=1) -}}{{- '\\n' -}}{{- c -}}{%- endfor -%}{%- endif -%}
  {{- '\\n' ~ (m | length) ~ ' keys: ' ~ m.keys() | join(',') ~ ' ' ~ (m | keys | length) ~ (m | values | length) -}}
  {%- for k, v in m.items() -%}{%- if v is string -%}{{- ' ' ~ k ~ ':' ~ v | length -}}{%- endif -%}{%- endfor -%}
  {{- '\\n' ~ m.get('name', 'anon') ~ ' ' ~ m.get('role') ~ ' ' ~ (m.get('nope') is none) -}}
{%- endfor -%}
{{- '\\n' -}}{{- messages | map(attribute='role') | list -}}
{{- '\\n' -}}{{- [1, 2.5, true, none, 'x', [], {}] -}}
{{- '\\n' -}}{{- {'k': [1, {'n': none}], 'b': false, 'u': undefined_thing} -}}{{- {'k': [1, {'n': none}], 'u': undefined_thing} | tojson -}}
{{- '\\n' -}}{{- add_generation_prompt -}}{{- 0.25 -}}{{- 7 -}}{{- -1 -}}{{- none -}}{{- undefined_thing -}}{{- namespace(a=1, b=[2]) -}}{{- namespace(a=1) | tojson -}}
{%- set ns = namespace(items=[]) -%}{%- for m in messages -%}{%- set ns.items = ns.items + [m.role] -%}{%- endfor -%}{{- '\\n' ~ ns.items | tojson -}}`,
  },

  /** String methods, with Python's arguments and whitespace (jinja-compat.ts gives the interpreter those). */
  string_methods: {
    minCompiled: 0.6,
    source: `
{%- for m in messages -%}
  {%- if m.content is string -%}
    {%- set c = m.content -%}
    {{- '\\n[' ~ c.strip() ~ '|' ~ c.lstrip() ~ '|' ~ c.rstrip() ~ '|' ~ c.strip('\\n') ~ '|' ~ c.lstrip(' \\t') ~ '|' ~ c.rstrip('.e\\n') ~ '|' ~ c.strip('😀a') ~ '|' ~ c.strip(none) ~ '|' ~ c.upper() ~ '|' ~ c.lower() ~ '|' ~ c.title() ~ '|' ~ c.capitalize() ~ ']' -}}
    {{- ' parts=' ~ c.split() | length ~ ' lines=' ~ c.split('\\n') | length ~ ' first=' ~ c.split(' ', 1)[0] ~ ' ws2=' ~ c.split(none, 2) | join('|') ~ ' ws0=' ~ c.split(none, 0) | join('|') ~ ' commas=' ~ c.split(',', 2) | join(';') -}}
    {%- if c.startswith(('<think>', '<tool_response>')) -%}{{- ' tagged' -}}{%- endif -%}
    {%- if c.endswith('.') or c.endswith('</think>') -%}{{- ' closed' -}}{%- endif -%}
    {%- if c.startswith('') and c.endswith(['x', 'e']) -%}{{- ' x-or-e' -}}{%- endif -%}
    {{- ' r=' ~ c.replace('a', 'A') ~ ' r1=' ~ c.replace('e', 'E', 1) ~ ' r0=' ~ c.replace('', '_', 3) ~ ' rc=' ~ c.replace('l', 'L', count=2) ~ ' len=' ~ c | length ~ ' ch=' ~ (c[0] if c else '') ~ (c[-1] if c else '') -}}
    {{- ' t=' ~ c | trim ~ ' f=' ~ (c | replace('\\n', ' ') | lower) ~ ' at3=' ~ (c[3] if c | length > 3 else '-') ~ ' ' ~ c.length ~ ' ' ~ (c is lower) -}}
  {%- elif m.content is not none and m.content is defined -%}
    {{- '\\n(non-string content: ' ~ (m.content | length) ~ ')' -}}
  {%- endif -%}
{%- endfor -%}`,
  },
};

// ---------------------------------------------------------------------------------------------

describe('compiled chat templates render exactly what the interpreter renders', () => {
  it('the tiny model template over the parity corpus, as ChatTokenizer builds the context', () => {
    const cases: Case[] = [];
    for (const c of CORPUS) {
      for (const tools of [c.tools, c.tools === null ? null : freezeValue(c.tools)]) {
        const base = { messages: templateView(normalizeMessages(c.messages)), documents: null, add_generation_prompt: true, bos_token: '<s>', eos_token: '</s>', ...(c.extra ?? {}) };
        cases.push({ interp: { ...base, tools }, compiled: { ...base, tools: tools instanceof Object && 'plain' in tools ? tools.plain : tools } });
      }
    }
    const outcome = differential(TINY_TEMPLATE, cases);
    expect(outcome.compiled).toBe(cases.length);
  });

  it('the tiny model template over 2,000 generated conversations', () => {
    const cases = randomCases(1, 2000);
    const outcome = differential(TINY_TEMPLATE, cases);
    expect(outcome.compiled).toBeGreaterThan(cases.length * 0.9);
  });

  describe.each(Object.entries(TEMPLATES))('%s', (name, spec) => {
    it('compiles', () => {
      expect(compileTemplate(spec.source).reason).toBeNull();
    });

    it('renders 1,000 generated conversations like the interpreter', () => {
      const cases = randomCases(1000 + name.length, 1000, { strict: spec.strict ?? 0 });
      const outcome = differential(spec.source, cases);
      // The comparison proves something only where the compiled renderer did render.
      expect(outcome.compiled, `fallbacks: ${JSON.stringify(outcome.reasons)}`).toBeGreaterThan(cases.length * spec.minCompiled);
      expect(outcome.compiled + outcome.fallbacks).toBe(cases.length);
    });
  });
});

describe('compile-time and run-time fallback', () => {
  const render = (source: string, ctx: Record<string, unknown>): { compiled: string | Unsupported; interpreted: string | Error } => {
    const c = compileTemplate(source);
    if (c.template === null) throw new Error(c.reason);
    let compiled: string | Unsupported;
    try {
      compiled = c.template.render(ctx);
    } catch (err) {
      if (!(err instanceof Unsupported)) throw err;
      compiled = err;
    }
    let interpreted: string | Error;
    try {
      interpreted = new Template(source).render(ctx);
    } catch (err) {
      interpreted = err as Error;
    }
    return { compiled, interpreted };
  };

  it.each([
    ['a filter not reproduced', '{{ messages | map(attribute="role") | unique | join(",") }}', 'filter unique'],
    ['argument unpacking', '{% macro f(a) %}{{ a }}{% endmacro %}{{ f(*messages) }}', 'argument unpacking'],
    ['kwargs in a macro', '{% macro f() %}{{ kwargs }}{% endmacro %}{{ f(x=1) }}', 'macro kwargs'],
    ['break outside a loop', '{% macro f() %}{% break %}{% endmacro %}', 'break outside a loop of the same macro'],
    ['rebinding namespace', '{% set namespace = 1 %}', 'binding the name namespace'],
  ])('%s: compileTemplate answers with the reason', (_what, source, reason) => {
    const result = compileTemplate(source);
    expect(result.template).toBeNull();
    expect(result.reason).toContain(reason);
  });

  it.each([
    ['a float with an integral value', '{{ (messages | length) / 2 }}', { messages: [1, 2] }, '1.0'],
    ['a float literal with an integral value', '{{ 2.0 }}', {}, '2.0'],
    ['+ of a list and a string', '{{ messages + "x" }}', { messages: ['a'] }, null],
    // A TypeError in Python; the interpreter wrote "args: [object Map]" (DeepSeek templates add tool-call arguments to strings).
    ['tojson of an undefined value (a TypeError in Python)', '{{ nothing | tojson }}', {}, Error],
    ['+ of a string and a mapping', '{{ "args: " + call.arguments }}', { call: { arguments: { city: 'Paris' } } }, Error],
    ['+ of a string and a number', '{{ "n=" + messages | length }}', { messages: [] }, Error],
    ['a string method as a value', '{{ "abc".upper }}', {}, null],
    ['raise_exception', '{{ raise_exception("stop: " ~ messages | length) }}', { messages: [] }, Error],
    ['an unknown filter', '{{ messages | shuffle }}', { messages: [] }, Error],
    ['an unknown test', '{{ messages is divisibleby }}', { messages: [] }, Error],
    ['for over a string', '{% for c in "ab" %}{{ c }}{% endfor %}', {}, Error],
    ['a context redefining a global', '{{ none }}', { none: 1 }, Error],
    ['printing a tuple', '{{ (1, 2) }}', {}, '(1, 2)'],
    ['first of an empty list', '{{ [] | first }}', {}, Error],
  ])('%s: Unsupported, and the interpreter decides', (_what, source, ctx, expected) => {
    const { compiled, interpreted } = render(source, ctx as Record<string, unknown>);
    expect(compiled).toBeInstanceOf(Unsupported);
    if (expected === Error) expect(interpreted).toBeInstanceOf(Error);
    else if (typeof expected === 'string') expect(interpreted).toBe(expected);
  });

  it.each([
    ['a non-integral float', '{{ (messages | length) / 2 }}|{{ 0.25 + 1 }}|{{ 1.5 | abs }}', { messages: [1, 2, 3] }],
    ['== between a mapping and a value', '{{ m != "" }}{{ m == "[object Map]" }}{{ m == 0 }}{{ ns == "[object Map]" }}{{ "" == m }}', { m: { a: 1 }, ns: null }],
    ['== and in with one object reachable twice (compared by value, so identity does not matter)', '{{ shared[0] == shared[1] }}{{ a in b }}{{ shared[0] == {"k": 1} }}', { shared: [SHARED, SHARED], a: SHARED, b: [1, SHARED] }],
    ['== between an object and itself in a tree-shaped context', '{{ messages[0] == messages[0] }}{{ messages[0] == messages[1] }}{{ messages[0] in messages }}{{ {} in messages }}', { messages: [{}, {}] }],
    ['dynamic scoping: a macro sees the variables where it is called', '{% macro show() %}{{ who }}:{{ loop.index if loop is defined }}{% endmacro %}{% set who = "top" %}{{ show() }}{% for who in ["a", "b"] %}{{ show() }}{% endfor %}', {}],
    ['a default argument reading an earlier one and the caller', '{% macro f(a, b=a ~ x) %}{{ b }}{% endmacro %}{% set x = "!" %}{{ f("q") }}{{ f("q", "r") }}{{ f(b="k", a=1) }}', {}],
    ['undefined iterables loop zero times (jinja-compat)', '{% for x in missing %}{{ x }}{% else %}none{% endfor %}{% for x in messages[0].parts %}{{ x }}{% endfor %}', { messages: [{}] }],
    ['strftime_now', '{{ strftime_now("%Y-%m-%d %B %b %%") }}', {}],
    ['set inside an if inside a loop stays in the loop', '{% set x = 1 %}{% for i in [1, 2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i * 10 %}{% endfor %}{{ x }}', {}],
    ['block set and filter statement with break', '{% for i in range(5) %}{% set s %}{{ i }}{% if i == 3 %}{% break %}{% endif %}{% endset %}{{ s }}{% filter upper %}a{{ i }}{% endfilter %}{% endfor %}', {}],
  ])('%s: compiled, same output', (_what, source, ctx) => {
    const { compiled, interpreted } = render(source, ctx as Record<string, unknown>);
    expect(typeof interpreted).toBe('string');
    expect(compiled).toBe(interpreted);
  });

  /* Expected values printed by transformers' jinja2; the interpreter gets the same from jinja-compat.ts. */
  it.each(PYTHON_RENDERED)('%s: compiled, as Python renders it', (_what, source, ctx, python) => {
    const { compiled, interpreted } = render(source, ctx as Record<string, unknown>);
    expect(compiled).toBe(python);
    expect(interpreted).toBe(python);
  });

  /* jinja2 filters and loop helpers not compiled: Unsupported, and the interpreter renders what Python does. */
  it.each(INTERPRETER_PYTHON_RENDERED)('%s: Unsupported compiled, interpreted as Python renders it', (_what, source, ctx, python) => {
    const { compiled, interpreted } = render(source, ctx as Record<string, unknown>);
    expect(compiled).toBeInstanceOf(Unsupported);
    expect(interpreted).toBe(python);
  });

  it('a float prints as Python writes it, alone or in a printed list', () => {
    const { compiled, interpreted } = render('{{ x }} {{ [x] }} {{ [x] | string }} {{ x | tojson }}', { x: 1e-7 });
    expect(compiled).toBe('1e-07 [1e-07] [1e-07] 1e-07');
    expect(interpreted).toBe(compiled);
  });

  it.each([
    ['a chars argument that is not a string', "{{ 'a'.strip(1) }}"],
    ['two arguments', "{{ 'a'.strip('a', 'b') }}"],
    ['a keyword argument', "{{ 'a'.rstrip(chars='a') }}"],
  ])('strip with %s: Unsupported, and the interpreter raises as Python does', (_what, source) => {
    const { compiled, interpreted } = render(source, {});
    expect(compiled).toBeInstanceOf(Unsupported);
    expect(interpreted).toBeInstanceOf(Error);
  });
});

// ---------------------------------------------------------------------------------------------
// ChatTokenizer integration

/** The tiny model's tokenizer files with another chat template. */
function modelWithTemplate(source: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'reef-template-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json', 'config.json']) {
    if (existsSync(join(tinyModelDir(), f))) copyFileSync(join(tinyModelDir(), f), join(dir, f));
  }
  writeFileSync(join(dir, 'chat_template.jinja'), source);
  dirs.push(dir);
  return dir;
}
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function tokenizers(modelDir: string, opts: ChatTokenizerOptions = {}): { compiled: ChatTokenizer; interpreter: ChatTokenizer } {
  return { compiled: ChatTokenizer.load(modelDir, opts), interpreter: ChatTokenizer.load(modelDir, { ...opts, compiledTemplate: false }) };
}

describe('ChatTokenizer with the compiled renderer', () => {
  let tiny: { compiled: ChatTokenizer; interpreter: ChatTokenizer };
  beforeAll(() => {
    tiny = tokenizers(tinyModelDir());
  });
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('gives the same text and ids as the interpreter over the parity corpus, guarded and not', () => {
    for (const c of CORPUS) {
      for (const guard of [true, false]) {
        const opts = { extra: c.extra ?? null, guard };
        const a = tiny.compiled.render(normalizeMessages(c.messages), c.tools, opts);
        const b = tiny.interpreter.render(normalizeMessages(c.messages), c.tools, opts);
        expect(a.text).toBe(b.text);
        expect(Array.from(a.ids)).toEqual(Array.from(b.ids));
      }
    }
    const stats = tiny.compiled.stats().template;
    expect(stats).toMatchObject({ interpreterOnly: null, fallbacks: 0, mismatches: 0 });
    expect(stats.compiled).toBe(CORPUS.length * 2);
    expect(stats.checked).toBe(16);
    expect(tiny.interpreter.stats().template).toMatchObject({ interpreterOnly: 'compiledTemplate: false', compiled: 0 });
  });

  it('gives the same text as the interpreter over 500 generated requests', () => {
    const r = seeded(77);
    for (let i = 0; i < 500; i++) {
      let messages: TemplateMessage[];
      try {
        messages = normalizeMessages(randomConversation(r, false));
      } catch {
        continue;
      }
      const tools = chance(r, 0.5) ? TWELVE_TOOLS.slice(0, upTo(r, 12)) : null;
      const opts = { addGenerationPrompt: chance(r, 0.5), extra: chance(r, 0.2) ? { enable_thinking: chance(r, 0.5) } : null };
      expect(tiny.compiled.renderText(messages, tools, opts)).toBe(tiny.interpreter.renderText(messages, tools, opts));
    }
    expect(tiny.compiled.stats().template.mismatches).toBe(0);
  });

  it('checks the first 16 compiled renders, then one in 256', () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const messages = normalizeMessages([{ role: 'user', content: 'hi' }]);
    for (let i = 0; i < 600; i++) tok.renderText(messages, null);
    expect(tok.stats().template).toMatchObject({ compiled: 600, checked: 16 + 2, mismatches: 0 });
  });

  it('a template that does not compile renders with the interpreter, the same text', () => {
    const dir = modelWithTemplate('{%- for r in messages | map(attribute="role") | unique -%}<{{ r }}>{%- endfor -%}{{ messages | length }}');
    const { compiled, interpreter } = tokenizers(dir);
    const messages = normalizeMessages([{ role: 'user', content: 'a' }, { role: 'assistant', content: 'b' }, { role: 'user', content: 'c' }]);
    expect(compiled.render(messages, null).text).toBe(interpreter.render(messages, null).text);
    expect(compiled.render(messages, null).text).toBe('<user><assistant>3');
    const stats = compiled.stats().template;
    expect(stats.interpreterOnly).toContain('filter unique');
    expect(stats.compiled).toBe(0);
  });

  it('a render the compiled template does not reproduce falls back to the interpreter for that request', () => {
    const dir = modelWithTemplate('{%- for m in messages -%}{{ m.content }};{%- endfor -%}{{ (messages | length) / 2 }}');
    const { compiled, interpreter } = tokenizers(dir);
    const two = normalizeMessages([{ role: 'user', content: 'a' }, { role: 'assistant', content: 'b' }]);
    const three = normalizeMessages([...two, { role: 'user', content: 'c' }]);
    expect(compiled.renderText(two, null)).toBe('a;b;1.0');
    expect(compiled.renderText(three, null)).toBe(interpreter.renderText(three, null));
    expect(compiled.renderText(three, null)).toBe('a;b;c;1.5');
    expect(compiled.stats().template).toMatchObject({ interpreterOnly: null, compiled: 2, fallbacks: 1, mismatches: 0 });
  });

  it('raise_exception gives the interpreter\'s error', () => {
    const dir = modelWithTemplate('{%- if messages | length > 1 -%}{{ raise_exception("only one message, got " ~ (messages | length)) }}{%- endif -%}{{ messages[0].content }}');
    const { compiled, interpreter } = tokenizers(dir);
    const messages = normalizeMessages([{ role: 'user', content: 'a' }, { role: 'user', content: 'b' }]);
    const error = (tok: ChatTokenizer): unknown => {
      try {
        tok.render(messages, null);
      } catch (err) {
        return err;
      }
      return null;
    };
    const a = error(compiled) as Error;
    expect(a.message).toContain('only one message, got 2');
    expect(a.message).toBe((error(interpreter) as Error).message);
    expect(compiled.render(messages.slice(0, 1), null).text).toBe('a');
  });

  it('a difference from the interpreter switches the compiled renderer off and returns the interpreter\'s text', () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const messages = normalizeMessages([{ role: 'user', content: 'hi' }]);
    const good = tok.renderText(messages, null);
    const original = CompiledTemplate.prototype.render;
    const spy = vi.spyOn(CompiledTemplate.prototype, 'render').mockImplementation(function (this: CompiledTemplate, ctx) {
      return original.call(this, ctx).replace('hi', 'ho');
    });
    const stderr = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    expect(tok.render(messages, null).text).toBe(good);
    expect(stderr).toHaveBeenCalledTimes(1);
    expect(String(stderr.mock.calls[0]![0])).toMatch(new RegExp(`${tinyModelDir().replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}.*first difference at offset \\d+`));
    const calls = spy.mock.calls.length;
    expect(tok.renderText(messages, null)).toBe(good);
    expect(spy.mock.calls.length).toBe(calls); // no longer used
    expect(tok.stats().template).toMatchObject({ compiled: 2, checked: 2, mismatches: 1 });
    expect(tok.stats().template.interpreterOnly).toMatch(/^switched off: first difference at offset \d+/);
  });
});
