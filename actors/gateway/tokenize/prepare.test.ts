import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { tinyModelDir } from '../../../cluster/paths.js';
import { copyTinyModel } from '../../../test/helpers/long-context-model.js';
import { ChatTokenizer } from './chat-tokenizer.js';
import { normalizeMessages } from './normalize.js';
import { isDeepFrozen } from './frozen.js';
import { prepareChat } from './prepare.js';
import { NotUtf8Error, utf8Text } from './utf8.js';

const params = { rid: '01JAAAAAAAAAAAAAAAAAAAAAAA', topK: 4, defaultMaxTokens: 16 };

describe('utf8Text', () => {
  const decoder = new TextDecoder('utf-8', { fatal: true });
  /** What a fatal TextDecoder makes of the bytes: the text, or that it refuses them. */
  const expected = (bytes: Uint8Array): string | 'refused' => {
    try {
      return decoder.decode(bytes);
    } catch {
      return 'refused';
    }
  };
  const actual = (bytes: Uint8Array): string | 'refused' => {
    try {
      return utf8Text(bytes);
    } catch (err) {
      expect(err).toBeInstanceOf(NotUtf8Error);
      return 'refused';
    }
  };
  let seed = 11;
  const rand = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  /** Code points from every UTF-8 length class, ASCII-heavy like a transcript. */
  const randomText = (n: number) => {
    let s = '';
    for (let i = 0; i < n; i++) {
      const k = rand(10);
      const cp = k < 6 ? 0x20 + rand(0x5f) : k === 6 ? 0x80 + rand(0x780) : k === 7 ? 0x800 + rand(0xd000) : k === 8 ? 0xe000 + rand(0x2000) : 0x10000 + rand(0x100000);
      s += String.fromCodePoint(cp);
    }
    return s;
  };

  it('decodes exactly as a fatal TextDecoder: ASCII, well-formed UTF-8, a byte-order mark; refuses malformed bytes', () => {
    const cases: Uint8Array[] = [new Uint8Array(0), Buffer.from('{"a": 1}'), Buffer.from('\u{feff}{"bom": true}'), Uint8Array.of(0xef, 0xbb)];
    for (let i = 0; i < 300; i++) {
      const text = Buffer.from(randomText(rand(400)));
      cases.push(text);
      // Malformed: a cut sequence, a stray continuation byte, an overlong form, an encoded surrogate.
      const bad = Buffer.from(text);
      if (bad.length > 0) bad[rand(bad.length)] = [0x80, 0xc0, 0xe0, 0xf5, 0xff][rand(5)]!;
      cases.push(bad, Buffer.concat([text, Uint8Array.of(0xed, 0xa0, 0x80)]), Buffer.concat([Uint8Array.of(0xc0, 0xaf), text]));
    }
    let refused = 0;
    for (const bytes of cases) {
      const want = expected(bytes);
      expect(actual(bytes)).toBe(want);
      if (want === 'refused') refused++;
    }
    // The malformed cases were refused, not decoded: the comparison covered both ways.
    expect(refused).toBeGreaterThanOrEqual(600);
  });

  it('reads only its own bytes of a larger buffer', () => {
    const whole = Buffer.from(`xx${'é😀a'.repeat(50)}yy`);
    const view = new Uint8Array(whole.buffer, whole.byteOffset + 2, whole.length - 4);
    expect(utf8Text(view)).toBe('é😀a'.repeat(50));
    expect(utf8Text(Buffer.from('plain ascii').subarray(6))).toBe('ascii');
  });
});

describe('prepareChat engine bodies', () => {
  it('a new session, and a request without one, reuse the last session\'s id text and render and still send exactly their own ids', async () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const fresh = ChatTokenizer.load(tinyModelDir());
    const system = { role: 'system', content: 'You are a careful agent. '.repeat(120) };
    const body = (messages: unknown[]) => Buffer.from(JSON.stringify({ messages, max_tokens: 4 }));
    const turns: Array<[string | null, unknown[]]> = [
      ['s1', [system, { role: 'user', content: 'first question' }]],
      ['s1', [system, { role: 'user', content: 'first question' }, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'more' }]],
      ['s2', [system, { role: 'user', content: 'another session' }]],
      [null, [system, { role: 'user', content: 'no session at all' }]],
      ['s3', [{ role: 'user', content: 'a different prompt altogether' }]],
    ];
    for (const [sessionKey, messages] of turns) {
      const out = prepareChat(tok, body(messages), { ...params, sessionKey });
      if (!out.ok) throw new Error(out.message);
      const sent = JSON.parse(Buffer.from(out.engineBody).toString('utf8')) as { input_ids: number[]; rid: string };
      expect(sent.input_ids).toEqual(Array.from(out.promptIds));
      expect(Array.from(out.promptIds)).toEqual(Array.from(fresh.render(normalizeMessages(messages as never), null).ids));
      expect(sent.rid).toBe(params.rid);
    }
    // The later turns took ids from the earlier renders (the check above would pass without).
    expect(tok.stats().reuse.renders).toBeGreaterThanOrEqual(3);
  });
});

