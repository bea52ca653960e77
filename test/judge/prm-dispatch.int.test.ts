import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SqliteStore } from '../../actors/gateway/store/sqlite-store.js';
import type { NewRecord } from '../../actors/gateway/store/types.js';
import { ChatTokenizer } from '../../actors/gateway/tokenize/index.js';
import { RpcClient } from '../../actors/runtime/rpc.js';
import { repoRoot, tinyModelDir } from '../../cluster/paths.js';
import { Supervisor } from '../../cluster/supervisor.js';
import { startFakeEngine, type FakeEngine } from '../helpers/fake-engine.js';
import { testConfig } from '../helpers/stack.js';
import { pidAlive, waitFor } from '../helpers/wait.js';
import { conversation, interleave, replyText } from './conversations.js';

/**
 * The judging stage for real: a judge actor and PRM actor processes under the real supervisor,
 * a fake PRM engine, records written into the real store. One PRM actor is killed mid-vote, one is
 * added, the judge itself is killed mid-stream and restarted: every bound turn must end up judged
 * exactly once.
 */

const root = repoRoot();
const HINT = 'Keep answers short and in plain prose.';
const tokenizer = ChatTokenizer.load(tinyModelDir());

beforeAll(() => {
  // Actors run from dist/; tsc emits even when unrelated files do not typecheck.
  try {
    execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json'], { cwd: root, stdio: 'pipe' });
  } catch {
    // checked below
  }
  for (const name of ['judge', 'prm']) if (!existsSync(join(root, 'dist', 'actors', name, 'main.js'))) throw new Error(`dist/actors/${name}/main.js was not built`);
}, 180_000);

/** The PRM's verdict: the prompt's "what came next" decides; thanks → accepted (with a hint). */
function prmReply(prompt: string): string {
  const accepted = /What came next[^\n]*\n\s*Thanks/.test(prompt);
  if (prompt.includes('Your task: write the short instruction')) return accepted ? `Looking back... [HINT_START]${HINT}[HINT_END]\n\\boxed{1}` : 'Nothing to go on. \\boxed{-1}';
  return accepted ? 'The user moved on. \\boxed{1}' : 'The user asked for a redo. \\boxed{-1}';
}

function promptOf(req: { inputIds: number[] | null; messages: unknown[] | null }): string {
  if (req.messages !== null) return String((req.messages[0] as { content: string }).content);
  return tokenizer.decode(req.inputIds ?? []);
}

