import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pythonBin, pythonEnv, repoRoot, tinyModelDir } from '../../cluster/paths.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/chat-tokenizer.js';
import { normalizeMessages, type TemplateMessage } from '../../actors/gateway/tokenize/normalize.js';
import { CORPUS, TEMPLATE_CORPUS, type ParityCase } from './corpus.js';

interface PyResult { ids: number[]; sanitizedIds: number[]; text: string }

function normalized(c: ParityCase): TemplateMessage[] {
  return normalizeMessages(c.messages);
}

/** Model directories: the tiny model's, and one per other template (its tokenizer files, that template). */
const modelDirs = new Map<string | null, string>();
function modelDir(c: ParityCase): string {
  const template = c.template ?? null;
  let dir = modelDirs.get(template);
  if (dir !== undefined) return dir;
  if (template === null) dir = tinyModelDir();
  else {
    dir = mkdtempSync(join(tmpdir(), 'reef-parity-'));
    for (const f of ['tokenizer.json', 'tokenizer_config.json', 'config.json']) {
      if (existsSync(join(tinyModelDir(), f))) copyFileSync(join(tinyModelDir(), f), join(dir, f));
    }
    writeFileSync(join(dir, 'chat_template.jinja'), template);
  }
  modelDirs.set(template, dir);
  return dir;
}

/** Python is started once for the whole corpus: transformers takes seconds to import. */
function runPython(cases: ParityCase[]): Record<string, PyResult> {
  const input = JSON.stringify({
    modelDir: tinyModelDir(),
    cases: cases.map((c) => ({ id: c.id, modelDir: modelDir(c), messages: normalized(c), tools: c.tools, extra: c.extra ?? null })),
  });
  const proc = spawnSync(pythonBin(), [join(repoRoot(), 'test/parity/render.py')], { input, env: pythonEnv(), encoding: 'utf8', maxBuffer: 256 << 20, timeout: 120_000 });
  if (proc.status !== 0) throw new Error(`render.py failed (${proc.status}): ${proc.stderr}`);
  return (JSON.parse(proc.stdout) as { results: Record<string, PyResult> }).results;
}

describe('chat template parity with transformers', () => {
  let py: Record<string, PyResult>;
  const tokenizers = new Map<string, ChatTokenizer>();
  const tokenizer = (c: ParityCase): ChatTokenizer => {
    const dir = modelDir(c);
    let t = tokenizers.get(dir);
    if (t === undefined) tokenizers.set(dir, (t = ChatTokenizer.load(dir)));
    return t;
  };

  beforeAll(() => {
    py = runPython([...CORPUS, ...TEMPLATE_CORPUS]);
  });

  afterAll(() => {
    for (const [template, dir] of modelDirs) if (template !== null) rmSync(dir, { recursive: true, force: true });
  });

  it('has a corpus of at least 30 conversations', () => {
    expect(CORPUS.length).toBeGreaterThanOrEqual(30);
    expect(new Set([...CORPUS, ...TEMPLATE_CORPUS].map((c) => c.id)).size).toBe(CORPUS.length + TEMPLATE_CORPUS.length);
  });

  describe.each([...CORPUS, ...TEMPLATE_CORPUS].map((c) => [c.id, c] as const))('%s', (_id, c) => {
    it('renders the same text and ids as apply_chat_template', () => {
      const out = tokenizer(c).render(normalized(c), c.tools, { extra: c.extra ?? null, guard: false });
      expect(out.text).toBe(py[c.id]!.text);
      expect(Array.from(out.ids)).toEqual(py[c.id]!.ids);
    });

    it('guarded ids equal apply_chat_template(sanitize_control_tokens=True)', () => {
      const out = tokenizer(c).render(normalized(c), c.tools, { extra: c.extra ?? null });
      expect(Array.from(out.ids)).toEqual(py[c.id]!.sanitizedIds);
      expect(out.text).toBe(py[c.id]!.text.replaceAll('\u{F0000}', '').replaceAll('\u{F0001}', ''));
      if (!c.injection) expect(Array.from(out.ids)).toEqual(py[c.id]!.ids);
    });
  });

  it('a 30,000-character system prompt is thousands of ids', () => {
    expect(py['long-system-30k']!.ids.length).toBeGreaterThan(5_000);
  });
});
