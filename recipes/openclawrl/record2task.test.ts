import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tinyModelDir } from '../../cluster/paths.js';
import { requestOfChatBody } from '../../actors/gateway/store/rows.js';
import type { AgentRecord } from '../../actors/gateway/store/types.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/chat-tokenizer.js';
import { prepareChat, renderChat } from '../../actors/gateway/tokenize/prepare.js';
import { copyTinyModel } from '../../test/helpers/long-context-model.js';
import { HINT_MARKER, isStale, lastUserIndex, recordToTask, releaseLineage, teacherPrompts, withHint } from './record2task.js';

function record(messages: unknown[], params: Record<string, unknown> = {}): AgentRecord {
  return {
    id: 'R1', offset: 1, scenario: 's', tags: {}, status: 'ok', startedAt: 0, finishedAt: 1,
    request: { messages, tools: null, params }, topK: 2, finishReason: 'stop',
    usage: { promptTokens: 3, completionTokens: 2 }, weightVersion: 'v3', engine: 'hf', latencyMs: 1, error: null, response: null,
    promptIds: Int32Array.from([1, 2, 3]), outputIds: Int32Array.from([7, 8]), logprobs: Float32Array.from([-0.5, -0.25]),
    topkIds: Int32Array.from([7, 9, 8, 10]), topkLogprobs: Float32Array.from([-0.5, -1, -0.25, -2]),
  };
}

/** A renderer that records what it was asked to render and returns the text's char codes. */
function recorder() {
  const seen: unknown[][] = [];
  const render = async (messages: unknown[]) => {
    seen.push(messages);
    const last = messages[lastUserIndex(messages)] as { content: string };
    return Int32Array.from([...last.content].map((c) => c.codePointAt(0)!));
  };
  return { seen, render };
}

