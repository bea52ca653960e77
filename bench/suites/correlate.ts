import v8 from 'node:v8';
import vm from 'node:vm';
import { Correlator } from '../../actors/judge/correlate/correlator.js';
import type { CorrelationRecord } from '../../actors/judge/correlate/types.js';
import { type BenchContext, type BenchRow, type BenchSuite, toRow } from '../lib.js';

/**
 * Correlation throughput and memory on OpenClaw-sized traffic: a 30k-character system prompt,
 * conversations growing to 20 turns (41 messages), CONCURRENT conversations interleaved
 * round-robin, one record per ms of record time (so with the default TTL of 900 s and 4096 open
 * sessions, finished conversations are evicted and memory is measured at the cap).
 *
 * - `REEF_BENCH_CORRELATE_N` requests per mode (@default 1_000_000).
 * - The generator reuses message objects (as the brief asks), so the correlator's hash memo sees
 *   the same strings again; the `fresh JSON` rows parse every request from text, as the judge does
 *   with records read from the store, and show what that costs on top.
 * - Memory: heap after a full GC with the correlator alive and its hash memo dropped (the memo is
 *   a bounded cache of message text, reported apart), minus the heap before the run, divided by
 *   the open sessions: an upper bound on bytes per open session.
 */
const TURNS = 20;
const CONCURRENT = 1000;
const SYSTEM = 'You are OpenClaw, a personal agent with tools for files, web and memory. '.repeat(420).slice(0, 30_000);

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

function heap(): number {
  gc();
  gc();
  return process.memoryUsage().heapUsed;
}

type Msg = { role: string; content: string };

/** Yields `n` records of interleaved conversations; `tagged` sets `x-reef-tag-session`. */
function* traffic(n: number, tagged: boolean): Generator<CorrelationRecord> {
  const system: Msg = { role: 'system', content: SYSTEM };
  const convs: { id: number; tag: string; msgs: Msg[]; turn: number }[] = [];
  let nextConv = 0;
  const start = (): { id: number; tag: string; msgs: Msg[]; turn: number } => {
    const id = nextConv++;
    const msgs: Msg[] = [system];
    for (let t = 0; t < TURNS; t++) {
      msgs.push({ role: 'user', content: `conversation ${id}, turn ${t}: please look at the file and tell me what the function on line ${t * 7} does, briefly.` });
      msgs.push({ role: 'assistant', content: `In conversation ${id} at turn ${t}, the function reads the config, validates every key and returns a frozen object; nothing else.` });
    }
    return { id, tag: `conv-${id}`, msgs, turn: 0 };
  };
  for (let i = 0; i < CONCURRENT; i++) convs.push(start());
  for (let i = 0; i < n; i++) {
    const slot = i % CONCURRENT;
    let c = convs[slot]!;
    if (c.turn === TURNS) c = convs[slot] = start();
    const len = 2 * c.turn + 2;
    c.turn++;
    yield {
      id: `r${i}`,
      offset: i + 1,
      scenario: 'bench',
      keyId: 'open',
      tags: tagged ? { session: c.tag } : {},
      status: 'ok',
      finishedAt: i,
      request: { messages: c.msgs.slice(0, len) },
      response: c.msgs[len]!,
    };
  }
}

function timed(n: number, tagged: boolean, each: (r: CorrelationRecord) => void): { ops: number; seconds: number; latenciesUs: number[] } {
  const t0 = performance.now();
  for (const r of traffic(n, tagged)) each(r);
  return { ops: n, seconds: (performance.now() - t0) / 1000, latenciesUs: [] };
}

function mapBaseline(n: number, tagged: boolean): BenchRow {
  const map = new Map<string, number>();
  const m = timed(n, tagged, (r) => {
    // The least a correlator can do: one keyed insert per record, bounded like the session table.
    const key = r.tags.session ?? r.id;
    map.delete(key);
    map.set(key, r.offset);
    if (map.size > 4096) map.delete(map.keys().next().value!);
  });
  return toRow(`${tagged ? 'tag mode' : 'fallback'}, ${n} requests`, 'Map insert baseline (+ generator)', m);
}

function correlatorRow(n: number, tagged: boolean, log: (l: string) => void): BenchRow {
  const before = heap();
  // Held through an object so that dropping it really frees it (a closure would keep it alive).
  const held: { c: Correlator | null } = { c: new Correlator() };
  let turns = 0;
  const m = timed(n, tagged, (r) => {
    for (const e of held.c!.observe(r)) if (e.kind === 'turn-finished') turns++;
  });
  const withMemo = heap();
  held.c!.clearHashMemo();
  const sessionsOnly = heap();
  const open = held.c!.openSessions;
  const counters = held.c!.counters();
  held.c = null;
  // Heap growth over the run with the memo dropped: an upper bound on what the sessions hold.
  const perSession = Math.round((sessionsOnly - before) / Math.max(1, open));
  log(`${tagged ? 'tag' : 'fallback'}: ${turns} turns, ${open} open sessions, ${perSession} B per open session, hash memo ${((withMemo - sessionsOnly) / 1e6).toFixed(1)} MB, heap delta vs start ${((withMemo - before) / 1e6).toFixed(1)} MB; counters ${JSON.stringify(counters)}`);
  return toRow(`${tagged ? 'tag mode' : 'fallback'}, ${n} requests`, `correlator (${perSession} B/open session, ${open} open)`, m);
}

/** Every request parsed from JSON text first, as records come out of the store. */
function freshRows(n: number, tagged: boolean): BenchRow[] {
  const texts: string[] = [];
  for (const r of traffic(n, tagged)) texts.push(JSON.stringify(r));
  const parseOnly = (() => {
    const t0 = performance.now();
    let x = 0;
    for (const t of texts) x += (JSON.parse(t) as CorrelationRecord).offset;
    if (x < 0) throw new Error('unreachable');
    return { ops: n, seconds: (performance.now() - t0) / 1000, latenciesUs: [] };
  })();
  const c = new Correlator();
  const t0 = performance.now();
  for (const t of texts) c.observe(JSON.parse(t) as CorrelationRecord);
  const both = { ops: n, seconds: (performance.now() - t0) / 1000, latenciesUs: [] };
  const name = `${tagged ? 'tag mode' : 'fallback'}, ${n} requests, fresh JSON`;
  return [toRow(name, 'JSON.parse only', parseOnly), toRow(name, 'JSON.parse + correlator', both)];
}

export const suite: BenchSuite = {
  name: 'correlate',
  description: 'session correlation: tag mode and transcript fallback, 30k-char system prompt, 20-turn conversations',
  async run(ctx: BenchContext): Promise<BenchRow[]> {
    const n = Number(process.env.REEF_BENCH_CORRELATE_N ?? 1_000_000);
    if (!Number.isInteger(n) || n < CONCURRENT) throw new Error(`REEF_BENCH_CORRELATE_N must be an integer ≥ ${CONCURRENT}, got ${process.env.REEF_BENCH_CORRELATE_N}`);
    const rows: BenchRow[] = [];
    for (const tagged of [true, false]) {
      rows.push(mapBaseline(n, tagged));
      rows.push(correlatorRow(n, tagged, ctx.log));
      rows.push(...freshRows(Math.min(n, 5000), tagged));
    }
    return rows;
  },
};
