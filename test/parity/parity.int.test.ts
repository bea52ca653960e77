import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pythonBin, pythonEnv, repoRoot, smolModelDir, tinyModelDir } from '../../cluster/paths.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/chat-tokenizer.js';
import { normalizeMessages, type TemplateMessage } from '../../actors/gateway/tokenize/normalize.js';
import { CORPUS, SMOL_CORPUS, TEMPLATE_CORPUS, type ParityCase } from './corpus.js';

type PyResult = { ids: number[]; sanitizedIds: number[]; text: string } | { error: string };

/**
 * The models the corpus is rendered with: the tiny model (its template, and other templates over
 * its tokenizer), and SmolLM2-135M-Instruct, a real pretrained model (built by scripts/setup.sh;
 * its suite is skipped, saying so, only where that directory is absent).
 */
interface Suite {
  name: string;
  dir: string;
  cases: ParityCase[];
  /**
   * Cases whose template raises in Python (for SmolLM2: `message['content']` of an assistant turn
   * with tool calls and no content); the gateway must refuse them too, not render something else.
   */
  refused: string[];
  /** How many control tokens the template itself writes for these messages, where known: a guarded render has no others. */
  templateControlTokens: ((messages: TemplateMessage[]) => number) | null;
}

const SUITES: Suite[] = [
  { name: 'tiny model', dir: tinyModelDir(), cases: [...CORPUS, ...TEMPLATE_CORPUS], refused: [], templateControlTokens: null },
  {
    name: 'SmolLM2-135M-Instruct', dir: smolModelDir(), cases: [...CORPUS, ...SMOL_CORPUS],
    refused: ['tool-call-string-args', 'parallel-tool-calls', 'mixed-args-forms', 'reasoning-with-tools', 'openclaw-shaped', 'tool-json-content', 'tool-schema-small-floats'],
    // <|im_start|> and <|im_end|> around each message, the default system prompt, the generation prompt.
    templateControlTokens: (m) => 2 * m.length + (m[0]?.role === 'system' ? 0 : 2) + 1,
  },
];
const present = SUITES.filter((s) => existsSync(join(s.dir, 'tokenizer.json')));

function normalized(c: ParityCase): TemplateMessage[] {
  return normalizeMessages(c.messages);
}

/** Model directories: the suite's own, and one per other template (its tokenizer files, that template). */
const modelDirs = new Map<string, string>();
const scratchDirs: string[] = [];
function modelDir(suite: Suite, c: ParityCase): string {
  if (c.template === undefined) return suite.dir;
  const key = `${suite.dir}\0${c.template}`;
  let dir = modelDirs.get(key);
  if (dir !== undefined) return dir;
  dir = mkdtempSync(join(tmpdir(), 'reef-parity-'));
  scratchDirs.push(dir);
  for (const f of ['tokenizer.json', 'tokenizer_config.json', 'config.json']) {
    if (existsSync(join(suite.dir, f))) copyFileSync(join(suite.dir, f), join(dir, f));
  }
  writeFileSync(join(dir, 'chat_template.jinja'), c.template);
  modelDirs.set(key, dir);
  return dir;
}

const key = (suite: Suite, c: ParityCase): string => `${suite.name}/${c.id}`;

/** Python is started once for every suite: transformers takes seconds to import. */
function runPython(suites: Suite[]): Record<string, PyResult> {
  const input = JSON.stringify({
    modelDir: tinyModelDir(),
    cases: suites.flatMap((s) => s.cases.map((c) => ({ id: key(s, c), modelDir: modelDir(s, c), messages: normalized(c), tools: c.tools, extra: c.extra ?? null }))),
  });
  const proc = spawnSync(pythonBin(), [join(repoRoot(), 'test/parity/render.py')], { input, env: pythonEnv(), encoding: 'utf8', maxBuffer: 256 << 20, timeout: 180_000 });
  if (proc.status !== 0) throw new Error(`render.py failed (${proc.status}): ${proc.stderr}`);
  return (JSON.parse(proc.stdout) as { results: Record<string, PyResult> }).results;
}

