import { benchTokenize } from '../../actors/gateway/tokenize/bench.js';
import type { BenchRow, BenchSuite } from '../lib.js';

/**
 * Render + tokenize of turn 3 of an OpenClaw-shaped session (30,000-character system prompt,
 * 12 tools), on one thread: cold (empty piece cache), warm (the session's earlier turns cached),
 * and Python transformers' `apply_chat_template(tokenize=True)` as the baseline, same run.
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
    return rows;
  },
};
