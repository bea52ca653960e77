import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { callId, parserFor, plainParser, qwen3Parser, type ParsedOutput, type ParseOptions, type StreamDelta } from './index.js';
import { trailingSpaceStart } from './qwen3.js';

interface Case {
  name: string;
  text: string;
  opts?: ParseOptions;
  want: { reasoning_content: string | null; content: string | null; tool_calls: [string, string][] };
}

const CASES: Case[] = [
  { name: 'plain answer', text: 'Hello there.', want: { reasoning_content: null, content: 'Hello there.', tool_calls: [] } },
  { name: 'empty output', text: '', want: { reasoning_content: null, content: null, tool_calls: [] } },
  { name: 'think then answer', text: '<think>\nLet me add.\n</think>\n\n2 + 2 = 4', want: { reasoning_content: 'Let me add.', content: '2 + 2 = 4', tool_calls: [] } },
  { name: 'prompt opened think', text: 'still thinking\n</think>\n\nAnswer.', opts: { startsInThinking: true }, want: { reasoning_content: 'still thinking', content: 'Answer.', tool_calls: [] } },
  { name: 'think never closed', text: '<think>\nhmm, long thought', want: { reasoning_content: 'hmm, long thought', content: null, tool_calls: [] } },
  { name: 'empty think', text: '<think>\n\n</think>\n\nHi', want: { reasoning_content: null, content: 'Hi', tool_calls: [] } },
  { name: 'think tag later is content', text: 'Use <think> tags like <think>x</think>.', want: { reasoning_content: null, content: 'Use <think> tags like <think>x</think>.', tool_calls: [] } },
  {
    name: 'single tool call', text: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    want: { reasoning_content: null, content: null, tool_calls: [['get_weather', '{"city":"Paris"}']] },
  },
  {
    name: 'think, text and parallel calls', text: '<think>\nneed two cities\n</think>\n\nChecking both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "units": "metric"}}\n</tool_call>',
    want: { reasoning_content: 'need two cities', content: 'Checking both.', tool_calls: [['get_weather', '{"city":"Paris"}'], ['get_weather', '{"city":"Oslo","units":"metric"}']] },
  },
  {
    name: 'arguments as a JSON string stay verbatim', text: '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1.0}"}</tool_call>',
    want: { reasoning_content: null, content: null, tool_calls: [['f', '{"x": 1.0}']] },
  },
  {
    name: 'arguments string that is not a JSON object stays content', text: '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>',
    want: { reasoning_content: null, content: '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>', tool_calls: [] },
  },
  {
    name: 'arguments that are an array stay content', text: '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
    want: { reasoning_content: null, content: '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', tool_calls: [] },
  },
  { name: 'no arguments', text: '<tool_call>{"name": "now"}</tool_call>', want: { reasoning_content: null, content: null, tool_calls: [['now', '{}']] } },
  {
    name: 'malformed JSON stays content', text: 'Trying.\n<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>',
    want: { reasoning_content: null, content: 'Trying.\n<tool_call>\n{"name": "f", "arguments": {"x": }\n</tool_call>', tool_calls: [] },
  },
  {
    name: 'missing name stays content, valid call kept', text: '<tool_call>{"arguments": {}}</tool_call> and <tool_call>{"name": "ok", "arguments": {"a": [1, 2]}}</tool_call> done',
    want: { reasoning_content: null, content: '<tool_call>{"arguments": {}}</tool_call> and  done', tool_calls: [['ok', '{"a":[1,2]}']] },
  },
  {
    name: 'cut-off tool call stays content', text: 'Let me call.\n<tool_call>\n{"name": "f", "argu',
    want: { reasoning_content: null, content: 'Let me call.\n<tool_call>\n{"name": "f", "argu', tool_calls: [] },
  },
  { name: 'text ending in a tag prefix', text: 'a < b and x <tool', want: { reasoning_content: null, content: 'a < b and x <tool', tool_calls: [] } },
  { name: 'unicode everywhere', text: '<think>東京 🇯🇵</think>مرحبا 👋🏽\n<tool_call>{"name": "say", "arguments": {"t": "日本語 ✓"}}</tool_call>', want: { reasoning_content: '東京 🇯🇵', content: 'مرحبا 👋🏽', tool_calls: [['say', '{"t":"日本語 ✓"}']] } },
  { name: 'whitespace kept inside content', text: '\n\n  line one\n\n    indented\n  \n', want: { reasoning_content: null, content: 'line one\n\n    indented', tool_calls: [] } },
  {
    name: 'no tools offered: call markup stays content', text: 'Checking.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', opts: { tools: false },
    want: { reasoning_content: null, content: 'Checking.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', tool_calls: [] },
  },
  {
    name: 'no tools offered, after reasoning', text: '<think>plan</think>\n<tool_call>{"name": "f"}</tool_call> <tool', opts: { tools: false },
    want: { reasoning_content: 'plan', content: '<tool_call>{"name": "f"}</tool_call> <tool', tool_calls: [] },
  },
  {
    name: 'arguments quoting the closing tag (regression: the call was cut there and left in the content)', text: 'Writing.\n<tool_call>\n{"name": "write", "arguments": {"text": "end with </tool_call> and \\"</tool_call>\\""}}\n</tool_call>\nDone.',
    want: { reasoning_content: null, content: 'Writing.\n\nDone.', tool_calls: [['write', '{"text":"end with </tool_call> and \\"</tool_call>\\""}']] },
  },
  {
    name: 'a closing tag after an escaped backslash ends the string', text: '<tool_call>{"name": "f", "arguments": {"p": "C:\\\\"}}</tool_call>',
    want: { reasoning_content: null, content: null, tool_calls: [['f', '{"p":"C:\\\\"}']] },
  },
  {
    name: 'a string that never closes is a cut-off call', text: '<tool_call>{"name": "f", "arguments": {"a": "oops</tool_call> more',
    want: { reasoning_content: null, content: '<tool_call>{"name": "f", "arguments": {"a": "oops</tool_call> more', tool_calls: [] },
  },
  {
    name: 'tags in prose that is not JSON', text: 'Wrap it in <tool_call> "quoted </tool_call> tags.',
    want: { reasoning_content: null, content: 'Wrap it in <tool_call> "quoted </tool_call> tags.', tool_calls: [] },
  },
  { name: 'parameters alias', text: '<tool_call>{"name": "f", "parameters": {"k": true}}</tool_call>', want: { reasoning_content: null, content: null, tool_calls: [['f', '{"k":true}']] } },
];

