import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { distEntry, repoRoot, tinyModelDir } from '../../../cluster/paths.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import { normalizeMessages } from './normalize.js';
import { TokenizerPool } from './pool.js';

/** Worker threads run the compiled worker: rebuild dist/ when it is older than these sources. */
function ensureBuilt(): void {
  const here = dirname(fileURLToPath(import.meta.url));
  const worker = distEntry('actors/gateway/tokenize/worker');
  const newest = Math.max(...readdirSync(here).filter((f) => f.endsWith('.ts')).map((f) => statSync(join(here, f)).mtimeMs));
  if (existsSync(worker) && statSync(worker).mtimeMs >= newest) return;
  try {
    execFileSync(join(repoRoot(), 'node_modules/.bin/tsc'), ['-p', 'tsconfig.json'], { cwd: repoRoot(), stdio: 'pipe' });
  } catch {
    // tsc emits even when other parts of the tree fail to typecheck; only the worker matters here.
  }
  if (!existsSync(worker)) throw new Error(`build did not produce ${worker}`);
}

describe('TokenizerPool', () => {
  let pool: TokenizerPool;
  let local: ChatTokenizer;

  beforeAll(async () => {
    ensureBuilt();
    pool = await TokenizerPool.create(tinyModelDir(), { threads: 2 });
    local = ChatTokenizer.load(tinyModelDir());
  });
  afterAll(async () => {
    await pool?.close();
  });

  const turn = (n: number) => normalizeMessages([
    { role: 'system', content: 'A long system prompt. '.repeat(100) },
    ...Array.from({ length: n }, (_, i) => [{ role: 'user', content: `question ${i}` }, { role: 'assistant', content: `answer ${i}` }]).flat(),
    { role: 'user', content: 'next' },
  ]);

  it('renders in workers with the same ids as in-process', async () => {
    const results = await Promise.all([0, 1, 2, 3].map((n) => pool.render(turn(n), null)));
    results.forEach((r, n) => {
      expect(r.ids).toBeInstanceOf(Int32Array);
      expect(Array.from(r.ids)).toEqual(Array.from(local.render(turn(n), null).ids));
      expect(r.text).toBe(local.render(turn(n), null).text);
    });
    expect(pool.contextLength).toBe(4096);
  });

  it('routes one session to one worker, where its earlier pieces hit the cache', async () => {
    const before = await pool.stats();
    for (let n = 5; n < 9; n++) await pool.render(turn(n), null, { sessionKey: 'session-a' });
    const after = await pool.stats();
    const rendered = after.map((s, i) => s.renders - before[i]!.renders);
    expect([...rendered].sort()).toEqual([0, 4]);
    const busy = rendered.indexOf(4);
    expect(after[busy]!.cache.hits).toBeGreaterThan(before[busy]!.cache.hits);
  });

  it('decodes, and reports template errors with their code', async () => {
    const r = await pool.render(turn(0), null);
    expect(await pool.decode(r.ids)).toBe(r.text);
    await expect(pool.render(normalizeMessages([{ role: 'user', content: 'x' }]), null, { extra: { messages: 5 } })).rejects.toMatchObject({ code: 'REEF_ERR_CHAT_TEMPLATE' });
  });

  it('refuses work after close, and close is idempotent', async () => {
    const p = await TokenizerPool.create(tinyModelDir(), { threads: 1 });
    await p.close();
    await p.close();
    await expect(p.render(turn(0), null)).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED' });
  });
});
