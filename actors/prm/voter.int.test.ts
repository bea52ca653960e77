import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { parseVote, verdict } from '../../recipes/openclawrl/judge/votes.js';
import { tinyModelDir } from '../../cluster/paths.js';
import { startFakeEngine, type FakeEngine } from '../../test/helpers/fake-engine.js';
import { copyTinyModel } from '../../test/helpers/long-context-model.js';
import type { JudgeTurn } from '../judge/messages.js';
import { ChatTokenizer } from '../gateway/tokenize/index.js';
import { PrmClient } from './prm-client.js';
import type { PrmSettings } from './settings.js';
import { Semaphore, voteTurn } from './voter.js';

const engines: FakeEngine[] = [];
afterEach(async () => {
  for (const e of engines.splice(0)) await e.close();
  delete process.env.REEF_TEST_VOTER_KEY;
});

const turn: JudgeTurn = {
  turnRecordId: 'T1',
  nextStateRecordId: 'T2',
  scenario: 'default',
  sessionKey: 'tag:a',
  task: 'What is 2+2?',
  context: 'What is 2+2?',
  reply: '4',
  nextState: { role: 'user', content: 'Thanks!' },
};

function settings(url: string, over: Partial<PrmSettings> = {}): PrmSettings {
  return {
    mode: 'judge', urls: [url], api: 'sglang', tokenizerPath: tinyModelDir(), model: null, apiKeyEnv: null,
    m: 2, temperature: 0.6, maxTokens: 32, timeoutMs: 5000, concurrency: 2, maxHintCandidates: 3, stage: {} as never, ...over,
  };
}

