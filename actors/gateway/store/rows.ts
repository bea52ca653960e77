import { endianness } from 'node:os';
import { ReefError } from '../../runtime/errors.js';
import { SCENARIO_RE } from '../../runtime/scenario-name.js';
import { parseChatRequest } from '../openai-schema.js';
import { chunk, type Chunk, type Chunked, type ChunkMemo, REF_BYTES } from './chunks.js';
import { isId } from './ids.js';
import type { AgentRecord, ChatBody, NewRecord, RecordRequest, RecordSummary, StagedPayloads } from './types.js';

/** Conversion between records and SQLite rows: token arrays as raw little-endian BLOBs. */

// Typed arrays are stored as their in-memory bytes; that is only little-endian on an LE host.
if (endianness() !== 'LE') throw new Error('the record store needs a little-endian host');

export { SCENARIO_RE };

export function checkScenarioName(name: unknown): string {
  if (typeof name !== 'string' || !SCENARIO_RE.test(name)) {
    throw invalid(`scenario name ${JSON.stringify(name)} must match ${SCENARIO_RE.source}`);
  }
  return name;
}

export function invalid(details: string): ReefError {
  return new ReefError('REEF_ERR_INVALID_ARGUMENT', { details });
}

/** Row values in the column order of `INSERT_RECORD_SQL`, and the chunks the row refers to. */
export interface RecordRow {
  values: (string | number | Buffer | null)[];
  chunks: Chunk[];
}

export const INSERT_RECORD_SQL = `INSERT INTO records (id, scenario, status, started_at, finished_at, latency_ms, engine,
  weight_version, finish_reason, prompt_tokens, completion_tokens, top_k, error, tags, request, response,
  prompt_ids, output_ids, logprobs, topk_ids, topk_logprobs, request_chunks, prompt_chunks, request_form, chunk_ref_bytes, key_id)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS TEXT), ?, ?, ?, ?, ?, ?, ?, ?, ?, ${REF_BYTES}, ?)`;

export const INSERT_CHUNK_SQL = 'INSERT OR IGNORE INTO chunks (hash, data) VALUES (?, ?)';

export const SUMMARY_COLUMNS = `seq, id, scenario, status, started_at, finished_at, latency_ms, engine, weight_version,
  finish_reason, prompt_tokens, completion_tokens, top_k, error, tags, request, response, request_chunks, request_form, chunk_ref_bytes, key_id`;
export const FULL_COLUMNS = `${SUMMARY_COLUMNS}, prompt_ids, output_ids, logprobs, topk_ids, topk_logprobs, prompt_chunks`;

/** The array's bytes, not copied: `append` owns the arrays it is given (see NewRecord). */
function blob(arr: Int32Array | Float32Array | Uint8Array): Buffer {
  return Buffer.from(arr.buffer, arr.byteOffset, arr.byteLength);
}

function typed<T>(value: unknown, ctor: abstract new (...args: never[]) => T, field: string): T {
  if (!(value instanceof ctor)) throw invalid(`record.${field} must be a ${ctor.name}`);
  return value;
}

function finite(value: unknown, field: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) throw invalid(`record.${field} must be a finite number`);
  return value;
}

/** ms since the epoch: the columns are INTEGER, and STRICT refuses a fraction only at commit. */
function millis(value: unknown, field: string): number {
  if (!Number.isSafeInteger(value)) throw invalid(`record.${field} must be an integer (ms since the epoch)`);
  return value as number;
}

/**
 * `value` as JSON text, or REEF_ERR_INVALID_ARGUMENT naming `what`: JSON.stringify throws a bare
 * TypeError on a BigInt (msgpack decodes an integer past 2^53 to one) or a cycle.
 */
export function jsonText(value: unknown, what: string): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(value);
  } catch {
    text = undefined;
  }
  if (text === undefined) throw invalid(`${what} must be JSON-serialisable`);
  return text;
}

