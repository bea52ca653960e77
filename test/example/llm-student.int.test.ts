import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ReefError } from '../../actors/runtime/errors.js';
import { generateProblems } from '../../recipes/openclawrl/harness/problems.js';
import { DONE, LlmStudent, STUDENT_SYSTEM_PROMPT } from '../../recipes/openclawrl/harness/student.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';

/** The LLM student over HTTP against the engine double's OpenAI route, and against a server that never answers. */

type Msg = { role: string; content: string };
const problem = generateProblems(1)[0]!;

describe('LLM student', () => {
  let engine: FakeEngine;
  let silent: Server;
  let silentUrl: string;

  beforeAll(async () => {
    engine = await startFakeEngine({
      respond: ({ messages }) => {
        const last = (messages as Msg[]).at(-1)!;
        if (last.role === 'user' && last.content.startsWith('(Start the chat')) return { pieces: ['<think>be casual</think>', 'hi, can you help me with this?'] };
        if (last.content.includes('**')) return { pieces: ['no bold please, rewrite it'] };
        if (last.content.includes('saved your homework')) return { pieces: [DONE] };
        return { pieces: ['great, please save it'] };
      },
    });
    silent = createServer(() => {});
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    silentUrl = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
  });

  afterAll(async () => {
    await engine?.close();
    silent?.closeAllConnections();
    await new Promise<void>((r) => silent.close(() => r()));
  });

  it('sees the conversation from its side and ends with HOMEWORK_DONE after the save', async () => {
    const student = new LlmStudent({ url: engine.url, model: 'student' });
    const s = student.begin(problem, 1);
    expect(await s.opening()).toBe('hi, can you help me with this?');
    expect(await s.respond({ reply: 'The answer is **17**.', saved: false })).toEqual({ text: 'no bold please, rewrite it', done: false });
    expect(await s.respond({ reply: 'It is 17.', saved: false })).toEqual({ text: 'great, please save it', done: false });
    expect(await s.respond({ reply: 'Saved.', saved: true })).toEqual({ text: DONE, done: true });
    const last = engine.requests.at(-1)!;
    const msgs = last.messages as Msg[];
    expect(last.model).toBe('student');
    expect(msgs[0]).toEqual({ role: 'system', content: STUDENT_SYSTEM_PROMPT });
    expect(msgs[1]!.content).toContain(problem.question);
    // Its own messages are the assistant's; the agent's replies are the user's.
    expect(msgs.slice(2).map((m) => m.role)).toEqual(['assistant', 'user', 'assistant', 'user', 'assistant', 'user']);
    expect(msgs[2]!.content).toBe('hi, can you help me with this?');
    expect(msgs[3]!.content).toBe('The answer is **17**.');
    expect(msgs.at(-1)!.content).toMatch(/^Saved\.\n\n\(The helper saved your homework/);
  });

  it('fails a turn that takes longer than its timeout with REEF_ERR_TIMEOUT', async () => {
    const student = new LlmStudent({ url: silentUrl, model: 'student', timeoutMs: 300 });
    const err = await student.begin(problem, 1).opening().catch((e: unknown) => e);
    expect((err as ReefError).code).toBe('REEF_ERR_TIMEOUT');
  });
});