describe('voteTurn with PrmClient', () => {
  it('makes m score and m hint calls, at most `concurrency` at once', async () => {
    let inFlight = 0;
    let most = 0;
    const engine = await startFakeEngine({
      respond: () => ({ pieces: ['\\boxed{1}'] }),
      delayMs: () => {
        most = Math.max(most, ++inFlight);
        setTimeout(() => inFlight--, 40);
        return 50;
      },
    });
    engines.push(engine);
    const prm = new PrmClient(settings(engine.url, { m: 3 }));
    const votes = await voteTurn(turn, prm, 3, new Semaphore(2), new AbortController().signal);
    await prm.close();
    expect(votes.scoreCalls).toEqual(Array(3).fill({ output: '\\boxed{1}', error: null }));
    expect(votes.hintCalls).toHaveLength(3);
    expect(engine.requests).toHaveLength(6);
    expect(most).toBeLessThanOrEqual(2);
    const rids = engine.requests.map((b) => String(b.rid));
    // One process mark on all of them, after the turn, kind and call.
    expect([...new Set(rids.map((r) => r.split('.')[1]))]).toEqual([expect.stringMatching(/^[0-9a-f]{8}$/)]);
    expect(rids.map((r) => r.split('.')[0]).sort()).toEqual(['T1-hint-0', 'T1-hint-1', 'T1-hint-2', 'T1-score-0', 'T1-score-1', 'T1-score-2']);
  });

  it('a call past prm_timeout_s, or answered with an error, is a failed vote with its reason', async () => {
    const engine = await startFakeEngine({ respond: () => ({ pieces: ['\\boxed{1}'] }), delayMs: (req) => (String(req.body.rid).includes('score') ? 10_000 : 0) });
    engines.push(engine);
    const prm = new PrmClient(settings(engine.url, { timeoutMs: 200 }));
    const votes = await voteTurn(turn, prm, 2, new Semaphore(4), new AbortController().signal);
    expect(votes.scoreCalls.every((c) => c.output === null && c.error!.startsWith('REEF_ERR_TIMEOUT'))).toBe(true);
    expect(votes.hintCalls.every((c) => c.output === '\\boxed{1}')).toBe(true);
    engine.options.failWith = 500;
    engine.options.delayMs = () => 0;
    const failed = await voteTurn(turn, prm, 1, new Semaphore(4), new AbortController().signal);
    expect(failed.scoreCalls[0]!.error).toMatch(/^REEF_ERR_ENGINE_FAILED: .*answered 500/);
    expect(failed.unreachable).toBe(false); // a 500 may be this prompt's: the worker tries the turn again before it judges it so
    // Overloaded or behind a proxy while it restarts: "not now", as unreachable as a refused connection.
    for (const status of [429, 503]) {
      engine.options.failWith = status;
      const busy = await voteTurn(turn, prm, 1, new Semaphore(4), new AbortController().signal);
      expect(busy.scoreCalls[0]!.error).toMatch(new RegExp(`^REEF_ERR_ENGINE_DOWN: .*answered ${status}`));
      expect(busy.unreachable).toBe(true);
    }
    await prm.close();
  });

  it('openai: model, key from the named variable; a missing key stops start-up', async () => {
    const engine = await startFakeEngine({ respond: () => ({ pieces: ['ok \\boxed{-1}'] }) });
    engines.push(engine);
    const s = settings(engine.url, { api: 'openai', model: 'judge-model', apiKeyEnv: 'REEF_TEST_VOTER_KEY', tokenizerPath: null });
    expect(() => new PrmClient(s)).toThrow(/environment variable REEF_TEST_VOTER_KEY \(pipeline\.record2record\.config\.prm_api_key_env\) is not set/);
    // The stack's own PRM engines: the schema did not ask for the variable.
    expect(() => new PrmClient({ ...s, apiKeyEnv: null })).toThrow(/pipeline\.record2record\.config\.prm_api openai needs pipeline\.record2record\.config\.prm_api_key_env/);
    process.env.REEF_TEST_VOTER_KEY = 'k';
    const prm = new PrmClient(s);
    const votes = await voteTurn(turn, prm, 1, new Semaphore(1), new AbortController().signal);
    await prm.close();
    expect(votes.scoreCalls).toEqual([{ output: 'ok \\boxed{-1}', error: null }]);
    expect(engine.requests[0]).toMatchObject({ model: 'judge-model', temperature: 0.6, max_tokens: 32, messages: [{ role: 'user' }] });
  });
  it("reef.redaction: an external PRM's prompt has the e-mail, phone, card and key masked; the stack's own PRM (sglang) gets it whole under apply_to openai", async () => {
    const engine = await startFakeEngine({ respond: () => ({ pieces: ['\\boxed{1}'] }) });
    engines.push(engine);
    process.env.REEF_TEST_VOTER_KEY = 'k';
    const secret = { ...turn, nextState: { role: 'user' as const, content: 'mail jane@example.com, call +1 415 555 0142, card 4111 1111 1111 1111, key sk-proj-Ab3dEf6hIj9kLm2nOp5q' } };
    const redaction = { builtin: ['email', 'phone', 'card', 'api_key'] as const, patterns: [], applyTo: 'openai' as const };
    const external = new PrmClient(settings(engine.url, { api: 'openai', model: 'judge-model', apiKeyEnv: 'REEF_TEST_VOTER_KEY', tokenizerPath: null, redaction }));
    await voteTurn(secret, external, 1, new Semaphore(1), new AbortController().signal);
    await external.close();
    const sent = JSON.stringify(engine.requests.map((r) => r.messages));
    expect(sent).toContain('mail [EMAIL], call [PHONE], card [CARD], key [API_KEY]');
    for (const s of ['jane@example.com', '555 0142', '4111', 'sk-proj']) expect(sent).not.toContain(s);
    const own = new PrmClient(settings(engine.url, { redaction }));
    const n = engine.requests.length;
    await voteTurn(secret, own, 1, new Semaphore(1), new AbortController().signal);
    await own.close();
    // The sglang path sends token ids: the masks would be in the ids, the address is not masked.
    expect(engine.requests.slice(n).every((r) => Array.isArray(r.input_ids))).toBe(true);
    const tok = ChatTokenizer.load(tinyModelDir());
    expect(tok.decode(engine.requests[n]!.input_ids as number[])).toContain('jane@example.com');
  });

  it('sglang: a template that opens <think> in the prompt has the reply read as continuing it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'reef-prm-think-'));
    try {
      const model = copyTinyModel(join(dir, 'model'));
      const template = join(model, 'chat_template.jinja');
      const text = readFileSync(template, 'utf8');
      const opened = text.replace("{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}", "{{- '<|im_start|>assistant\\n<think>\\n' -}}\n{%- endif -%}");
      expect(opened).not.toBe(text);
      writeFileSync(template, opened);
      // Cut off at max_new_tokens while weighing the verdicts: no answer yet, so no vote.
      const cut = 'The user thanked the assistant. I answer \\boxed{1} if accepted, \\boxed{0} if I cannot tell';
      const engine = await startFakeEngine({ respond: (req) => ({ pieces: [String(req.body.rid).split('.')[0]!.endsWith('-0') ? cut : 'Accepted.\n</think>\n\\boxed{1}'] }) });
      engines.push(engine);
      const plain = new PrmClient(settings(engine.url));
      const thinking = new PrmClient(settings(engine.url, { tokenizerPath: model }));
      const before = await voteTurn(turn, plain, 2, new Semaphore(4), new AbortController().signal);
      const votes = await voteTurn(turn, thinking, 2, new Semaphore(4), new AbortController().signal);
      await plain.close();
      await thinking.close();
      expect(before.scoreCalls.map((c) => c.output)).toEqual([cut, 'Accepted.\n</think>\n\\boxed{1}']);
      expect(votes.scoreCalls.map((c) => c.output)).toEqual([`<think>${cut}`, '<think>Accepted.\n</think>\n\\boxed{1}']);
      expect(votes.scoreCalls.map((c) => parseVote(c.output))).toEqual([null, 1]);
      expect(verdict(votes.scoreCalls, votes.hintCalls, 3)).toMatchObject({ votesOk: 4, votesInvalid: 2 });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it('openai: a reply cut off in its reasoning (content null, reasoning_content) is a reply without a verdict, not a failed call', async () => {
    const messages = [
      { role: 'assistant', content: null, reasoning_content: 'The user thanked the assistant, so \\boxed{1} if' },
      { role: 'assistant', content: null, reasoning: 'Still weighing \\boxed{0}' },
      { role: 'assistant', content: null },
    ];
    let n = 0;
    const server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ choices: [{ index: 0, message: messages[n++ % messages.length], finish_reason: 'length' }] }));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    process.env.REEF_TEST_VOTER_KEY = 'k';
    const prm = new PrmClient(settings(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { api: 'openai', model: 'm', apiKeyEnv: 'REEF_TEST_VOTER_KEY', tokenizerPath: null }));
    try {
      const results = [];
      for (let i = 0; i < 3; i++) results.push(await prm.call('judge this', { rid: `r${i}` }).then((r) => r.text, (err: Error) => err.message));
      expect(results[0]).toBe('<think>The user thanked the assistant, so \\boxed{1} if');
      expect(results[1]).toBe('<think>Still weighing \\boxed{0}');
      expect(results.slice(0, 2).map(parseVote)).toEqual([null, null]);
      expect(results[2]).toMatch(/reply has no text/);
    } finally {
      await prm.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
  it('a call an engine of several is down for, or turns away, goes on to the next engine', async () => {
    const up = await startFakeEngine({ respond: () => ({ pieces: ['\\boxed{1}'] }) });
    const busy = await startFakeEngine({ respond: () => ({ pieces: ['\\boxed{1}'] }), failWith: 503 });
    const gone = await startFakeEngine({ respond: () => ({ pieces: ['\\boxed{1}'] }) });
    engines.push(up, busy);
    await gone.close();
    const prm = new PrmClient(settings(up.url, { urls: [gone.url, busy.url, up.url] }));
    const votes = await voteTurn(turn, prm, 3, new Semaphore(6), new AbortController().signal);
    expect([...votes.scoreCalls, ...votes.hintCalls]).toEqual(Array(6).fill({ output: '\\boxed{1}', error: null }));
    expect(votes.url).toBe(up.url);
    // An engine that answers with an error is a failed vote, not one to go around.
    up.options.failWith = 500;
    const failed = await voteTurn(turn, prm, 1, new Semaphore(2), new AbortController().signal);
    expect(failed.scoreCalls[0]!.error).toMatch(/^REEF_ERR_ENGINE_FAILED: .*answered 500/);
    // Every engine down: the call fails as unreachable.
    up.options.failWith = 503;
    const down = await voteTurn(turn, prm, 1, new Semaphore(2), new AbortController().signal);
    expect(down.unreachable).toBe(true);
    await prm.close();
  });
});
