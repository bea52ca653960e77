import OpenAI from 'openai';
import { ReefError } from '../../../actors/runtime/errors.js';
import type { Problem } from './problems.js';
import { ALL_VIOLATIONS, checkReply, endsWithAnswer, MIN_STEPS, type Violation } from './scoring.js';

/**
 * The simulated student of the example. It brings one problem per session, wants homework that
 * does not look AI-written, asks for a rewrite naming what to drop, asks in a separate message to
 * save an acceptable answer, and ends with `HOMEWORK_DONE`. Two kinds behind one interface: a
 * scripted student (no model, deterministic) and an LLM student (OpenAI API, e.g. the student
 * engine the cluster places).
 */

export const DONE = 'HOMEWORK_DONE';

/** What the student sees of one agent turn. */
export interface AgentTurnView {
  /** The agent's visible reply (its last text of the turn). */
  reply: string;
  /** Whether the save tool ran in this turn and the file exists. */
  saved: boolean;
  /** Why the reply's last request ended (`length`: cut off by the token limit), when known. @default null */
  finishReason?: string | null;
}

export interface StudentMove {
  text: string;
  /** The student ends the session with this message (it contains HOMEWORK_DONE). */
  done: boolean;
}

export interface StudentSession {
  /** The first message: the problem and a request for help. */
  opening(): Promise<string>;
  respond(turn: AgentTurnView): Promise<StudentMove>;
}

export interface Student {
  readonly kind: 'scripted' | 'llm';
  begin(problem: Problem, sessionIndex: number): StudentSession;
  close(): Promise<void>;
}

/** Deterministic choice among wordings, so a rerun sends the same messages. */
function choose<T>(options: readonly T[], ...keys: Array<string | number>): T {
  let h = 2166136261;
  for (const ch of keys.join('|')) h = Math.imul(h ^ ch.charCodeAt(0), 16777619) >>> 0;
  return options[h % options.length]!;
}

const NAMES: Record<Violation, string> = {
  bold: 'bold text',
  header: 'headings',
  list: 'bullet points or numbered lists',
  boxed: 'the \\boxed answer',
  'final-answer': 'the "Final answer:" line',
  rule: 'horizontal lines',
  table: 'tables',
};

function listWords(words: string[]): string {
  return words.length <= 1 ? (words[0] ?? '') : `${words.slice(0, -1).join(', ')} and ${words.at(-1)}`;
}

const OPENINGS = [
  (q: string) => `Hi! Can you help me with my math homework? ${q}`,
  (q: string) => `hey, I'm stuck on this homework problem: ${q} can you work it out with me?`,
  (q: string) => `Could you help me solve this for school? ${q} I have to hand in the working too.`,
  (q: string) => `I need help with my homework please. ${q}`,
];
const COMPLAINTS = [
  (x: string) => `please don't use ${x}, it looks AI-written and my teacher will notice. Can you rewrite it as normal sentences?`,
  (x: string) => `This looks like a chatbot wrote it. Could you drop the ${x} and write it the way a student would?`,
  (x: string) => `Hmm, no ${x} please, it has to look like my own work. Can you redo it?`,
  (x: string) => `Can you rewrite it without ${x}? Homework that looks AI-generated gets marked down.`,
];
const STEPS_ONLY = [
  'Can you show the calculations, like 3 × 4 = 12? My teacher wants to see the work.',
  'I need the working written out with the actual sums, not just the answer. Can you add the steps?',
];
const STEPS_TOO = ' Also please write out the calculations, like 3 × 4 = 12.';
const EMPTY = ['You did not write anything, can you solve it for me?', 'Hello? I still need the solution.'];
const SAVE = ['great, please save it', 'Perfect, that looks like my own work. Please save it for me.', "Thanks, that's good! Can you save it?", 'Nice, please save it.'];
const THANKS = ['Thanks, got it!', 'Saved, thank you!', 'Great, thanks!'];
const GIVE_UP = ["I don't see the file, never mind, I'll copy it myself.", "It didn't save, but that's ok, I'll copy it."];
const NO_ANSWER = ['I still need the answer at the end. Can you finish with the number?', "I can't find the answer in that. Can you finish it with the final number?"];
const LAST_WORD = ["Never mind, I'll fix it myself.", "Forget it, I'll write it up on my own."];
const ACCEPT_DONE = ["Thanks, that's what I needed!", 'Great, that looks like my own work. Thank you!', 'Perfect, thanks for the help!'];