const json = (value: unknown, field: string): string => jsonText(value, `record.${field}`);

function count(value: unknown, field: string): number {
  if (!Number.isSafeInteger(value) || (value as number) < 0) throw invalid(`record.${field} must be a non-negative integer`);
  return value as number;
}

function text(value: unknown, field: string, nullable: boolean): string | null {
  if (value === null && nullable) return null;
  if (typeof value !== 'string') throw invalid(`record.${field} must be a string${nullable ? ' or null' : ''}`);
  return value;
}

/** Principal ids are short and printable (auth.ts); anything else is a caller's bug, not an id. */
const KEY_ID_RE = /^[\x21-\x7e]{1,64}$/;

export function keyId(value: unknown, what = 'record.keyId'): string | null {
  if (value === null) return null;
  if (typeof value !== 'string' || !KEY_ID_RE.test(value)) throw invalid(`${what} must be 1 to 64 printable ASCII characters without spaces, or null`);
  return value;
}

/**
 * The request column. Serialised requests come from the gateway's own workers, so the check is of
 * shape, not a re-parse: parsing 40 KB per record is the cost the workers exist to save.
 */
const REQUEST_HEAD = '{"messages":[';
const REQUEST_HEAD_BYTES = Buffer.from(REQUEST_HEAD);

/** The request column's forms (schema step 4). */
const REQUEST_FORM = { reef: 0, chatBody: 1 } as const;

/**
 * The request as UTF-8 bytes, what chunking cuts and the INSERT casts to text (`CAST(? AS TEXT)`),
 * and which form they are in.
 */
function requestBytes(request: NewRecord['request']): { bytes: Buffer; form: number } {
  if (isChatBody(request)) {
    if (!(request.chatBody instanceof Uint8Array)) throw invalid('record.request.chatBody must be a Uint8Array');
    const bytes = blob(request.chatBody);
    // The gateway parsed these bytes as a JSON object before it got here (after a byte-order mark,
    // which its decoder drops, and JSON whitespace); a cheap shape check.
    if (bytes[firstJsonByte(bytes)] !== 0x7b) throw invalid('record.request.chatBody must be the UTF-8 JSON of a chat-completion request');
    return { bytes, form: REQUEST_FORM.chatBody };
  }
  return { bytes: requestJsonBytes(request), form: REQUEST_FORM.reef };
}

/**
 * Where the JSON value starts: after a byte-order mark and any amount of JSON whitespace, as
 * JSON.parse takes it (a check of the first 64 bytes refused bodies the gateway had served).
 */
function firstJsonByte(bytes: Buffer): number {
  let i = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf ? 3 : 0;
  while (bytes[i] === 0x20 || bytes[i] === 0x09 || bytes[i] === 0x0a || bytes[i] === 0x0d) i++;
  return i;
}

function isChatBody(request: NewRecord['request']): request is ChatBody {
  return request !== null && typeof request === 'object' && 'chatBody' in request;
}

function requestJsonBytes(request: Exclude<NewRecord['request'], ChatBody>): Buffer {
  if (typeof request === 'string') {
    if (!request.startsWith(REQUEST_HEAD)) throw invalid('record.request as text must be the JSON of {messages, tools, params}');
    return Buffer.from(request);
  }
  if (request instanceof Uint8Array) {
    const bytes = blob(request);
    if (!bytes.subarray(0, REQUEST_HEAD_BYTES.length).equals(REQUEST_HEAD_BYTES)) throw invalid('record.request as bytes must be the UTF-8 JSON of {messages, tools, params}');
    return bytes;
  }
  if (request === null || typeof request !== 'object' || !Array.isArray(request.messages)) {
    throw invalid('record.request must be {messages, tools, params}');
  }
  return Buffer.from(json({ messages: request.messages, tools: request.tools ?? null, params: request.params ?? {} }, 'request'));
}

