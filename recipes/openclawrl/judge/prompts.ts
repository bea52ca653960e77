import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../../../cluster/paths.js';

/**
 * The judge prompts: templates kept as text in `recipes/openclawrl/prompts/` (our own wording),
 * filled with one turn. `{{name}}` placeholders are replaced in one pass, so a turn whose text
 * itself contains `{{…}}` is never expanded a second time.
 */

/**
 * `score`: did the user (or tool) accept the reply; `step`: the score vote of an agent step, whose
 * next state is a tool's output (did the step advance the task with a valid tool call); `hint`: the
 * hindsight hint for a teacher prompt.
 */
export type PromptKind = 'score' | 'step' | 'hint';

/** A finished turn as the PRM sees it. */
export interface TurnText {
  /** The first user message of the request: the task an agent works on. '' when it has none. */
  task: string;
  /** The newest message of the request the assistant answered (the user's ask, or a tool result). */
  context: string;
  /** The assistant's reply: its text, plus its tool calls as JSON. */
  reply: string;
  nextState: { role: 'user' | 'tool'; content: string };
}

/** Long fields keep their head and tail: the ending of a reply is where acceptance is decided. */
export const MAX_FIELD_CHARS = 12_000;

export function clip(text: string, max = MAX_FIELD_CHARS): string {
  if (text.length <= max) return text;
  // Cuts fall between code points: half an emoji is a lone surrogate, which a PRM server's JSON
  // parser or tokenizer refuses, failing every call of the turn.
  const lowSurrogate = (i: number): boolean => (text.charCodeAt(i) & 0xfc00) === 0xdc00;
  let head = Math.floor(max * 0.4);
  if (lowSurrogate(head)) head--;
  let start = text.length - (max - Math.floor(max * 0.4));
  if (lowSurrogate(start)) start++;
  return `${text.slice(0, head)}\n[… ${start - head} characters left out …]\n${text.slice(start)}`;
}

const cache = new Map<string, string>();

export function loadTemplate(kind: PromptKind, dir = join(repoRoot(), 'recipes', 'openclawrl', 'prompts')): string {
  const path = join(dir, `${kind}.md`);
  let text = cache.get(path);
  if (text === undefined) {
    text = readFileSync(path, 'utf8');
    cache.set(path, text);
  }
  return text;
}

export function fillTemplate(template: string, values: Record<string, string>): string {
  return template.replace(/\{\{(\w+)\}\}/g, (whole, key: string) => (Object.hasOwn(values, key) ? values[key]! : whole));
}

/**
 * Which prompt a turn's score votes use: a turn whose next state is a tool's output is an agent
 * step (`step.md`), judged on whether its call was valid and moved the task on; any other turn is
 * judged on whether the user accepted it (`score.md`).
 */
export function scoreKindOf(turn: Pick<TurnText, 'nextState'>): 'score' | 'step' {
  return turn.nextState.role === 'tool' ? 'step' : 'score';
}

/** The PRM prompt for one vote, as the content of a single user message. */
export function renderPrompt(kind: PromptKind, turn: TurnText, template = loadTemplate(kind)): string {
  return fillTemplate(template, {
    task: clip(turn.task),
    context: clip(turn.context),
    reply: clip(turn.reply),
    next_role: turn.nextState.role,
    next_state: clip(turn.nextState.content),
  });
}
