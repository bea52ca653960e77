import { appendFileSync, existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ReefError } from '../../../actors/runtime/errors.js';
import { HomeworkAgent, type AgentOptions, type AgentTurn } from './agent.js';
import type { Problem } from './problems.js';
import { writeReport, type RunSummary, type SessionResult } from './report.js';
import { HOMEWORK_RULE, rollingRates, scoreSession, type PassRule, type RollingPoint } from './scoring.js';
import type { Student } from './student.js';

/**
 * Runs the example's sessions in order: one problem per session, the student and the agent take
 * turns until the student says HOMEWORK_DONE or the turn limit, each session is scored by the
 * agent's first solution reply, and the results are written as they come.
 */

export interface RunOptions {
  /** Gateway base URL, e.g. `http://127.0.0.1:8600`. */
  gateway: string;
  apiKey?: string | null;
  /** @default 'homework' */
  scenario?: string;
  problems: readonly Problem[];
  /** Sessions to run; problems are reused in order when there are more sessions. @default problems.length */
  sessions?: number;
  student: Student;
  /** Results go to `<outputDir>/results/`, saved homework to `<outputDir>/homework/`. */
  outputDir: string;
  /** The recipe's prm_record_file, read for each batch's reward split. @default null */
  prmRecordFile?: string | null;
  /** Agent knobs (model, temperature, maxTokens, systemPrompt, maxToolRounds, timeoutMs). */
  agent?: Partial<Omit<AgentOptions, 'baseURL' | 'apiKey' | 'scenario' | 'outputDir'>>;
  /** Student messages per session at most. @default 8 */
  maxTurns?: number;
  /** Send the closing HOMEWORK_DONE to the agent too, so the save turn gets its next state. @default true */
  sendDone?: boolean;
  /** Stop the run after this many sessions in a row fail on the agent side. @default 3 */
  maxAgentErrors?: number;
  /** What a passing first reply is. @default HOMEWORK_RULE */
  passRule?: PassRule;
  /**
   * Sessions in flight at once: when one ends the next starts, so a batching engine keeps decoding
   * that many conversations together. Results are reported in session order. @default 1
   */
  concurrency?: number;
  /**
   * Completion token limit of the request that carries the student's closing HOMEWORK_DONE. That
   * request exists to give the turn before it its next state; its own reply is never judged or
   * scored. null: the agent's limit. @default null
   */
  closingMaxTokens?: number | null;
  onProgress?: (p: Progress) => void;
  /** Awaited before each session starts (1-based index), e.g. to let training catch up with the sessions. */
  beforeSession?: (index: number) => Promise<void>;
  signal?: AbortSignal;
}

export interface Progress {
  session: SessionResult;
  done: number;
  total: number;
  rolling: RollingPoint;
  elapsedS: number;
  /** A one-line rendering for a terminal. */
  line: string;
}

export interface TurnLog {
  student: string;
  reply: string;
  texts: string[];
  tool_calls: AgentTurn['toolCalls'];
  record_ids: string[];
  finish_reason: string | null;
}

const errText = (err: unknown) => (err instanceof ReefError ? `${err.code}: ${err.message}` : (err as Error)?.message ?? String(err));

/** One session: opening, then reply/response until done or the turn limit. Never throws. */
export async function runSession(agent: HomeworkAgent, student: Student, problem: Problem, index: number, opts: { maxTurns: number; sendDone: boolean; passRule?: PassRule; closingMaxTokens?: number | null }): Promise<{ result: SessionResult; transcript: TurnLog[] }> {
  const t0 = performance.now();
  const conv = agent.session(index);
  const transcript: TurnLog[] = [];
  let ended: SessionResult['ended'] = 'turn-limit';
  let error: string | null = null;
  let saved = false;
  const ss = student.begin(problem, index);
  let message: string | null = null;
  try {
    message = await ss.opening();
  } catch (err) {
    ended = 'student-error';
    error = errText(err);
  }
  let closing = false;
  while (message !== null) {
    let turn: AgentTurn;
    try {
      turn = await conv.send(message, closing && opts.closingMaxTokens != null ? { maxTokens: opts.closingMaxTokens } : {});
    } catch (err) {
      ended = 'agent-error';
      error = errText(err);
      break;
    }
    transcript.push({ student: message, reply: turn.reply, texts: turn.texts, tool_calls: turn.toolCalls, record_ids: turn.recordIds, finish_reason: turn.finishReason });
    const savedNow = turn.saved !== null && existsSync(turn.saved);
    saved ||= savedNow;
    if (closing) {
      ended = 'done';
      break;
    }
    if (transcript.length >= opts.maxTurns) break;
    try {
      const move = await ss.respond({ reply: turn.reply, saved: savedNow, finishReason: turn.finishReason });
      message = move.text;
      closing = move.done;
    } catch (err) {
      ended = 'student-error';
      error = errText(err);
      break;
    }
    if (closing && !opts.sendDone) {
      ended = 'done';
      break;
    }
  }
  const firstTurn = transcript.find((t) => t.texts.some((x) => x.trim() !== ''));
  const firstReply = firstTurn?.texts.find((t) => t.trim() !== '') ?? '';
  // The finish reason is the turn's last request's: a reply cut off there ends with no answer.
  const score = scoreSession(firstReply, problem.answer, opts.passRule ?? HOMEWORK_RULE, firstTurn?.finish_reason ?? null);
  const result: SessionResult = {
    index,
    problem_id: problem.id,
    family: problem.family,
    gold: problem.answer,
    passed: score.accept,
    bold: score.bold,
    list: score.list,
    header: score.header,
    habit: score.habit,
    answered: score.answered,
    violations: score.violations,
    steps: score.steps,
    has_answer: score.hasAnswer,
    turns: transcript.length,
    ended,
    saved,
    first_reply: firstReply,
    tag: conv.tag,
    record_ids: transcript.flatMap((t) => t.record_ids),
    error,
    wall_s: Math.round((performance.now() - t0) / 100) / 10,
  };
  return { result, transcript };
}