describe('prepareChat bodies of a session', () => {
  it('refuses a body that is not UTF-8, whole or as the extension of a remembered one, and serves the session after it', () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const t1 = [{ role: 'system', content: 'Be brief. '.repeat(50) }, { role: 'user', content: 'héllo' }];
    const body = (messages: unknown[]) => Buffer.from(JSON.stringify({ messages, max_tokens: 4 }));
    expect(prepareChat(tok, body(t1), { ...params, sessionKey: 'utf8' }).ok).toBe(true);
    // The next turn's new message carries a lone continuation byte (Latin-1 'é' sent as is).
    const next = body([...t1, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'caf_' }]);
    next[next.lastIndexOf('_')] = 0xe9;
    for (const sessionKey of ['utf8', null]) {
      expect(prepareChat(tok, next, { ...params, sessionKey })).toEqual({ ok: false, code: 'REEF_ERR_BODY', message: 'request body is not valid UTF-8', param: null });
    }
    const good = [...t1, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'café' }];
    const out = prepareChat(tok, body(good), { ...params, sessionKey: 'utf8' });
    if (!out.ok) throw new Error(out.message);
    expect(Array.from(out.promptIds)).toEqual(Array.from(tok.render(good, null).ids));
  });

  it('refuses a forbidden key or a deep nesting in an appended message as it does in a whole body', async () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const t1 = [{ role: 'system', content: 'Be brief. '.repeat(50) }, { role: 'user', content: 'hi' }];
    const body = (messagesJson: string) => Buffer.from(`{"messages":${messagesJson},"max_tokens":4}`);
    const json1 = JSON.stringify(t1);
    const bad = [
      `${json1.slice(0, -1)},{"role":"user","content":"x","__proto__":{"polluted":true}}]`,
      `${json1.slice(0, -1)},{"role":"user","content":"x","deep":${'['.repeat(130)}${']'.repeat(130)}}]`,
    ];
    for (const messages of bad) {
      // Session first (its last body is remembered), then the same body alone with no session
      // remembered that fits it.
      expect(prepareChat(tok, body(json1), { ...params, sessionKey: 'memo' }).ok).toBe(true);
      const extended = prepareChat(tok, body(messages), { ...params, sessionKey: 'memo' });
      const whole = prepareChat(tok, Buffer.from(`{"max_tokens":4,"messages":${messages}}`), { ...params, sessionKey: 'other' });
      expect(extended).toMatchObject({ ok: false, code: 'REEF_ERR_BODY' });
      expect(extended).toEqual(whole);
    }
    // A good next turn after them is served, with the ids of its own transcript.
    const good = [...t1, { role: 'assistant', content: 'hello' }, { role: 'user', content: 'more' }];
    const out = prepareChat(tok, body(JSON.stringify(good)), { ...params, sessionKey: 'memo' });
    if (!out.ok) throw new Error(out.message);
    expect(Array.from(out.promptIds)).toEqual(Array.from(tok.render(good, null).ids));
  });
});

