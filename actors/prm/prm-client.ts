import { Agent, request } from 'undici';
import { ENGINE_KEEP_ALIVE_MS } from '../../cluster/engine-client.js';
import { ChatTokenizer, normalizeMessages } from '../gateway/tokenize/index.js';
import { ReefError } from '../runtime/errors.js';
import { Redactor } from './redact.js';
import type { PrmSettings } from './settings.js';

/**
 * One judge prompt in, the PRM's reply text out. `sglang`: the prompt is rendered with the PRM's
 * own chat template and sent as token ids to the engine's `/generate`; `openai`: sent as a chat
 * message to `/v1/chat/completions`. Each call has its own deadline (`prm_timeout_s`); calls are
 * spread round-robin over the PRM URLs, and one an engine is down for goes on to the next.
 */
export interface PrmCaller {
  readonly api: 'sglang' | 'openai';
  readonly model: string | null;
  /**
   * One call; `url` is where it went (for the judgment's record). `text` is the reply as the model
   * wrote it, with the `<think>` in front that the PRM's template put at the end of the prompt.
   */
  call(prompt: string, opts: { rid: string; signal?: AbortSignal }): Promise<{ text: string; url: string }>;
  close(): Promise<void>;
}

const STAGE = 'pipeline.record2record.config';

/** Statuses that say the PRM cannot answer now, whatever the request: 429, 502, 503, 504. */
const NOT_NOW = new Set([429, 502, 503, 504]);

export class PrmClient implements PrmCaller {
  readonly api: 'sglang' | 'openai';
  readonly model: string | null;
  private readonly agent: Agent;
  private readonly tokenizer: ChatTokenizer | null;
  private readonly apiKey: string | null;
  /** Masks prompts before they leave (redact.ts); null where `reef.redaction` does not apply to this PRM. */
  private readonly redactor: Redactor | null;
  private next = 0;