/** The chunked request and prompt ids of one record, and what they were made from. */
interface Payloads extends StagedPayloads {
  request: NewRecord['request'];
  promptIds: Int32Array;
  form: number;
  requestChunks: Chunked;
  promptChunks: Chunked;
}

/**
 * Cuts a record's request and prompt ids into chunks (chunks.ts); throws REEF_ERR_INVALID_ARGUMENT.
 * `whole` also puts their tails into chunks: for payloads staged ahead of their record.
 */
export function chunkPayloads(request: NewRecord['request'], promptIds: Int32Array, memo: ChunkMemo | null, whole = false): Payloads {
  const { bytes, form } = requestBytes(request);
  const ids = typed(promptIds, Int32Array, 'promptIds');
  return {
    __staged: true, request, promptIds: ids, form,
    requestChunks: chunk(bytes, { utf8: true, memo, whole }),
    promptChunks: chunk(blob(ids), { utf8: false, memo, whole }),
  };
}

/** Every chunk of staged payloads: what `SqliteStore.stage` writes ahead of the record. */
export function stagedChunks(staged: StagedPayloads): Chunk[] {
  const p = staged as Payloads;
  return [...p.requestChunks.chunks, ...p.promptChunks.chunks];
}

function sameRequest(a: NewRecord['request'], b: NewRecord['request']): boolean {
  return a === b || (isChatBody(a) && isChatBody(b) && a.chatBody === b.chatBody);
}

/** Checks a record completely and turns it into a row; throws REEF_ERR_INVALID_ARGUMENT. */
export function toRow(r: NewRecord, id: string, memo: ChunkMemo | null = null): RecordRow {
  if (!isId(id)) throw invalid(`record.id ${JSON.stringify(id)} is not a 26-char Crockford base32 id`);
  checkScenarioName(r.scenario);
  if (r.status !== 'ok' && r.status !== 'aborted' && r.status !== 'failed') {
    throw invalid(`record.status must be ok, aborted or failed, got ${JSON.stringify(r.status)}`);
  }
  if (r.tags === null || typeof r.tags !== 'object' || Array.isArray(r.tags) || Object.values(r.tags).some((v) => typeof v !== 'string')) {
    throw invalid('record.tags must map names to strings');
  }
  // Staged payloads are used only for the very bytes and ids they were cut from.
  const staged = r.staged as Payloads | null | undefined;
  const payloads = staged && staged.promptIds === r.promptIds && sameRequest(staged.request, r.request) ? staged : chunkPayloads(r.request, r.promptIds, memo);
  const { form, requestChunks: request, promptChunks: prompt } = payloads;
  const outputIds = typed(r.outputIds, Int32Array, 'outputIds');
  const logprobs = typed(r.logprobs, Float32Array, 'logprobs');
  const topkIds = typed(r.topkIds, Int32Array, 'topkIds');
  const topkLogprobs = typed(r.topkLogprobs, Float32Array, 'topkLogprobs');
  const k = count(r.topK, 'topK');
  const n = outputIds.length;
  if (logprobs.length !== n) throw invalid(`record.logprobs has ${logprobs.length} entries for ${n} output tokens`);
  if (topkIds.length !== n * k || topkLogprobs.length !== n * k) {
    throw invalid(`record.topkIds/topkLogprobs must hold ${n}×${k} entries, got ${topkIds.length}/${topkLogprobs.length}`);
  }
  const values = [
    id,
    r.scenario,
    r.status,
    millis(r.startedAt, 'startedAt'),
    millis(r.finishedAt, 'finishedAt'),
    finite(r.latencyMs, 'latencyMs'),
    text(r.engine, 'engine', false),
    text(r.weightVersion, 'weightVersion', true),
    text(r.finishReason, 'finishReason', true),
    count(r.usage?.promptTokens, 'usage.promptTokens'),
    count(r.usage?.completionTokens, 'usage.completionTokens'),
    k,
    text(r.error, 'error', true),
    JSON.stringify(r.tags),
    request.tail,
    json(r.response ?? null, 'response'),
    prompt.tail,
    blob(outputIds),
    blob(logprobs),
    blob(topkIds),
    blob(topkLogprobs),
    request.refs,
    prompt.refs,
    form,
    keyId(r.keyId),
  ];
  return { values, chunks: [...request.chunks, ...prompt.chunks] };
}