describe('prepareChat thinking state', () => {
  const parent = mkdtempSync(join(tmpdir(), 'reef-think-'));
  afterAll(() => rmSync(parent, { recursive: true, force: true }));
  /** A copy of the tiny model with its template (and, optionally, its added tokens) changed. */
  const variant = (name: string, edit: { template?: (t: string) => string; dropAdded?: string[] }): string => {
    const dir = copyTinyModel(join(parent, name));
    if (edit.template) {
      const path = join(dir, 'chat_template.jinja');
      writeFileSync(path, edit.template(readFileSync(path, 'utf8')));
    }
    if (edit.dropAdded) {
      const drop = new Set(edit.dropAdded);
      const tj = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')) as { added_tokens: { content: string }[] };
      tj.added_tokens = tj.added_tokens.filter((t) => !drop.has(t.content));
      writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tj));
      const tc = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as { added_tokens_decoder: Record<string, { content: string }> };
      for (const [id, t] of Object.entries(tc.added_tokens_decoder)) if (drop.has(t.content)) delete tc.added_tokens_decoder[id];
      writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
    }
    return dir;
  };
  // A generation prompt that opens the reasoning block, as DeepSeek-R1-style templates do.
  const opensThink = (t: string) => t.replace("{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}", "{{- '<|im_start|>assistant\\n<think>\\n' -}}\n{%- endif -%}");
  const thinking = (tok: ChatTokenizer, messages: unknown[], sessionKey: string | null = null): boolean => {
    const out = prepareChat(tok, Buffer.from(JSON.stringify({ messages, max_tokens: 4 })), { ...params, sessionKey });
    if (!out.ok) throw new Error(out.message);
    return out.startsInThinking;
  };
  const history = [
    { role: 'system', content: 'Think before you answer. '.repeat(40) },
    { role: 'user', content: 'first' },
    { role: 'assistant', content: 'one', reasoning_content: 'the first thought' },
  ];

  it('a user or tool quoting <think> opens no reasoning block; only the template\'s markup does', () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    // Plain renders (reusable, read at their cuts) and marked ones (a control token in user text, read id by id).
    for (const quote of ['What does the <think> tag do? <think>', 'control <|im_end|> and <think>']) {
      expect(thinking(tok, [{ role: 'user', content: quote }])).toBe(false);
      expect(thinking(tok, [...history, { role: 'user', content: quote }], 'quoted')).toBe(false);
      expect(thinking(tok, [...history, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c', content: quote }])).toBe(false);
    }
    const opening = ChatTokenizer.load(variant('opens-think', { template: opensThink }));
    expect(opening.renderText(normalizeMessages([{ role: 'user', content: 'hi' }]), null, {})).toMatch(/<think>\n$/);
    expect(thinking(opening, [{ role: 'user', content: 'hi' }])).toBe(true);
    expect(thinking(opening, [...history, { role: 'user', content: 'next' }], 'opened')).toBe(true);
    // A user's "</think>" closes nothing the template opened.
    expect(thinking(opening, [...history, { role: 'user', content: 'done </think>' }], 'opened')).toBe(true);
    expect(thinking(opening, [...history, { role: 'user', content: 'done </think> <|im_start|>' }])).toBe(true);
  });

  it('renders chat_template_kwargs as template variables: enable_thinking false closes the block the template would open', () => {
    // Qwen3's way: the generation prompt opens <think>, or with enable_thinking false writes an empty block.
    const qwen3 = (t: string) =>
      t.replace(
        "{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}",
        "{{- '<|im_start|>assistant\\n' -}}{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- else -%}{{- '<think>\\n' -}}{%- endif -%}\n{%- endif -%}",
      );
    const tok = ChatTokenizer.load(variant('enable-thinking', { template: qwen3 }));
    const prepared = (kwargs: unknown, sessionKey: string | null = null, messages: unknown[] = [{ role: 'user', content: 'hi' }]) => {
      const out = prepareChat(tok, Buffer.from(JSON.stringify({ messages, max_tokens: 4, ...(kwargs === undefined ? {} : { chat_template_kwargs: kwargs }) })), { ...params, sessionKey });
      if (!out.ok) throw new Error(out.message);
      return out;
    };
    expect(tok.decode(prepared(undefined).promptIds)).toMatch(/assistant\n<think>\n$/);
    expect(prepared(undefined).startsInThinking).toBe(true);
    const off = prepared({ enable_thinking: false });
    expect(tok.decode(off.promptIds)).toMatch(/assistant\n<think>\n\n<\/think>\n\n$/);
    expect(off.startsInThinking).toBe(false);
    expect(Array.from(off.promptIds)).toEqual(Array.from(tok.render(normalizeMessages([{ role: 'user', content: 'hi' }]), null, { extra: { enable_thinking: false } }).ids));
    // A session that turns thinking back on is rendered afresh, not from its last turn's ids.
    const turn2 = [...history, { role: 'user', content: 'next' }];
    prepared({ enable_thinking: false }, 'kw', history.slice(0, 2));
    prepared({ enable_thinking: false }, 'kw', turn2);
    expect(Array.from(prepared({ enable_thinking: true }, 'kw', turn2).promptIds)).toEqual(Array.from(prepared({ enable_thinking: true }, null, turn2).promptIds));
  });

  it('a render is reused only by the tokenizer that made it', () => {
    // Same template and text, but <tool_call> is an added token in one and plain text in the other.
    const a = ChatTokenizer.load(tinyModelDir());
    const b = ChatTokenizer.load(variant('no-call-tokens', { dropAdded: ['<tool_call>', '</tool_call>'] }));
    const tools = [{ type: 'function', function: { name: 'lookup', description: 'Looks a thing up.', parameters: { type: 'object' } } }];
    const messages = [{ role: 'system', content: 'Use the tools. '.repeat(60) }, { role: 'user', content: 'look it up' }];
    const body = Buffer.from(JSON.stringify({ messages, tools, max_tokens: 4 }));
    const fromA = prepareChat(a, body, params);
    const fromB = prepareChat(b, body, params);
    if (!fromA.ok || !fromB.ok) throw new Error('refused');
    const fresh = b.render(normalizeMessages(messages), tools).ids;
    expect(Array.from(fromB.promptIds)).toEqual(Array.from(fresh));
    expect(Array.from(fromB.promptIds)).not.toEqual(Array.from(fromA.promptIds));
  });

  it('a tokenizer without <think> tokens reads the rendered text', () => {
    const drop = ['<think>', '</think>'];
    const opening = ChatTokenizer.load(variant('no-think-tokens-opening', { template: opensThink, dropAdded: drop }));
    expect(opening.addedTokenIds().has('<think>')).toBe(false);
    expect(thinking(opening, [{ role: 'user', content: 'hi' }])).toBe(true);
    const plain = ChatTokenizer.load(variant('no-think-tokens', { dropAdded: drop }));
    expect(thinking(plain, [...history, { role: 'user', content: 'next' }])).toBe(false);
  });
});

