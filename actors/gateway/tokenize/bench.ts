import { spawnSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { pythonBin, pythonEnv, tinyModelDir } from '../../../cluster/paths.js';
import { longSystemPrompt, TWELVE_TOOLS } from '../../../test/parity/corpus.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import { normalizeMessages, type TemplateMessage } from './normalize.js';

export interface TokenizeBenchResult {
  modelDir: string;
  promptTokens: number;
  iterations: number;
  /** Turn 3 rendered and tokenized with an empty piece cache, median ms. */
  coldP50Ms: number;
  /** Turn 3 after turns 1 and 2 of the same session filled the cache, median ms. */
  warmP50Ms: number;
  /** transformers apply_chat_template(tokenize=True) for turn 3, median ms, or null when skipped. */
  pythonP50Ms: number | null;
}

/** An OpenClaw-shaped session: 30,000-character system prompt, 12 tools, turns of tool use. */
export function openClawTurns(): TemplateMessage[][] {
  const call = (id: string, name: string, args: string) => ({ id, type: 'function', function: { name, arguments: args } });
  const t1 = [{ role: 'system', content: longSystemPrompt() }, { role: 'user', content: 'Check the weather in Berlin and save it to weather.txt.' }];
  const t2 = [...t1,
    { role: 'assistant', content: null, tool_calls: [call('w', 'get_weather', '{"city": "Berlin"}')] },
    { role: 'tool', tool_call_id: 'w', content: '{"temp_c": 9, "sky": "overcast"}' }];
  const t3 = [...t2,
    { role: 'assistant', content: null, tool_calls: [call('f', 'write_file', '{"path": "weather.txt", "content": "Berlin: 9°C, overcast"}')] },
    { role: 'tool', tool_call_id: 'f', content: 'ok' }, { role: 'assistant', content: 'Saved.' }, { role: 'user', content: 'Now do Paris.' }];
  return [t1, t2, t3].map((t) => normalizeMessages(t));
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function pythonReference(modelDir: string, messages: TemplateMessage[], iterations: number): number | null {
  const script = `
import json, sys, time
from transformers import AutoTokenizer
req = json.loads(sys.stdin.read())
tok = AutoTokenizer.from_pretrained(req["modelDir"])
times = []
for _ in range(req["iterations"]):
    t0 = time.perf_counter()
    tok.apply_chat_template(req["messages"], tools=req["tools"], add_generation_prompt=True, tokenize=True)
    times.append((time.perf_counter() - t0) * 1000)
times.sort()
print(json.dumps({"p50": times[len(times) // 2]}))
`;
  const proc = spawnSync(pythonBin(), ['-c', script], {
    input: JSON.stringify({ modelDir, messages, tools: TWELVE_TOOLS, iterations }), env: pythonEnv(), encoding: 'utf8', timeout: 120_000,
  });
  if (proc.status !== 0) return null;
  return (JSON.parse(proc.stdout.trim().split('\n').pop()!) as { p50: number }).p50;
}

/**
 * Per-turn render + tokenize time for an OpenClaw-shaped conversation, cold (empty piece cache)
 * against warm (the session's earlier turns cached), on this thread; Python measured once for
 * reference. Called by the bench suite; not a test.
 */
export function benchTokenize(opts: { modelDir?: string; iterations?: number; python?: boolean } = {}): TokenizeBenchResult {
  const modelDir = opts.modelDir ?? tinyModelDir();
  const iterations = opts.iterations ?? 30;
  const tok = ChatTokenizer.load(modelDir);
  const [t1, t2, t3] = openClawTurns() as [TemplateMessage[], TemplateMessage[], TemplateMessage[]];
  const cold: number[] = [];
  const warm: number[] = [];
  let promptTokens = 0;
  for (let i = 0; i < iterations + 3; i++) {
    tok.clearCache();
    let t0 = performance.now();
    promptTokens = tok.render(t3, TWELVE_TOOLS).ids.length;
    const coldMs = performance.now() - t0;
    tok.clearCache();
    tok.render(t1, TWELVE_TOOLS);
    tok.render(t2, TWELVE_TOOLS);
    t0 = performance.now();
    tok.render(t3, TWELVE_TOOLS);
    const warmMs = performance.now() - t0;
    if (i >= 3) { // the first rounds warm up the JIT
      cold.push(coldMs);
      warm.push(warmMs);
    }
  }
  const pythonP50Ms = opts.python === false ? null : pythonReference(modelDir, t3, iterations);
  return { modelDir, promptTokens, iterations, coldP50Ms: median(cold), warmP50Ms: median(warm), pythonP50Ms };
}