function counterIds(): () => string {
  let n = 0;
  return () => `call_${String(n++).padStart(24, '0')}`;
}

function simplify(p: ParsedOutput): Case['want'] {
  return { reasoning_content: p.reasoning_content, content: p.content, tool_calls: p.tool_calls.map((c) => [c.function.name, c.function.arguments]) };
}

/** Concatenate stream deltas into the non-stream shape. */
function collect(deltas: StreamDelta[]): ParsedOutput {
  let reasoning = '';
  let content = '';
  const calls: ParsedOutput['tool_calls'] = [];
  for (const d of deltas) {
    const set = Object.keys(d);
    expect(set).toHaveLength(1);
    if ('reasoning_content' in d) reasoning += d.reasoning_content;
    else if ('content' in d) content += d.content;
    else {
      const c = d.tool_calls[0];
      expect(c.index).toBe(calls.length);
      calls.push({ id: c.id, type: c.type, function: c.function });
    }
  }
  return { reasoning_content: reasoning || null, content: content || null, tool_calls: calls };
}

function streamChunks(chunks: string[], opts: ParseOptions = {}): { deltas: StreamDelta[]; parsed: ParsedOutput } {
  const s = qwen3Parser.stream({ ...opts, newId: counterIds() });
  const deltas = chunks.flatMap((c) => s.push(c)).concat(s.finish());
  return { deltas, parsed: collect(deltas) };
}

describe('qwen3Parser.parse', () => {
  it.each(CASES.map((c) => [c.name, c] as const))('%s', (_n, c) => {
    expect(simplify(qwen3Parser.parse(c.text, c.opts))).toEqual(c.want);
  });

  it('gives tool calls OpenAI-shaped random ids', () => {
    const out = qwen3Parser.parse('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>');
    for (const call of out.tool_calls) expect(call.id).toMatch(/^call_[A-Za-z0-9]{24}$/);
    expect(out.tool_calls[0]!.id).not.toBe(out.tool_calls[1]!.id);
    expect(callId()).toMatch(/^call_[A-Za-z0-9]{24}$/);
  });
});