describe.each(['sglang', 'openai'] as const)('judge + PRM actors against a %s PRM', (api) => {
  let engine: FakeEngine;
  let sup: Supervisor;
  let store: SqliteStore;
  let dir: string;
  const lines: string[] = [];
  const pids = new Set<number>();
  const clients: RpcClient[] = [];
  const slow = { armed: true, seen: 0 };
  const auth = new Set<string>();
  const slowTurn = replyText(0, 0);

  const client = (endpoint: string): RpcClient => {
    const rpc = new RpcClient(endpoint, { defaultTimeoutMs: 5000, log: () => {} });
    clients.push(rpc);
    return rpc;
  };
  const remember = (): void => {
    for (const a of sup.status()) if (a.pid !== null) pids.add(a.pid);
  };
  const write = async (records: NewRecord[]): Promise<string[]> => {
    const ids: string[] = [];
    for (const r of records) ids.push((await store.append(r)).id);
    return ids;
  };

  beforeAll(async () => {
    engine = await startFakeEngine({
      respond: (req) => ({ pieces: [prmReply(promptOf(req))] }),
      delayMs: (req) => {
        const auth0 = req.headers.authorization;
        if (typeof auth0 === 'string') auth.add(auth0);
        if (!slow.armed || !promptOf(req).includes(slowTurn)) return 0;
        slow.seen++;
        return 120_000;
      },
    });
    const cfg = testConfig((c) => {
      c.cluster.prm.replicas = 0;
      Object.assign(c.pipeline.record2record.config, {
        prm_url: engine.url,
        prm_api: api,
        prm_model: api === 'openai' ? 'fake-prm' : null,
        prm_api_key_env: api === 'openai' ? 'REEF_TEST_PRM_KEY' : null,
        prm_m: 3,
        prm_concurrency: 6,
        prm_timeout_s: 60,
        prm_max_tokens: 64,
        prm_temperature: 0.3,
      });
    });
    dir = cfg.dir;
    mkdirSync(join(dir, 'data'), { recursive: true });
    store = SqliteStore.open(join(dir, 'data', 'records.sqlite'));
    sup = new Supervisor({
      actors: { judge: 1, prm: 3 },
      configPath: cfg.path,
      heartbeatMs: 250,
      missedHeartbeats: 12,
      backoff: { initialMs: 200 },
      env: { REEF_JUDGE_LEASE_MS: '1500', REEF_TEST_PRM_KEY: 'sk-test-key' },
      log: (l) => lines.push(l),
    });
    await sup.start();
    remember();
  }, 60_000);

  afterAll(async () => {
    for (const rpc of clients) await rpc.close();
    await sup?.stop();
    for (const pid of pids) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
    await store?.close();
    await engine?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('judges every bound turn exactly once through a PRM kill, a scale-up and a judge crash', async () => {
    // Batch 1: six conversations of three requests → twelve finished turns.
    const convs = Array.from({ length: 6 }, (_, c) => conversation(c, 5));
    const turnIds: string[] = [];
    const ids1 = await write(interleave(convs.map((c) => c.slice(0, 3))));
    // Request i of a conversation finishes turn i-1: the turns are each conversation's first two.
    for (let k = 0; k < ids1.length - 6; k++) turnIds.push(ids1[k]!);

    // One PRM actor is mid-vote on the slow turn: kill it.
    await waitFor(() => slow.seen > 0, { what: 'a PRM call for the slow turn', timeoutMs: 30_000 });
    const holder = await waitFor(async () => {
      for (const a of sup.status().filter((x) => x.name === 'prm' && x.mailbox !== null)) {
        const st = await client(a.mailbox!).call<{ held: string[] }>({ type: 'prm-status' });
        if (st.held.includes(turnIds[0]!)) return a;
      }
      return null;
    }, { what: 'the PRM actor holding the slow turn' });
    process.kill(holder.pid!, 'SIGKILL');
    slow.armed = false;

    // Scale up while the stream goes on.
    expect(await sup.scale('prm', 4)).toEqual({ before: 3, after: 4 });
    remember();

    // Batch 2 continues the conversations; kill the judge once some of it is judged.
    const ids2 = await write(interleave(convs.map((c) => c.slice(3, 4))));
    turnIds.push(...ids1.slice(ids1.length - 6));
    await waitFor(async () => (await store.judgedHeadOffset()) >= 13, { what: 'part of batch 2 judged', timeoutMs: 60_000 });
    const judge = sup.status().find((a) => a.name === 'judge')!;
    process.kill(judge.pid!, 'SIGKILL');
    const ids3 = await write(interleave(convs.map((c) => c.slice(4, 5))));
    turnIds.push(...ids2);
    await waitFor(() => {
      const j = sup.status().find((a) => a.name === 'judge')!;
      return j.restarts === 1 && j.state === 'running' && j.pid !== judge.pid;
    }, { what: 'the judge to be restarted', timeoutMs: 30_000 });
    remember();

    expect(turnIds.length).toBe(24);
    await waitFor(async () => (await store.judgedHeadOffset()) >= turnIds.length, { what: `${turnIds.length} judged turns`, timeoutMs: 90_000 });
    // Give late completions and re-dispatched leases a chance to show up as extra rows.
    const judgeNow = sup.status().find((a) => a.name === 'judge')!;
    await waitFor(async () => {
      const st = await client(judgeNow.mailbox!).call<{ stats: Record<string, number> }>({ type: 'judge-status' });
      return st.stats.pending === 0 && st.stats.next_offset === ids3.length + ids2.length + ids1.length + 1 ? st : null;
    }, { what: 'the judge to have nothing pending' });

    const rows = await store.readJudgedTurns(0, 1000);
    expect(rows.length).toBe(turnIds.length);
    expect(new Set(rows.map((r) => r.turnRecordId))).toEqual(new Set(turnIds));
    const status = await client(judgeNow.mailbox!).call<{ stats: Record<string, number> }>({ type: 'judge-status' });
    expect(status.stats.bound).toBe(turnIds.length);

    for (const row of rows) {
      const j = (await store.getJudgment(row.turnRecordId)) as Record<string, any>;
      const accepted = j.nextState.content.startsWith('Thanks');
      expect(row).toMatchObject(accepted ? { decision: 'hint', reward: 1, teacherCandidates: [HINT] } : { decision: 'anchor', reward: -1, teacherCandidates: [null] });
      expect(j.score.votes).toEqual(accepted ? [1, 1, 1] : [-1, -1, -1]);
      expect(j.score.outputs).toHaveLength(3);
      expect(j.hint.hints).toEqual(accepted ? [HINT] : []);
      expect(j).toMatchObject({ decision: row.decision, votesOk: 6, votesFailed: 0, prm: { api, url: engine.url } });
    }
    // The slow turn was voted on again after its first holder died: its 6 calls, plus the
    // killed actor's that never returned.
    const slowCalls = engine.requests.filter((b) => promptOf({ inputIds: (b.input_ids as number[]) ?? null, messages: (b.messages as unknown[]) ?? null }).includes(slowTurn));
    expect(slowCalls.length).toBeGreaterThanOrEqual(6 + slow.seen);
    expect(slow.seen).toBeGreaterThan(0);
    expect(lines.some((l) => l.includes(`restarted ${holder.id} (exit signal SIGKILL)`))).toBe(true);

    // What went to the engine: the configured sampling, model and key.
    const bodies = engine.requests;
    if (api === 'sglang') {
      expect(bodies.every((b) => Array.isArray(b.input_ids) && (b.sampling_params as any).temperature === 0.3 && (b.sampling_params as any).max_new_tokens === 64)).toBe(true);
    } else {
      expect(bodies.every((b) => b.model === 'fake-prm' && b.temperature === 0.3 && b.max_tokens === 64)).toBe(true);
      expect([...auth]).toEqual(['Bearer sk-test-key']);
    }
    expect(lines.some((l) => /judge-0.*resumed at offset \d+/.test(l))).toBe(true);
  }, 240_000);

  it('a drained PRM actor exits cleanly and the others keep the stage going', async () => {
    expect(await sup.scale('prm', 2)).toEqual({ before: 4, after: 2 });
    const more = await write(conversation(50, 2));
    await waitFor(async () => (await store.judgedTurnIds([more[0]!])).size === 1, { what: 'the new turn judged', timeoutMs: 30_000 });
    expect(lines.some((l) => l.includes('sending SIGTERM'))).toBe(false);
  }, 60_000);
});