/** What the rolling rates read of a session. */
export function rollingInput(r: SessionResult): { accept: boolean; bold: boolean; list: boolean; habit: boolean } {
  return { accept: r.passed, bold: r.bold, list: r.list, habit: r.habit };
}

export function progressLine(r: SessionResult, total: number, rolling: RollingPoint, elapsedS: number): string {
  const mark = (b: boolean) => (b ? 'yes' : ' no');
  const pct = (v: number) => `${Math.round(v * 100)}%`.padStart(4);
  const w = String(total).length;
  return `session ${String(r.index).padStart(w)}/${total}  pass ${mark(r.passed)}  habit ${mark(r.habit)}  bold ${mark(r.bold)}  list ${mark(r.list)}  turns ${r.turns}  ${r.ended.padEnd(13)}` +
    `  last-10: pass ${pct(rolling.pass)} habit ${pct(rolling.habit)} bold ${pct(rolling.bold)} list ${pct(rolling.list)}  ${r.wall_s.toFixed(1)} s  (${Math.round(elapsedS)} s in all)`;
}

/**
 * Files are named by session index: one left by an earlier run would pass for the save of a session
 * of this run that saved nothing. Only the agent's own `sNNN.txt` go: `--out` defaults to the
 * working directory, whose `homework/` may be someone's own.
 */
export function clearSavedHomework(outputDir: string): void {
  const dir = join(outputDir, 'homework');
  if (!existsSync(dir)) return;
  for (const name of readdirSync(dir)) if (/^s\d{3,}\.txt$/.test(name)) rmSync(join(dir, name), { force: true });
}

/** Runs the sessions in order; writes results/sessions.jsonl, transcripts.jsonl, summary.json and plots. */
export async function runSessions(opts: RunOptions): Promise<RunSummary> {
  if (opts.problems.length === 0) throw new ReefError('REEF_ERR_INVALID_ARGUMENT', { details: 'no problems to run' });
  const total = opts.sessions ?? opts.problems.length;
  const dir = join(opts.outputDir, 'results');
  mkdirSync(dir, { recursive: true });
  const sessionsFile = join(dir, 'sessions.jsonl');
  const transcriptsFile = join(dir, 'transcripts.jsonl');
  writeFileSync(sessionsFile, '');
  writeFileSync(transcriptsFile, '');
  clearSavedHomework(opts.outputDir);
  const agent = new HomeworkAgent({ ...opts.agent, baseURL: opts.gateway, apiKey: opts.apiKey ?? null, scenario: opts.scenario ?? 'homework', outputDir: opts.outputDir });
  const prm = opts.prmRecordFile ?? null;
  const results: SessionResult[] = [];
  const t0 = performance.now();
  let agentErrors = 0;
  const concurrency = Math.max(1, Math.floor(opts.concurrency ?? 1));
  const sessionOpts = { maxTurns: opts.maxTurns ?? 8, sendDone: opts.sendDone ?? true, passRule: opts.passRule ?? HOMEWORK_RULE, closingMaxTokens: opts.closingMaxTokens ?? null };
  const problemOf = (i: number) => opts.problems[(i - 1) % opts.problems.length]!;
  // Sessions end out of order; they are reported in order, each as soon as all before it have ended.
  const ended = new Map<number, { result: SessionResult; transcript: TurnLog[] }>();
  let next = 1;
  let failed: Error | null = null;
  const report = () => {
    for (let i = results.length + 1; ended.has(i); i++) {
      const { result, transcript } = ended.get(i)!;
      ended.delete(i);
      results.push(result);
      appendFileSync(sessionsFile, `${JSON.stringify(result)}\n`);
      appendFileSync(transcriptsFile, `${JSON.stringify({ index: i, tag: result.tag, problem: problemOf(i), turns: transcript })}\n`);
      const elapsedS = (performance.now() - t0) / 1000;
      const rolling = rollingRates(results.map(rollingInput)).at(-1)!;
      opts.onProgress?.({ session: result, done: i, total, rolling, elapsedS, line: progressLine(result, total, rolling, elapsedS) });
      agentErrors = result.ended === 'agent-error' ? agentErrors + 1 : 0;
      if (agentErrors >= (opts.maxAgentErrors ?? 3)) {
        failed ??= new ReefError('REEF_ERR_ENGINE_DOWN', { engine: `gateway ${opts.gateway}`, reason: `${agentErrors} sessions in a row failed, last: ${result.error}` });
      }
    }
    // Summary and plots are refreshed as sessions end so a live run can be watched (and survives a stop).
    writeReport(dir, results, { wallTimeS: (performance.now() - t0) / 1000, prmRecordFile: prm });
  };
  const worker = async () => {
    for (;;) {
      if (opts.signal?.aborted || failed) return;
      const i = next++;
      if (i > total) return;
      await opts.beforeSession?.(i);
      if (opts.signal?.aborted) return;
      ended.set(i, await runSession(agent, opts.student, problemOf(i), i, sessionOpts));
      report();
    }
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, total) }, worker));
  if (failed) throw failed;
  return writeReport(dir, results, { wallTimeS: (performance.now() - t0) / 1000, prmRecordFile: prm });
}