describe('record2task', () => {
  const msgs = [
    { role: 'system', content: 'helper' },
    { role: 'user', content: 'solve 2+2' },
    { role: 'assistant', content: '**4**' },
    { role: 'user', content: [{ type: 'text', text: 'no bold ' }, { type: 'text', text: 'please' }] },
  ];

  it('appends each hint to the last user message after a blank line and the marker line', async () => {
    const { seen, render } = recorder();
    const prompts = await teacherPrompts(record(msgs), ['Use plain text.', 'Show steps.'], render);
    expect(prompts).toHaveLength(2);
    expect((seen[0]![3] as { content: string }).content).toBe(`no bold please\n\n${HINT_MARKER}\nUse plain text.`);
    expect((seen[1]![3] as { content: string }).content).toBe(withHint('no bold please', 'Show steps.'));
    // Earlier messages are untouched.
    expect(seen[0]!.slice(0, 3)).toEqual(msgs.slice(0, 3));
  });

  describe('teacher prompts of a real template', () => {
    const parent = mkdtempSync(join(tmpdir(), 'reef-teacher-'));
    afterAll(() => rmSync(parent, { recursive: true, force: true }));
    // Templates that test `tools is not none` (Llama 3's, header_turns in template-compiler.test.ts)
    // open a tools section for an empty list; the gateway renders an empty list as none.
    const dir = copyTinyModel(join(parent, 'tools-not-none'));
    const path = join(dir, 'chat_template.jinja');
    writeFileSync(path, readFileSync(path, 'utf8').replace('{%- if tools is defined and tools is not none and tools | length > 0 -%}', '{%- if tools is not none -%}'));
    const tok = ChatTokenizer.load(dir);
    // What the trainer-controller wires as its renderTeacher (actors/trainer-controller/index.ts).
    const render = async (messages: unknown[], tools: readonly unknown[] | null, extra: Record<string, unknown> | null) => renderChat(tok, messages, tools, { addGenerationPrompt: true, extra }).ids;

    it.each([
      ['an empty tool list', []],
      ['no tool list', null],
      ['tools', [{ type: 'function', function: { name: 'f', parameters: { type: 'object' }, description: 'd' } }]],
    ])('with %s, the teacher prompt is the student prompt of the same body with the hint in it', async (_what, tools) => {
      const body = (content: string) => JSON.stringify({ messages: [{ role: 'system', content: 'sys' }, { role: 'user', content }], tools });
      const prepare = (json: string) => {
        const out = prepareChat(tok, Buffer.from(json), { rid: 'r', topK: 2, defaultMaxTokens: 4 });
        if (!out.ok) throw new Error(out.message);
        return out.promptIds;
      };
      const rec = { ...record([]), request: requestOfChatBody(body('hi')), promptIds: prepare(body('hi')) };
      const [teacher] = await teacherPrompts(rec, ['be brief'], render);
      expect(tok.decode(teacher!)).toBe(tok.decode(prepare(body(withHint('hi', 'be brief')))));
      expect(Array.from(teacher!)).toEqual(Array.from(prepare(body(withHint('hi', 'be brief')))));
    });
  });

  it('renders a teacher prompt with the chat template variables the turn was rendered with', async () => {
    const seen: unknown[] = [];
    const render = async (_m: unknown[], _t: readonly unknown[] | null, kwargs: Record<string, unknown> | null) => {
      seen.push(kwargs);
      return Int32Array.from([1]);
    };
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], chat_template_kwargs: { enable_thinking: false } });
    await teacherPrompts({ ...record([]), request: requestOfChatBody(body) }, ['be brief'], render);
    await teacherPrompts({ ...record([]), request: requestOfChatBody(JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] })) }, ['be brief'], render);
    expect(seen).toEqual([{ enable_thinking: false }, null]);
  });

  it('a request without a user message keeps every hint, in its last message', async () => {
    const seen: unknown[][] = [];
    const render = async (messages: unknown[]) => {
      seen.push(messages);
      return Int32Array.from([seen.length]);
    };
    const noUser = [{ role: 'system', content: 'sys' }, { role: 'tool', content: 'out', tool_call_id: 'c1' }];
    const prompts = await teacherPrompts(record(noUser), ['Use plain text.', 'Show steps.'], render);
    expect(prompts.map((p) => Array.from(p))).toEqual([[1], [2]]);
    expect(seen.map((m) => (m[1] as { content: string }).content)).toEqual([withHint('out', 'Use plain text.'), withHint('out', 'Show steps.')]);
    expect(seen[0]![0]).toEqual(noUser[0]);
  });

  it('uses the plain prompt as the only teacher candidate of an anchor-only turn', async () => {
    const { seen, render } = recorder();
    const r = record(msgs);
    expect(await teacherPrompts(r, [], render)).toEqual([r.promptIds]);
    expect(seen).toEqual([]);
  });

  it('carries the recorded tokens, logprobs, top-K, reward, sampling and version', async () => {
    const task = await recordToTask({ record: record(msgs, { temperature: 0.7 }), reward: -1, hints: [] }, recorder().render);
    expect(Array.from(task.responseIds)).toEqual([7, 8]);
    expect(Array.from(task.topkIds)).toEqual([7, 9, 8, 10]);
    expect(task).toMatchObject({ taskId: 'R1', reward: -1, topK: 2, weightVersion: 'v3', sampling: { temperature: 0.7, topP: 1, topK: -1 } });
  });

  it('trains under the distribution the engine was sent: the sampling of prepareChat\'s engine body, top_k included', async () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const bodies = [
      { temperature: 0.6, top_k: 20 },
      { temperature: 0, top_p: 0.9, top_k: 1 },
      { top_k: -1 },
      { top_k: null, top_p: null, temperature: null },
      {},
    ];
    for (const extra of bodies) {
      const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...extra });
      const out = prepareChat(tok, Buffer.from(body), { rid: 'r', topK: 2, defaultMaxTokens: 4 });
      if (!out.ok) throw new Error(out.message);
      const sent = (JSON.parse(Buffer.from(out.engineBody).toString('utf8')) as { sampling_params: Record<string, number> }).sampling_params;
      const task = await recordToTask({ record: { ...record(msgs), request: requestOfChatBody(body) }, reward: 1, hints: [] }, recorder().render);
      expect(task.sampling, body).toEqual({ temperature: sent.temperature, topP: sent.top_p, topK: sent.top_k ?? -1 });
    }
  });

  it('a record stored before top_k was checked trains with top-k off, as its engine sampled', async () => {
    for (const topK of [0, -5, 2.5, '20', true]) {
      const task = await recordToTask({ record: record(msgs, { temperature: 0.6, top_k: topK }), reward: 1, hints: [] }, recorder().render);
      expect(task.sampling).toEqual({ temperature: 0.6, topP: 1, topK: -1 });
    }
  });

  // Release histories as the controller records them: [weightVersion, parent, rollbackOf].
  const history = (...rs: [string, string | null, string | null][]) => rs.map(([weightVersion, parent, rollbackOf]) => ({ weightVersion, parent, rollbackOf }));
  const linear = history(['v1', null, null], ['v2', 'v1', null], ['v3', 'v2', null]);
  // v1, v2, v3, a rollback to v1, then v4 trained from v1.
  const rolledBack = history(['v1', null, null], ['v2', 'v1', null], ['v3', 'v2', null], ['v1', 'v3', 'release-1'], ['v4', 'v1', null]);
  const toBase = history(['v1', null, null], ['v2', 'v1', null], ['base', 'v2', 'base']);

  it('follows the lineage of the current weights, past rollbacks', () => {
    expect([...releaseLineage(linear)]).toEqual([['v3', 0], ['v2', 1], ['v1', 2], [null, 3]]);
    expect([...releaseLineage(rolledBack)]).toEqual([['v4', 0], ['v1', 1], [null, 2]]);
    expect([...releaseLineage(toBase)]).toEqual([[null, 0]]);
    expect([...releaseLineage([])]).toEqual([[null, 0]]);
  });

  it.each([
    [null, linear, 2, true],
    [null, linear, 3, false],
    ['v1', linear, 2, false],
    ['v2', linear, 0, true],
    ['v3', linear, 0, false],
    ['default', linear, 3, false],
    // Weights a rollback put aside: not in the lineage, however close their number.
    ['v2', rolledBack, 5, true],
    ['v3', rolledBack, 5, true],
    ['v1', rolledBack, 1, false],
    ['v4', rolledBack, 0, false],
    ['v1', toBase, 5, true],
    ['default', toBase, 0, false],
    ['v9', linear, 9, true],
  ] as const)('turn from %s, max_staleness %i: stale=%s', (made, releases, max, stale) => {
    expect(isStale(made, releaseLineage(releases), max)).toBe(stale);
  });

});