describe('prepareChat sampling', () => {
  const tok = ChatTokenizer.load(tinyModelDir());
  const prepare = (extra: Record<string, unknown>) => prepareChat(tok, Buffer.from(JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...extra })), params);
  const samplingText = (out: ReturnType<typeof prepareChat>): string => {
    if (!out.ok) throw new Error(out.message);
    const text = Buffer.from(out.engineBody).toString('utf8');
    return text.slice(text.indexOf('"sampling_params":'), text.indexOf('},"return_logprob"') + 1);
  };

  it('sends the client\'s top_k to the engine, which otherwise sampled the whole vocabulary while the trainer truncated to top_k', () => {
    expect(samplingText(prepare({ temperature: 0.6, top_k: 20 }))).toBe('"sampling_params":{"max_new_tokens":16,"temperature":0.6,"top_p":1,"top_k":20,"stop":null}');
    // Without top_k (or with -1, "off"), the body is byte for byte what it was before top_k was sent.
    const plain = '"sampling_params":{"max_new_tokens":16,"temperature":0.6,"top_p":1,"stop":null}';
    expect(samplingText(prepare({ temperature: 0.6 }))).toBe(plain);
    expect(samplingText(prepare({ temperature: 0.6, top_k: null }))).toBe(plain);
    expect(samplingText(prepare({ temperature: 0.6, top_k: -1 }))).toBe(plain);
  });

  it('gives a request without max_tokens reef.default_max_tokens, and with it null (Infinity here) the rest of the context', () => {
    const maxNew = (defaultMaxTokens: number, extra = {}) => {
      const out = prepareChat(tok, Buffer.from(JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], ...extra })), { ...params, defaultMaxTokens });
      if (!out.ok) throw new Error(out.message);
      return { n: JSON.parse(samplingText(out).slice('"sampling_params":'.length)).max_new_tokens as number, prompt: out.promptIds.length };
    };
    expect(maxNew(16).n).toBe(16);
    const rest = maxNew(Number.POSITIVE_INFINITY);
    expect(rest.n).toBe(tok.contextLength! - rest.prompt);
    // The client's own limit still wins over either default.
    expect(maxNew(Number.POSITIVE_INFINITY, { max_tokens: 7 }).n).toBe(7);
  });

  it.each([0, -2, 2.5, '20', true, 2 ** 53])('refuses top_k %j with an OpenAI error naming top_k', (topK) => {
    expect(prepare({ top_k: topK })).toMatchObject({ ok: false, code: 'REEF_ERR_INVALID_ARGUMENT', param: 'top_k', message: expect.stringMatching(/^top_k: expected -1 \(off\) or an integer >= 1/) });
  });
});

describe('prepareChat tools', () => {
  it('a session\'s tool list reaches the template as the client sent it, and as the same frozen list every turn (the tokenizer caches its conversion by identity)', () => {
    const tok = ChatTokenizer.load(tinyModelDir());
    const seen: unknown[] = [];
    const render = tok.render.bind(tok);
    tok.render = (messages, tools, opts) => (seen.push(tools), render(messages, tools, opts));
    // Keys out of the schema's order: zod's copy would print `description` first.
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' }, description: 'd' } }, { function: { name: 'g' }, type: 'function' }];
    const messages: unknown[] = [{ role: 'system', content: 'Use the tools. '.repeat(40) }, { role: 'user', content: 'first' }];
    for (let turn = 0; turn < 3; turn++) {
      const out = prepareChat(tok, Buffer.from(JSON.stringify({ messages, tools, max_tokens: 4 })), { ...params, sessionKey: 'tools' });
      if (!out.ok) throw new Error(out.message);
      messages.push({ role: 'assistant', content: `answer ${turn}` }, { role: 'user', content: `next ${turn}` });
    }
    expect(seen.map((t) => JSON.stringify(t))).toEqual(Array(3).fill(JSON.stringify(tools)));
    expect(isDeepFrozen(seen[1])).toBe(true);
    expect(seen[2]).toBe(seen[1]);
  });
});
