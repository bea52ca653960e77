import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { releaseBody } from '../../../cluster/generate-body.js';
import { distEntry, repoRoot, tinyModelDir } from '../../../cluster/paths.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import { prepareChat } from './prepare.js';
import { defaultTokenizerThreads, TokenizerPool } from './pool.js';

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

  const turn = (n: number) => [
    { role: 'system', content: 'A long system prompt. '.repeat(100) },
    ...Array.from({ length: n }, (_, i) => [{ role: 'user', content: `question ${i}` }, { role: 'assistant', content: `answer ${i}` }]).flat(),
    { role: 'user', content: 'next' },
  ];
  const body = (messages: unknown[], extra: Record<string, unknown> = {}) => Buffer.from(JSON.stringify({ messages, stream: true, ...extra }));
  const params = { rid: '01JAAAAAAAAAAAAAAAAAAAAAAA', topK: 4, defaultMaxTokens: 16 };

  it('prepares in workers exactly as in-process: the same ids and engine body', async () => {
    const results = await Promise.all([0, 1, 2, 3].map((n) => pool.prepare(body(turn(n)), { ...params, sessionKey: null })));
    results.forEach((r, n) => {
      const want = prepareChat(local, body(turn(n)), params);
      if (!r.ok || !want.ok) throw new Error(`refused: ${JSON.stringify(r)}`);
      expect(r.promptIds).toBeInstanceOf(Int32Array);
      expect(Array.from(r.promptIds)).toEqual(Array.from(want.promptIds));
      expect(Buffer.from(r.engineBody).equals(Buffer.from(want.engineBody))).toBe(true);
      expect(r).toMatchObject({ stream: true, includeUsage: false, model: null, startsInThinking: false });
    });
    expect(pool.contextLength).toBe(4096);
  });

  it('a session\'s turns, each built on the last one\'s body and id text, still send exactly their own ids', async () => {
    // The worker keeps each turn's prompt ids and body text for the next turn while the event
    // loop holds them too: nothing may be moved away from it or changed on either side.
    const held: Array<{ got: { promptIds: Int32Array; engineBody: Uint8Array }; ids: number[]; body: Buffer }> = [];
    for (let n = 0; n < 6; n++) {
      const r = await pool.prepare(body(turn(n)), { ...params, sessionKey: 'session-ids' });
      if (!r.ok) throw new Error(r.message);
      const sent = JSON.parse(Buffer.from(r.engineBody).toString('utf8')) as { input_ids: number[] };
      expect(sent.input_ids).toEqual(Array.from(r.promptIds));
      expect(sent.input_ids).toEqual(Array.from(local.render(turn(n).map((m) => ({ ...m })), null).ids));
      held.push({ got: r, ids: Array.from(r.promptIds), body: Buffer.from(r.engineBody) });
    }
    // What each turn handed over is unchanged after the turns built on it.
    for (const h of held) {
      expect(Array.from(h.got.promptIds)).toEqual(h.ids);
      expect(Buffer.from(h.got.engineBody).equals(h.body)).toBe(true);
    }
  });

  it('with each body\'s lease ended after use, as the gateway does, a session\'s next bodies are written in place and are still exactly their own', async () => {
    let previous: Int32Array | null = null;
    let inPlace = 0;
    for (let n = 0; n < 8; n++) {
      const r = await pool.prepare(body(turn(n)), { ...params, sessionKey: 'session-lease' });
      if (!r.ok) throw new Error(r.message);
      const sent = JSON.parse(Buffer.from(r.engineBody).toString('utf8')) as { input_ids: number[] };
      expect(sent.input_ids).toEqual(Array.from(local.render(turn(n).map((m) => ({ ...m })), null).ids));
      expect(r.bodyLease).not.toBeNull();
      // The last lease, ended below, is held again only if this body took over its memory.
      if (previous !== null && Atomics.load(previous, 0) === 1) inPlace++;
      releaseBody(r.bodyLease);
      previous = r.bodyLease;
    }
    expect(inPlace).toBeGreaterThan(3);
  });

  it('a worker that dies fails what it had not answered, and its replacement serves the next request', async () => {
    const lonely = await TokenizerPool.create(tinyModelDir(), { threads: 1 });
    try {
      const big = body(turn(40));
      const failed = expect(lonely.prepare(big, { ...params, sessionKey: 'doomed' })).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED', status: 503 });
      const worker = (lonely as unknown as { workers: Array<{ threads: Array<{ terminate(): Promise<number> }> }> }).workers[0]!.threads[0]!;
      await worker.terminate();
      await failed;
      const next = await lonely.prepare(body(turn(1)), { ...params, sessionKey: 'doomed' });
      if (!next.ok) throw new Error(next.message);
      expect(Array.from(next.promptIds)).toEqual(Array.from(local.render(turn(1).map((m) => ({ ...m })), null).ids));
    } finally {
      await lonely.close();
    }
  });

  it('routes one session to one worker, where its earlier pieces hit the cache and its earlier body and render are extended', async () => {
    const before = await pool.stats();
    for (let n = 5; n < 9; n++) await pool.prepare(body(turn(n)), { ...params, sessionKey: 'session-a' });
    const after = await pool.stats();
    const rendered = after.map((s, i) => s.renders - before[i]!.renders);
    expect([...rendered].sort()).toEqual([0, 4]);
    const busy = rendered.indexOf(4);
    expect(after[busy]!.cache.hits).toBeGreaterThan(before[busy]!.cache.hits);
    // Remembering a body happens after the worker has answered; the next turn finds it all the same.
    expect(after[busy]!.bodies.extended - before[busy]!.bodies.extended).toBeGreaterThanOrEqual(3);
    expect(after[busy]!.reuse.renders - before[busy]!.reuse.renders).toBeGreaterThanOrEqual(3);
  });

  it('decodes, and answers a refused request with its error code and message', async () => {
    const r = await pool.prepare(body(turn(0)), { ...params, sessionKey: null });
    if (!r.ok) throw new Error('refused');
    expect(await pool.decode(r.promptIds)).toBe(local.decode(r.promptIds));
    expect(await pool.prepare(Buffer.from('{"messages": ['), { ...params, sessionKey: null })).toMatchObject({ ok: false, code: 'REEF_ERR_BODY', message: expect.stringMatching(/not valid JSON/) });
    expect(await pool.prepare(body(turn(0), { max_tokens: 5000 }), { ...params, sessionKey: null })).toMatchObject({ ok: false, code: 'REEF_ERR_CONTEXT_LENGTH', message: expect.stringMatching(/maximum context length is 4096 tokens/) });
  });

  it('defaults to one worker per core beyond the event loop\'s, from 1 to 4', () => {
    expect([1, 2, 3, 5, 8, 64].map((cores) => defaultTokenizerThreads(cores))).toEqual([1, 1, 2, 4, 4, 4]);
  });

  it('keeps a process alive while a request waits on a worker, and not once it is idle', () => {
    // Nothing else holds this script's event loop: the waiting request must, and the idle pool
    // must not (the script ends without closing it).
    const script = `
      const { TokenizerPool } = await import(${JSON.stringify(distEntry('actors/gateway/tokenize/pool'))});
      const pool = await TokenizerPool.create(${JSON.stringify(tinyModelDir())}, { threads: 1 });
      const r = await pool.prepare(Buffer.from(JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] })), { rid: '01JAAAAAAAAAAAAAAAAAAAAAAA', topK: 4, defaultMaxTokens: 4, sessionKey: 's' });
      console.log('prepared', r.ok, r.promptIds.length > 0);`;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
    expect(out.trim()).toBe('prepared true true');
  });

  it('refuses work after close, and close is idempotent', async () => {
    const p = await TokenizerPool.create(tinyModelDir(), { threads: 1 });
    await p.close();
    await p.close();
    await expect(p.prepare(body(turn(0)), { ...params, sessionKey: null })).rejects.toMatchObject({ code: 'REEF_ERR_ACTOR_CLOSED' });
  });
});