/** A typed view of a BLOB, copied when SQLite's buffer is not 4-byte aligned. */
function view<T>(bytes: Buffer, ctor: { new (buf: ArrayBufferLike, offset: number, length: number): T }): T {
  const aligned = bytes.byteOffset % 4 === 0 ? bytes : Buffer.from(bytes);
  return new ctor(aligned.buffer, aligned.byteOffset, aligned.byteLength / 4);
}

/** Row shapes as read, chunk references included; `SqliteStore` resolves them (`expandRow`). */
export interface SummaryRowShape {
  seq: number;
  id: string;
  scenario: string;
  status: RecordSummary['status'];
  started_at: number;
  finished_at: number;
  latency_ms: number;
  engine: string;
  weight_version: string | null;
  finish_reason: string | null;
  prompt_tokens: number;
  completion_tokens: number;
  top_k: number;
  error: string | null;
  tags: string;
  request: string;
  response: string;
  request_chunks: Buffer | null;
  request_form: number;
  /** Digest bytes per chunk reference: 16 in rows written before schema step 5, REF_BYTES after. */
  chunk_ref_bytes: number;
  key_id: string | null;
}

export interface FullRowShape extends SummaryRowShape {
  prompt_ids: Buffer;
  output_ids: Buffer;
  logprobs: Buffer;
  topk_ids: Buffer;
  topk_logprobs: Buffer;
  prompt_chunks: Buffer | null;
}

function withoutBom(text: string, bom: string): string {
  return text.startsWith(bom) ? text.slice(bom.length) : text;
}

/**
 * A stored chat-completion body as `{messages, tools, params}`, exactly as the gateway split it when
 * it served the request: the same schema parse (which also fills defaults such as a tool call's
 * `type`), messages and tools apart, every other field a parameter.
 */
export function requestOfChatBody(json: string): RecordRequest {
  const body = JSON.parse(withoutBom(json, '\ufeff')) as Record<string, unknown>;
  const parsed = parseChatRequest(body);
  // Only bodies that passed this parse are stored; a later, stricter schema must not make old
  // records unreadable, so those are split as they are.
  const req = parsed.ok ? (parsed.value as Record<string, unknown>) : body;
  const { messages, tools, ...params } = req;
  return { messages: Array.isArray(messages) ? messages : [], tools: Array.isArray(tools) ? tools : null, params };
}

export function toSummary(row: SummaryRowShape): RecordSummary {
  return {
    id: row.id,
    offset: row.seq,
    scenario: row.scenario,
    keyId: row.key_id,
    tags: JSON.parse(row.tags) as Record<string, string>,
    status: row.status,
    startedAt: row.started_at,
    finishedAt: row.finished_at,
    request: row.request_form === REQUEST_FORM.chatBody ? requestOfChatBody(row.request) : (JSON.parse(row.request) as RecordRequest),
    topK: row.top_k,
    finishReason: row.finish_reason,
    usage: { promptTokens: row.prompt_tokens, completionTokens: row.completion_tokens },
    weightVersion: row.weight_version,
    engine: row.engine,
    latencyMs: row.latency_ms,
    error: row.error,
    response: JSON.parse(row.response) as unknown,
  };
}

export function toRecord(row: FullRowShape): AgentRecord {
  return {
    ...toSummary(row),
    promptIds: view(row.prompt_ids, Int32Array),
    outputIds: view(row.output_ids, Int32Array),
    logprobs: view(row.logprobs, Float32Array),
    topkIds: view(row.topk_ids, Int32Array),
    topkLogprobs: view(row.topk_logprobs, Float32Array),
  };
}