export interface ScriptedStudentOptions {
  /** Ask for worked calculations when a reply shows fewer than MIN_STEPS. @default true */
  requireSteps?: boolean;
  /** The formatting the student asks to drop. @default every Violation */
  dislikes?: readonly Violation[];
  /** Ask for the answer when a reply does not end with one (`endsWithAnswer`). @default false */
  requireAnswer?: boolean;
  /**
   * Ask the agent to save an acceptable reply (its save_homework tool) before ending; without it
   * the student thanks the agent and ends with HOMEWORK_DONE in the same message. @default true
   */
  save?: boolean;
  /**
   * After this many agent replies that are not acceptable, the student's next message (its
   * complaint, so the last reply is judged like the others) ends the session with HOMEWORK_DONE.
   * @default unlimited
   */
  maxReplies?: number;
}

/** The scripted student: the same rules as the scoring, applied to every reply until one passes. */
export class ScriptedStudent implements Student {
  readonly kind = 'scripted' as const;
  constructor(private readonly options: ScriptedStudentOptions = {}) {}

  begin(problem: Problem, sessionIndex: number): StudentSession {
    const requireSteps = this.options.requireSteps ?? true;
    const dislikes = this.options.dislikes ?? ALL_VIOLATIONS;
    let phase: 'solving' | 'saving' = 'solving';
    let turn = 0;
    const key = (kind: string) => [problem.id, sessionIndex, turn, kind] as const;
    return {
      opening: async () => choose(OPENINGS, ...key('open'))(problem.question),
      respond: async ({ reply, saved, finishReason }) => {
        turn++;
        if (phase === 'saving') {
          return { text: `${saved ? choose(THANKS, ...key('thanks')) : choose(GIVE_UP, ...key('give-up'))} ${DONE}`, done: true };
        }
        const last = this.options.maxReplies !== undefined && turn >= this.options.maxReplies;
        const ask = (text: string): StudentMove => (last ? { text: `${text} ${choose(LAST_WORD, ...key('last'))} ${DONE}`, done: true } : { text, done: false });
        if (reply.trim() === '') return ask(choose(EMPTY, ...key('empty')));
        const check = checkReply(reply);
        const fewSteps = requireSteps && check.steps < MIN_STEPS;
        const disliked = check.violations.filter((v) => dislikes.includes(v));
        if (disliked.length > 0) {
          const text = choose(COMPLAINTS, ...key('complain'))(listWords(disliked.map((v) => NAMES[v])));
          return ask(fewSteps ? text + STEPS_TOO : text);
        }
        if (fewSteps) return ask(choose(STEPS_ONLY, ...key('steps')));
        if (this.options.requireAnswer && !endsWithAnswer(reply, finishReason ?? null)) return ask(choose(NO_ANSWER, ...key('answer')));
        if (this.options.save === false) return { text: `${choose(ACCEPT_DONE, ...key('accept'))} ${DONE}`, done: true };
        phase = 'saving';
        return { text: choose(SAVE, ...key('save')), done: false };
      },
    };
  }

  async close(): Promise<void> {}
}

/** Our wording of the student's role for an LLM student. */
export const STUDENT_SYSTEM_PROMPT = `You are playing a school student who gets help with math homework from an AI homework helper. Stay in character and write only your next chat message, short and casual.

What you want: homework you can hand in that does not look written by an AI. So: no bold text, no headings, no bullet points or numbered lists, no \\boxed answers, no "Final answer:" line, no tables and no horizontal lines. The working must be shown in ordinary sentences with the calculations written out (for example "3 × 4 = 12").

How you behave:
- If the helper's reply breaks any of these wishes, do not accept it: ask for a rewrite and say what to drop.
- When a reply meets all of your wishes, thank the helper and only ask them to save it (for example "great, please save it"). Ask for nothing else in that message.
- Once the helper has saved it, reply with exactly ${DONE}.
Never solve the problem yourself and never mention these instructions.`;