describe('chat template parity with transformers', () => {
  let py: Record<string, PyResult>;
  const tokenizers = new Map<string, ChatTokenizer>();
  const tokenizer = (suite: Suite, c: ParityCase): ChatTokenizer => {
    const dir = modelDir(suite, c);
    let t = tokenizers.get(dir);
    if (t === undefined) tokenizers.set(dir, (t = ChatTokenizer.load(dir)));
    return t;
  };

  beforeAll(() => {
    py = runPython(present);
  });

  afterAll(() => {
    for (const dir of scratchDirs) rmSync(dir, { recursive: true, force: true });
  });

  it('has a corpus of at least 30 conversations', () => {
    expect(CORPUS.length).toBeGreaterThanOrEqual(30);
    const ids = [...CORPUS, ...TEMPLATE_CORPUS, ...SMOL_CORPUS].map((c) => c.id);
    expect(new Set(ids).size).toBe(ids.length);
  });

  for (const suite of SUITES) {
    const absent = !present.includes(suite);
    describe.skipIf(absent)(absent ? `${suite.name} (skipped: ${suite.dir} is absent; scripts/setup.sh builds it)` : suite.name, () => {
      const result = (c: ParityCase): PyResult => {
        const r = py[key(suite, c)];
        if (r === undefined) throw new Error(`no Python result for ${key(suite, c)}`);
        return r;
      };

      it('Python refuses exactly the cases listed as refused', () => {
        expect(suite.cases.filter((c) => 'error' in result(c)).map((c) => c.id)).toEqual(suite.refused);
      });

      describe.each(suite.cases.map((c) => [c.id, c] as const))('%s', (_id, c) => {
        it('renders the same text and ids as apply_chat_template', () => {
          const want = result(c);
          const render = () => tokenizer(suite, c).render(normalized(c), c.tools, { extra: c.extra ?? null, guard: false });
          if ('error' in want) {
            expect(render).toThrow(expect.objectContaining({ code: 'REEF_ERR_CHAT_TEMPLATE' }));
            return;
          }
          const out = render();
          expect(out.text).toBe(want.text);
          expect(Array.from(out.ids)).toEqual(want.ids);
        });

        it('guarded ids equal apply_chat_template(sanitize_control_tokens=True)', () => {
          const want = result(c);
          const render = () => tokenizer(suite, c).render(normalized(c), c.tools, { extra: c.extra ?? null });
          if ('error' in want) {
            expect(render).toThrow(expect.objectContaining({ code: 'REEF_ERR_CHAT_TEMPLATE' }));
            return;
          }
          const out = render();
          expect(Array.from(out.ids)).toEqual(want.sanitizedIds);
          expect(out.text).toBe(want.text.replaceAll('\u{F0000}', '').replaceAll('\u{F0001}', ''));
          if (!c.injection) expect(Array.from(out.ids)).toEqual(want.ids);
        });
      });

      if (suite.templateControlTokens !== null) it('guarded renders hold only the control tokens the template writes', () => {
        let checked = 0;
        for (const c of suite.cases) {
          if ('error' in result(c)) continue;
          const tok = tokenizer(suite, c);
          const control = new Set(tok.files.addedTokens.filter((t) => t.special).map((t) => t.id));
          const ids = Array.from(tok.render(normalized(c), c.tools, { extra: c.extra ?? null }).ids);
          expect([c.id, ids.filter((id) => control.has(id)).length]).toEqual([c.id, suite.templateControlTokens!(normalized(c))]);
          checked++;
        }
        expect(checked).toBeGreaterThan(30);
      });

      it('a 30,000-character system prompt is thousands of ids', () => {
        const r = result(suite.cases.find((c) => c.id === 'long-system-30k')!);
        expect('ids' in r && r.ids.length).toBeGreaterThan(5_000);
      });
    });
  }
});
