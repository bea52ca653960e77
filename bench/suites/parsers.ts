import { qwen3Parser } from '../../actors/gateway/parsers/index.js';
import { type BenchSuite, toRow } from '../lib.js';

/**
 * The Qwen3 output parser in streaming mode, fed token by token as the gateway feeds it from the
 * engine's events: each push runs on the gateway's event loop, so its worst case is the lag every
 * other request sees. The pathological stream is what a degenerate model emits unaided, a long
 * run of whitespace (held back until text follows) and an unterminated `<tool_call>` (held until
 * it closes); the baseline, measured in the same run, is as many ordinary word tokens.
 * `REEF_BENCH_PARSER_TOKENS` tokens per stream (@default 40,000).
 */

type Stream = { name: string; tokens: (n: number) => string[] };

const STREAMS: Stream[] = [
  { name: 'word tokens (baseline)', tokens: (n) => Array.from({ length: n }, (_, i) => (i % 12 === 11 ? '.\n' : ' word')) },
  // Leading whitespace is dropped at once; the run after text is what is held.
  { name: 'text, a whitespace run, text', tokens: (n) => ['Answer:', ...Array.from({ length: n - 2 }, (_, i) => (i % 100 === 99 ? '\n' : ' ')), ' 42'] },
  { name: 'unterminated <tool_call>', tokens: (n) => ['<tool_call>{"name": "f", "arguments": {"a": "', ...Array.from({ length: n - 1 }, () => 'ab ')] },
];

export const suite: BenchSuite = {
  name: 'parsers',
  description: 'the Qwen3 stream parser per pushed token: ordinary text beside degenerate streams',
  run: async (ctx) => {
    const n = Number(process.env.REEF_BENCH_PARSER_TOKENS ?? 40_000);
    if (!Number.isInteger(n) || n < 2) throw new Error(`REEF_BENCH_PARSER_TOKENS must be an integer ≥ 2, got ${process.env.REEF_BENCH_PARSER_TOKENS}`);
    const rows = [];
    for (const s of STREAMS) {
      const tokens = s.tokens(n);
      const latenciesUs: number[] = new Array(tokens.length);
      const parser = qwen3Parser.stream({ tools: true });
      const t0 = performance.now();
      for (let i = 0; i < tokens.length; i++) {
        const t = performance.now();
        parser.push(tokens[i]!);
        latenciesUs[i] = (performance.now() - t) * 1000;
      }
      parser.finish();
      const seconds = (performance.now() - t0) / 1000;
      const worst = Math.max(...latenciesUs);
      rows.push(toRow(`${n} tokens: ${s.name}`, `qwen3 stream, worst push ${(worst / 1000).toFixed(1)} ms`, { ops: tokens.length, seconds, latenciesUs }));
      ctx.log(`  ${s.name}: ${seconds.toFixed(2)} s for ${n} pushes, worst ${(worst / 1000).toFixed(1)} ms`);
    }
    return rows;
  },
};