export interface LlmStudentOptions {
  /** OpenAI-compatible base URL of the student model (with or without `/v1`). */
  url: string;
  apiKey?: string | null;
  /** Model name; null asks the server's `/v1/models` for its first model. @default null */
  model?: string | null;
  /** Per-turn timeout. @default 120000 */
  timeoutMs?: number;
  /** @default 0.7 */
  temperature?: number;
  /** @default 2048 */
  maxTokens?: number;
  systemPrompt?: string;
}

/**
 * Drops a thinking model's reasoning from what the student "says". Reasoning cut off by the token
 * limit has no `</think>`: all of it is reasoning, and the student has said nothing.
 */
export function studentText(raw: string | null | undefined): string {
  const text = (raw ?? '').replace(/<think>[\s\S]*?<\/think>/g, '').replace(/^[\s\S]*<\/think>/, '').replace(/<think>[\s\S]*$/, '');
  return text.trim();
}

export function v1Url(url: string): string {
  const u = url.replace(/\/+$/, '');
  return u.endsWith('/v1') ? u : `${u}/v1`;
}

/** The LLM student: the conversation seen from the student's side (its own messages are `assistant`). */
export class LlmStudent implements Student {
  readonly kind = 'llm' as const;
  private readonly client: OpenAI;
  private model: Promise<string> | null = null;

  constructor(private readonly options: LlmStudentOptions) {
    this.client = new OpenAI({ baseURL: v1Url(options.url), apiKey: options.apiKey ?? 'none', timeout: options.timeoutMs ?? 120_000, maxRetries: 1 });
  }

  private modelName(): Promise<string> {
    if (this.options.model) return Promise.resolve(this.options.model);
    this.model ??= this.client.models.list().then((page) => {
      const id = page.data[0]?.id;
      if (!id) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `student at ${this.options.url} lists no model; set the student model name` });
      return id;
    });
    return this.model;
  }

  private async say(messages: OpenAI.Chat.ChatCompletionMessageParam[]): Promise<string> {
    const timeoutMs = this.options.timeoutMs ?? 120_000;
    let res: OpenAI.Chat.ChatCompletion;
    try {
      res = await this.client.chat.completions.create(
        { model: await this.modelName(), messages, temperature: this.options.temperature ?? 0.7, max_tokens: this.options.maxTokens ?? 2048 },
        { timeout: timeoutMs },
      );
    } catch (err) {
      if (err instanceof OpenAI.APIConnectionTimeoutError) throw new ReefError('REEF_ERR_TIMEOUT', { what: 'student turn', ms: timeoutMs }, { cause: err });
      throw err;
    }
    const text = studentText(res.choices[0]?.message.content);
    if (text === '') {
      const cut = res.choices[0]?.finish_reason === 'length' ? ` (its ${this.options.maxTokens ?? 2048} tokens ran out, still thinking?)` : '';
      throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: `the student model wrote an empty message${cut}` });
    }
    return text;
  }

  begin(problem: Problem): StudentSession {
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [
      { role: 'system', content: this.options.systemPrompt ?? STUDENT_SYSTEM_PROMPT },
      { role: 'user', content: `(Start the chat: ask the homework helper for help with this problem, in your own words.)\n\n${problem.question}` },
    ];
    const turn = async (userSide: string | null): Promise<string> => {
      if (userSide !== null) messages.push({ role: 'user', content: userSide });
      const text = await this.say(messages);
      messages.push({ role: 'assistant', content: text });
      return text;
    };
    return {
      opening: () => turn(null),
      respond: async ({ reply, saved }) => {
        const note = saved ? '\n\n(The helper saved your homework to a file.)' : '';
        const text = await turn(`${reply || '(empty reply)'}${note}`);
        return { text, done: text.includes(DONE) };
      },
    };
  }

  async close(): Promise<void> {}
}
