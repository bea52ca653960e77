import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { ReefError } from '../../runtime/errors.js';

/** An added token as `tokenizer.json` lists it. */
export interface AddedTokenSpec {
  id: number;
  content: string;
  special: boolean;
  normalized: boolean;
  lstrip: boolean;
  rstrip: boolean;
  singleWord: boolean;
}

/** Everything a chat tokenizer needs from a Hugging Face model directory, read once. */
export interface ModelFiles {
  modelDir: string;
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
  chatTemplate: string;
  /** The template transformers renders a request with tools with (its named template `tool_use`), or null: `chatTemplate`. */
  toolUseTemplate: string | null;
  /** The special-token variables transformers passes into every render (`bos_token`, `eos_token`, ...). */
  specialTokens: Record<string, string>;
  addedTokens: AddedTokenSpec[];
  /** Longest prompt + completion the model accepts, or null when the config names none. */
  contextLength: number | null;
}

function readJson(path: string): Record<string, unknown> {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
  } catch (err) {
    throw new ReefError('REEF_ERR_TOKENIZER', { modelDir: path, reason: (err as Error).message }, { cause: err });
  }
}

/** `bos_token` may be a string or an AddedToken-like object `{content: ...}`. */
function tokenText(value: unknown): string | null {
  if (typeof value === 'string') return value;
  if (value && typeof value === 'object' && typeof (value as { content?: unknown }).content === 'string') {
    return (value as { content: string }).content;
  }
  return null;
}

const SPECIAL_TOKEN_KEYS = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'];

/**
 * Read `tokenizer.json`, `tokenizer_config.json`, the chat template and `config.json` of a model.
 * transformers 5 writes the template to `chat_template.jinja`, so that file wins over the
 * config's `chat_template` key.
 */
export function loadModelFiles(modelDir: string): ModelFiles {
  const tokenizerPath = join(modelDir, 'tokenizer.json');
  if (!existsSync(tokenizerPath)) {
    throw new ReefError('REEF_ERR_TOKENIZER', { modelDir, reason: 'no tokenizer.json' });
  }
  const tokenizerJson = readJson(tokenizerPath);
  const configPath = join(modelDir, 'tokenizer_config.json');
  const tokenizerConfig = existsSync(configPath) ? readJson(configPath) : {};

  const templates = chatTemplates(modelDir, tokenizerConfig);
  const chatTemplate = templates.get('default') ?? null;
  if (chatTemplate === null) {
    const reason = templates.size > 0
      ? `named chat templates without a default (${[...templates.keys()].join(', ')})`
      : 'no chat_template.jinja and no chat_template in tokenizer_config.json';
    throw new ReefError('REEF_ERR_TOKENIZER', { modelDir, reason });
  }

  const specialTokens: Record<string, string> = {};
  for (const key of SPECIAL_TOKEN_KEYS) {
    const text = tokenText(tokenizerConfig[key]);
    if (text !== null) specialTokens[key] = text;
  }

  const rawAdded = Array.isArray(tokenizerJson.added_tokens) ? (tokenizerJson.added_tokens as Record<string, unknown>[]) : [];
  const addedTokens = rawAdded.map((t) => ({
    id: Number(t.id),
    content: String(t.content),
    special: t.special === true,
    normalized: t.normalized === true,
    lstrip: t.lstrip === true,
    rstrip: t.rstrip === true,
    singleWord: t.single_word === true,
  }));

  const toolUseTemplate = templates.get('tool_use') ?? null;
  return { modelDir, tokenizerJson, tokenizerConfig, chatTemplate, toolUseTemplate, specialTokens, addedTokens, contextLength: readContextLength(modelDir, tokenizerConfig) };
}

/**
 * A model's chat templates by name, as transformers 5 finds them: `chat_template.jinja` (the
 * default) and `additional_chat_templates/<name>.jinja` when either exists, else the config's
 * `chat_template`, a template or a list of `{name, template}`.
 */
function chatTemplates(modelDir: string, config: Record<string, unknown>): Map<string, string> {
  const templates = new Map<string, string>();
  const file = join(modelDir, 'chat_template.jinja');
  if (existsSync(file)) templates.set('default', readFileSync(file, 'utf8'));
  const dir = join(modelDir, 'additional_chat_templates');
  if (existsSync(dir)) {
    for (const name of readdirSync(dir).sort()) {
      if (name.endsWith('.jinja')) templates.set(name.slice(0, -'.jinja'.length), readFileSync(join(dir, name), 'utf8'));
    }
  }
  if (templates.size > 0) return templates;
  const configured = config.chat_template;
  if (typeof configured === 'string') templates.set('default', configured);
  else if (Array.isArray(configured)) {
    for (const t of configured as { name?: unknown; template?: unknown }[]) {
      if (t && typeof t.name === 'string' && typeof t.template === 'string') templates.set(t.name, t.template);
    }
  }
  return templates;
}

/** Context length from `config.json` (`max_position_embeddings` and its aliases), else the tokenizer's `model_max_length`. */
function readContextLength(modelDir: string, tokenizerConfig: Record<string, unknown>): number | null {
  const configPath = join(modelDir, 'config.json');
  if (existsSync(configPath)) {
    const config = readJson(configPath);
    const nested = (config.text_config ?? {}) as Record<string, unknown>;
    for (const source of [config, nested]) {
      for (const key of ['max_position_embeddings', 'max_sequence_length', 'seq_length', 'n_positions']) {
        const v = source[key];
        if (typeof v === 'number' && Number.isInteger(v) && v > 0) return v;
      }
    }
  }
  const v = tokenizerConfig.model_max_length;
  // transformers writes a huge sentinel (1e30) when the length is unknown.
  return typeof v === 'number' && Number.isInteger(v) && v > 0 && v < 1e9 ? v : null;
}
