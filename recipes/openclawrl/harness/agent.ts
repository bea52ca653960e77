import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import { v1Url } from './student.js';

/**
 * The example's built-in agent: a homework helper on the OpenAI SDK, pointed at the Reef gateway,
 * with one tool, `save_homework`, that really writes a file. One conversation per session, every
 * request tagged `x-reef-scenario` and `x-reef-tag-session: {scenario}-s{index}` so the judge binds
 * the turns by tag.
 */

export const AGENT_SYSTEM_PROMPT = `You are a friendly homework helper. Solve the student's math problem and explain the solution. When the student asks you to save the homework, call the save_homework tool with the full text of the homework.`;

export const SAVE_TOOL: OpenAI.Chat.ChatCompletionFunctionTool = {
  type: 'function',
  function: {
    name: 'save_homework',
    description: "Save the homework text to the student's homework file.",
    parameters: { type: 'object', properties: { content: { type: 'string', description: 'The full homework text.' } }, required: ['content'] },
  },
};

export interface AgentOptions {
  /** The gateway's base URL (with or without `/v1`). */
  baseURL: string;
  /** Bearer key of the gateway; null when it takes none. @default null */
  apiKey?: string | null;
  scenario: string;
  /** Saved homework goes to `<outputDir>/homework/`. */
  outputDir: string;
  /** Model name sent to the gateway; null asks `/v1/models`. @default null */
  model?: string | null;
  systemPrompt?: string;
  /** @default 0.7 */
  temperature?: number;
  /** Completion token limit per request; null lets the gateway decide. @default null */
  maxTokens?: number | null;
  /** Model calls with tool results fed back, per student message. @default 3 */
  maxToolRounds?: number;
  /** Per-request timeout. @default 600000 */
  timeoutMs?: number;
  /** Offer the save_homework tool; off for a model whose chat template has no tools. @default true */
  tools?: boolean;
  /**
   * Sends each request a `seed` derived from this, the session's tag and the request's place in
   * it, so a rerun samples the same replies (given the same weights); null leaves sampling to the
   * engine. @default null
   */
  seed?: number | null;
}

/** The `seed` of a request: a hash of the run's seed, the session and how many messages precede it. */
export function requestSeed(seed: number, tag: string, messages: number): number {
  let h = 2166136261;
  for (const ch of `${seed}|${tag}|${messages}`) h = Math.imul(h ^ ch.charCodeAt(0), 16777619) >>> 0;
  return h & 0x7fffffff;
}

export interface ToolCallRecord {
  id: string;
  name: string;
  arguments: string;
  result: string;
  ok: boolean;
}

export interface AgentTurn {
  /** The last non-empty text of the turn ('' when the model wrote none). */
  reply: string;
  /** Every assistant text of the turn, in order (a tool-call round can carry text too). */
  texts: string[];
  toolCalls: ToolCallRecord[];
  /** Path of the homework file when save_homework succeeded in this turn. */
  saved: string | null;
  /** Receipts (`x-reef-agent-record-id`) of the turn's requests. */
  recordIds: string[];
  finishReason: string | null;
}

/** Runs save_homework: writes the content under `dir/homework/<file>`; never throws on bad arguments. */
export function saveHomework(dir: string, file: string, rawArgs: string): { ok: boolean; result: string; path: string | null } {
  let content: unknown;
  try {
    content = (JSON.parse(rawArgs) as { content?: unknown })?.content;
  } catch {
    content = undefined;
  }
  if (typeof content !== 'string' || content.trim() === '') {
    return { ok: false, result: 'error: save_homework needs JSON arguments {"content": "<the homework text>"}', path: null };
  }
  const folder = join(dir, 'homework');
  mkdirSync(folder, { recursive: true });
  const path = join(folder, file);
  writeFileSync(path, content);
  return { ok: true, result: `saved ${content.length} characters to homework/${file}`, path };
}

export class HomeworkAgent {
  readonly client: OpenAI;
  private model: Promise<string> | null = null;

  constructor(readonly options: AgentOptions) {
    this.client = new OpenAI({ baseURL: v1Url(options.baseURL), apiKey: options.apiKey ?? 'none', timeout: options.timeoutMs ?? 600_000, maxRetries: 2 });
  }

  modelName(): Promise<string> {
    if (this.options.model) return Promise.resolve(this.options.model);
    this.model ??= this.client.models.list().then((page) => page.data[0]?.id ?? 'reef');
    return this.model;
  }

  /** A new conversation, tagged `{scenario}-s{index}`. */
  session(index: number): AgentSession {
    return new AgentSession(this, index);
  }
}

export class AgentSession {
  readonly tag: string;
  readonly messages: OpenAI.Chat.ChatCompletionMessageParam[];

  constructor(private readonly agent: HomeworkAgent, readonly index: number) {
    this.tag = `${agent.options.scenario}-s${index}`;
    this.messages = [{ role: 'system', content: agent.options.systemPrompt ?? AGENT_SYSTEM_PROMPT }];
  }

  /**
   * Sends one student message and runs the tool loop until the model answers in text (or the round
   * limit). `maxTokens` overrides the agent's limit for this message's requests.
   */
  async send(userText: string, opts: { maxTokens?: number | null } = {}): Promise<AgentTurn> {
    const o = this.agent.options;
    this.messages.push({ role: 'user', content: userText });
    const turn: AgentTurn = { reply: '', texts: [], toolCalls: [], saved: null, recordIds: [], finishReason: null };
    const rounds = o.maxToolRounds ?? 3;
    const maxTokens = opts.maxTokens !== undefined ? opts.maxTokens : o.maxTokens;
    for (let round = 0; round < rounds; round++) {
      const { data, response } = await this.agent.client.chat.completions
        .create(
          {
            model: await this.agent.modelName(),
            messages: this.messages,
            ...(o.tools === false ? {} : { tools: [SAVE_TOOL] }),
            temperature: o.temperature ?? 0.7,
            ...(maxTokens != null ? { max_tokens: maxTokens } : {}),
            ...(o.seed != null ? { seed: requestSeed(o.seed, this.tag, this.messages.length) } : {}),
          },
          { headers: { 'x-reef-scenario': o.scenario, 'x-reef-tag-session': this.tag } },
        )
        .withResponse();
      const receipt = response.headers.get('x-reef-agent-record-id');
      if (receipt) turn.recordIds.push(receipt);
      const choice = data.choices[0];
      const text = choice?.message.content ?? '';
      const calls = (choice?.message.tool_calls ?? []).filter((c): c is OpenAI.Chat.ChatCompletionMessageFunctionToolCall => c.type === 'function');
      turn.finishReason = choice?.finish_reason ?? null;
      if (text.trim() !== '') {
        turn.texts.push(text);
        turn.reply = text;
      }
      this.messages.push({ role: 'assistant', content: text, ...(calls.length > 0 ? { tool_calls: calls } : {}) });
      if (calls.length === 0) break;
      for (const call of calls) {
        const known = call.function.name === SAVE_TOOL.function.name;
        const r = known ? saveHomework(o.outputDir, `s${String(this.index).padStart(3, '0')}.txt`, call.function.arguments) : { ok: false, result: `error: unknown tool ${call.function.name}`, path: null };
        if (r.path) turn.saved = r.path;
        turn.toolCalls.push({ id: call.id, name: call.function.name, arguments: call.function.arguments, result: r.result, ok: r.ok });
        this.messages.push({ role: 'tool', tool_call_id: call.id, content: r.result });
      }
    }
    return turn;
  }
}
