import { Template } from '@huggingface/jinja';
import { tinyModelDir } from '../../cluster/paths.js';
import { benchTokenize, openClawTurns } from '../../actors/gateway/tokenize/bench.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/chat-tokenizer.js';
import { freezeValue } from '../../actors/gateway/tokenize/jinja-compat.js';
import { loadModelFiles } from '../../actors/gateway/tokenize/model-files.js';
import { templateView } from '../../actors/gateway/tokenize/normalize.js';
import { compileTemplate } from '../../actors/gateway/tokenize/template-compiler.js';
import { TWELVE_TOOLS } from '../../test/parity/corpus.js';
import type { BenchRow, BenchSuite } from '../lib.js';

/**
 * Render + tokenize of turn 3 of an OpenClaw-shaped session (30,000-character system prompt,
 * 12 tools), on one thread: cold (empty piece cache), warm (the session's earlier turns cached),
 * and Python transformers' `apply_chat_template(tokenize=True)` as the baseline, same run. Then
 * the chat template alone, compiled (template-compiler.ts) against @huggingface/jinja's
 * interpreter: the bare render, ChatTokenizer's `renderText` (with the request's own work: view,
 * guard marking, tool cache), and the warm render + tokenize.
 * Latencies are medians over the iterations; p99 is not measured (null).
 */
function row(caseName: string, impl: string, iterations: number, p50Ms: number): BenchRow {
  return {
    case: caseName,
    impl,
    ops: iterations,
    seconds: Math.round(((iterations * p50Ms) / 1000) * 100) / 100,
    opsPerSec: Math.round(1000 / p50Ms),
    p50Us: Math.round(p50Ms * 10_000) / 10,
    p99Us: null,
    mbPerSec: null,
  };
}

/** Median µs per call, timed in batches of at least 0.5 ms (one render is too short for one timer reading). */
function perCall(f: () => unknown, seconds: number): { ops: number; p50Us: number } {
  for (let i = 0; i < 300; i++) f();
  let batch = 1;
  for (;;) {
    const t0 = performance.now();
    for (let i = 0; i < batch; i++) f();
    if (performance.now() - t0 >= 0.5) break;
    batch *= 2;
  }
  const samples: number[] = [];
  let ops = 0;
  const end = performance.now() + seconds * 1000;
  while (performance.now() < end) {
    const t0 = performance.now();
    for (let i = 0; i < batch; i++) f();
    samples.push(((performance.now() - t0) * 1000) / batch);
    ops += batch;
  }
  samples.sort((a, b) => a - b);
  return { ops, p50Us: samples[samples.length >> 1]! };
}

function usRow(caseName: string, impl: string, m: { ops: number; p50Us: number }): BenchRow {
  return row(caseName, impl, m.ops, m.p50Us / 1000);
}

function templateRows(seconds: number): BenchRow[] {
  const files = loadModelFiles(tinyModelDir());
  const compiled = compileTemplate(files.chatTemplate).template;
  if (compiled === null) throw new Error('the tiny model template did not compile');
  const interpreter = new Template(files.chatTemplate);
  const turn3 = openClawTurns()[2]!;
  const tools = freezeValue(TWELVE_TOOLS);
  const base = { messages: templateView(turn3), documents: null, add_generation_prompt: true, ...files.specialTokens };
  const each = seconds / 2;
  const name = 'openclaw turn 3, chat template';
  const rows = [
    usRow(`${name} alone`, 'compiled', perCall(() => compiled.render({ ...base, tools: tools.plain }), each)),
    usRow(`${name} alone`, 'interpreter', perCall(() => interpreter.render({ ...base, tools }), each)),
  ];
  const toks = { compiled: ChatTokenizer.load(tinyModelDir()), interpreter: ChatTokenizer.load(tinyModelDir(), { compiledTemplate: false }) };
  for (const [impl, tok] of Object.entries(toks)) rows.push(usRow(`${name}, ChatTokenizer.renderText`, impl, perCall(() => tok.renderText(turn3, TWELVE_TOOLS), each)));
  for (const [impl, tok] of Object.entries(toks)) rows.push(usRow('openclaw turn 3, render + tokenize, warm', impl, perCall(() => tok.render(turn3, TWELVE_TOOLS), each)));
  const stats = toks.compiled.stats().template;
  if (stats.interpreterOnly !== null || stats.mismatches > 0) throw new Error(`compiled renderer not in use: ${JSON.stringify(stats)}`);
  return rows;
}

export const suite: BenchSuite = {
  name: 'tokenize',
  description: 'chat template + tokenizer, OpenClaw-shaped turn 3, beside Python transformers',
  run: async (ctx) => {
    // ~30 ms per cold render: scale the iterations with the time budget, at least 20.
    const iterations = Math.max(20, Math.round(ctx.seconds * 10));
    const r = benchTokenize({ iterations });
    const name = `openclaw turn 3 (${r.promptTokens} tokens)`;
    const rows = [row(name, 'reef, cold piece cache', r.iterations, r.coldP50Ms), row(name, 'reef, warm (session cached)', r.iterations, r.warmP50Ms)];
    if (r.pythonP50Ms === null) ctx.log('python reference skipped (transformers not available)');
    else rows.push(row(name, 'python transformers', r.iterations, r.pythonP50Ms));
    return [...rows, ...templateRows(ctx.seconds)];
  },
};