describe('qwen3Parser.stream equals parse', () => {
  it.each(CASES.map((c) => [c.name, c] as const))('%s, split at every point and char by char', (_n, c) => {
    const want = qwen3Parser.parse(c.text, { ...c.opts, newId: counterIds() });
    for (let i = 0; i <= c.text.length; i++) {
      expect(streamChunks([c.text.slice(0, i), c.text.slice(i)], c.opts).parsed, `split at ${i}`).toEqual(want);
    }
    expect(streamChunks(Array.from(c.text), c.opts).parsed).toEqual(want);
  });

  // Emitting '<tool_' early would show up in the split-point equality above; this checks the
  // stronger property that nothing emitted is ever retracted: every prefix of the stream is a
  // prefix of the final fields.
  it('emitted text is always a prefix of the final fields', () => {
    for (const c of CASES) {
      const want = qwen3Parser.parse(c.text, c.opts);
      const s = qwen3Parser.stream({ ...c.opts, newId: counterIds() });
      let content = '';
      let reasoning = '';
      for (const ch of Array.from(c.text)) {
        for (const d of s.push(ch)) {
          if ('content' in d) content += d.content;
          if ('reasoning_content' in d) reasoning += d.reasoning_content;
        }
        expect((want.content ?? '').startsWith(content), c.name).toBe(true);
        expect((want.reasoning_content ?? '').startsWith(reasoning), c.name).toBe(true);
      }
    }
  });

  it('holds a possible tag back until it is decided', () => {
    const s = qwen3Parser.stream({ newId: counterIds() });
    expect(s.push('Sure. <tool_')).toEqual([{ content: 'Sure.' }]);
    expect(s.push('call>{"name": "f", "arguments": {}}</tool_')).toEqual([]);
    expect(s.push('call> bye')).toEqual([{ tool_calls: [{ index: 0, id: 'call_000000000000000000000000', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { content: '  bye' }]);
    expect(s.finish()).toEqual([]);
  });
});

describe('trailing whitespace in the stream', () => {
  it('finds the run a trailing /\\s+$/u would, over every code unit the regex calls whitespace', () => {
    const samples = ['', 'a', 'a ', ' a', '   ', 'x\u3000\u00a0\t\n', 'x\u2028', 'x\ufeff', 'x\u200b', 'x\ud83d\ude00', 'x\ud83d\ude00 ', 'a b \r\n'];
    for (let c = 0; c < 0x10000; c += 97) samples.push(`y${String.fromCharCode(c)}`);
    for (const t of samples) {
      const m = /\s+$/u.exec(t);
      expect(trailingSpaceStart(t), JSON.stringify(t)).toBe(m ? m.index : t.length);
    }
  });

  it('holds a long whitespace run across tokens and emits it once text follows (a degenerate model emitting spaces)', () => {
    const s = qwen3Parser.stream({ newId: counterIds() });
    const out: StreamDelta[] = [...s.push('Answer:')];
    for (let i = 0; i < 40_000; i++) out.push(...s.push(i % 1000 === 999 ? '\n' : ' '));
    expect(out).toEqual([{ content: 'Answer:' }]);
    out.push(...s.push(' 42'), ...s.finish());
    const content = out.map((d) => ('content' in d ? d.content : '')).join('');
    expect(content).toBe(`Answer:${Array.from({ length: 40_000 }, (_, i) => (i % 1000 === 999 ? '\n' : ' ')).join('')} 42`);
  });
});

describe('parserFor', () => {
  it('chooses by family name or by the model directory config', () => {
    expect(parserFor('qwen3').name).toBe('qwen3');
    expect(parserFor('Qwen2').name).toBe('qwen3');
    expect(parserFor('llama').name).toBe('plain');
    const dir = mkdtempSync(join(tmpdir(), 'reef-parser-'));
    try {
      writeFileSync(join(dir, 'config.json'), JSON.stringify({ model_type: 'qwen3' }));
      expect(parserFor(dir)).toBe(qwen3Parser);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('plain parser passes everything through as content', () => {
    expect(plainParser.parse('<think>x</think>')).toEqual({ reasoning_content: null, content: '<think>x</think>', tool_calls: [] });
    const s = plainParser.stream();
    expect([...s.push('a'), ...s.push(''), ...s.finish()]).toEqual([{ content: 'a' }]);
  });
});