  constructor(private readonly s: PrmSettings) {
    if (s.urls.length === 0) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: 'no PRM URL: set pipeline.record2record.config.prm_url or cluster.prm.replicas' });
    this.api = s.api;
    this.model = s.model;
    const redactor = s.redaction ? new Redactor(s.redaction) : null;
    this.redactor = redactor?.appliesTo(s.api) ? redactor : null;
    this.agent = new Agent({ connections: Math.max(4, s.concurrency * 2), keepAliveTimeout: ENGINE_KEEP_ALIVE_MS });
    if (s.api === 'sglang') {
      if (s.tokenizerPath === null) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${STAGE}.prm_api sglang needs ${STAGE}.prm_tokenizer_path (the PRM's chat template)` });
      this.tokenizer = ChatTokenizer.load(s.tokenizerPath);
      this.apiKey = null;
    } else {
      this.tokenizer = null;
      const name = s.apiKeyEnv;
      const key = name === null ? undefined : process.env[name];
      // The config loader asks for the variable (recipe.ts crossCheck for the stack's own engines);
      // settings built another way get the same message naming the key.
      if (name === null) throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${STAGE}.prm_api openai needs ${STAGE}.prm_api_key_env (the environment variable holding the PRM's API key)` });
      if (key === undefined || key === '') throw new ReefError('REEF_ERR_CONFIG_INVALID', { details: `${STAGE}.prm_api openai: environment variable ${name} (${STAGE}.prm_api_key_env) is not set` });
      this.apiKey = key;
    }
  }

  async call(prompt: string, opts: { rid: string; signal?: AbortSignal }): Promise<{ text: string; url: string }> {
    const deadline = AbortSignal.timeout(this.s.timeoutMs);
    const signal = opts.signal === undefined ? deadline : AbortSignal.any([deadline, opts.signal]);
    // Only the prompt on the wire is masked: the judgment keeps the PRM's reply, the record the original.
    const messages = [{ role: 'user', content: this.redactor === null ? prompt : this.redactor.redact(prompt).text }];
    const rendered = this.api === 'sglang' ? this.tokenizer!.render(normalizeMessages(messages), null) : null;
    // A template that opens the reasoning block in the prompt (Qwen3 Thinking, R1-style) has the
    // reply continue it: without its `<think>` in front, reasoning cut off at max_new_tokens would
    // read as the answer, its "\boxed{0} if I cannot tell" as a vote (votes.ts answerOf).
    const opensThink = rendered !== null && this.tokenizer!.endsInsideBlock(rendered, '<think>', '</think>');
    const [path, body, headers] =
      rendered !== null
        ? ['/generate', {
            input_ids: Array.from(rendered.ids),
            sampling_params: { temperature: this.s.temperature, max_new_tokens: this.s.maxTokens },
            rid: opts.rid,
            stream: false,
          }, {}]
        : ['/v1/chat/completions', { model: this.s.model, messages, temperature: this.s.temperature, max_tokens: this.s.maxTokens, stream: false }, { authorization: `Bearer ${this.apiKey}` }];
    const json = JSON.stringify(body);
    // One engine of several down, restarting or turning calls away: the call goes on to the next
    // one within its deadline, rather than being a failed vote of each turn for as long.
    const first = this.next++;
    for (let k = 1; ; k++) {
      const url = this.s.urls[(first + k - 1) % this.s.urls.length]!;
      try {
        const text = await this.post(url, path, json, headers, signal, deadline);
        return { text: opensThink ? `<think>${text}` : text, url };
      } catch (err) {
        const down = err instanceof ReefError && err.code === 'REEF_ERR_ENGINE_DOWN';
        if (!down || k >= this.s.urls.length || signal.aborted) throw err;
      }
    }
  }

  private async post(url: string, path: string, json: string, headers: Record<string, string>, signal: AbortSignal, deadline: AbortSignal): Promise<string> {
    let status: number;
    let raw: string;
    try {
      const res = await request(url.replace(/\/+$/, '') + path, {
        method: 'POST',
        dispatcher: this.agent,
        headers: { 'content-type': 'application/json', ...headers },
        body: json,
        signal,
      });
      status = res.statusCode;
      raw = await res.body.text();
    } catch (err) {
      if (deadline.aborted) throw new ReefError('REEF_ERR_TIMEOUT', { what: `PRM ${path} at ${url}`, ms: this.s.timeoutMs });
      throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: url, reason: (err as Error).message }, { cause: err });
    }
    // "Not now" (overloaded, rate-limited, a proxy in front of a restarting PRM): unreachable for
    // this turn, which then goes back to the judge rather than into the log as dropped (voter.ts).
    if (NOT_NOW.has(status)) throw new ReefError('REEF_ERR_ENGINE_DOWN', { engine: url, reason: `${path} answered ${status}: ${raw.slice(0, 300)}` });
    if (status >= 400) throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: url, reason: `${path} answered ${status}: ${raw.slice(0, 300)}` });
    return extractText(this.api, raw, url);
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}

function extractText(api: 'sglang' | 'openai', raw: string, url: string): string {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch {
    throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: url, reason: `reply is not JSON: ${raw.slice(0, 200)}` });
  }
  let text: unknown;
  if (api === 'sglang') text = (body as { text?: unknown }).text;
  else {
    const message = (body as { choices?: { message?: { content?: unknown; reasoning_content?: unknown; reasoning?: unknown } }[] }).choices?.[0]?.message;
    text = message?.content;
    // A server with a reasoning parser answers a reply cut off in its reasoning with no content:
    // a reply without a verdict (an invalid vote), not a failed call.
    const reasoning = message?.reasoning_content ?? message?.reasoning;
    if ((text === null || text === undefined) && typeof reasoning === 'string') text = `<think>${reasoning}`;
  }
  if (typeof text !== 'string') throw new ReefError('REEF_ERR_ENGINE_FAILED', { engine: url, reason: `reply has no text: ${raw.slice(0, 200)}` });
  return text;
}
