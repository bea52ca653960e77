import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { qwen3Parser } from './qwen3.js';
import { type OutputParser, type ParsedOutput, type ParseOptions, type StreamDelta, type StreamParser } from './types.js';

export { qwen3Parser } from './qwen3.js';
export { callId, type OutputParser, type ParsedOutput, type ParseOptions, type StreamDelta, type StreamParser, type ToolCall } from './types.js';

/** Models with no known markup: the whole output is content. */
export const plainParser: OutputParser = {
  name: 'plain',
  parse(text: string): ParsedOutput {
    return { reasoning_content: null, content: text.length > 0 ? text : null, tool_calls: [] };
  },
  stream(_opts?: ParseOptions): StreamParser {
    return {
      push: (text: string): StreamDelta[] => (text ? [{ content: text }] : []),
      finish: (): StreamDelta[] => [],
    };
  },
};

/** `config.json` model_type → parser. Qwen2/2.5/3 and their MoE variants share the Hermes tool-call markup. */
const FAMILIES: Record<string, OutputParser> = {
  qwen2: qwen3Parser,
  qwen2_moe: qwen3Parser,
  qwen3: qwen3Parser,
  qwen3_moe: qwen3Parser,
  qwen3_next: qwen3Parser,
  plain: plainParser,
};

/**
 * The output parser for a model: `modelDirOrFamily` is a model directory (its `config.json`
 * `model_type` decides) or a family name (`qwen3`). Unknown families get the plain parser.
 */
export function parserFor(modelDirOrFamily: string): OutputParser {
  let family = modelDirOrFamily;
  const configPath = join(modelDirOrFamily, 'config.json');
  if (existsSync(configPath)) {
    const config = JSON.parse(readFileSync(configPath, 'utf8')) as { model_type?: unknown };
    family = typeof config.model_type === 'string' ? config.model_type : '';
  }
  return FAMILIES[family.toLowerCase()] ?? plainParser;
}

