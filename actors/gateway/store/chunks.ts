import { createHash } from 'node:crypto';

/**
 * Shared prefixes stored once. An agent like OpenClaw resends its whole transcript every turn, so
 * turn n+1's prompt ids and request JSON begin with turn n's: a 30k-character system prompt and
 * 20k+ prompt ids, ~130 KB per record, written again every turn. Large payloads are therefore cut
 * into fixed-size chunks from their start; each full chunk is stored once in `chunks`, keyed by its
 * digest, and the record keeps the list of digests plus the tail after the last full chunk. Chunk
 * boundaries sit at the same offsets in every turn, so a grown transcript shares all of the earlier
 * turn's full chunks and adds only the new ones.
 */

/** 8 KiB: 2,048 prompt ids, or 8 KiB of request JSON. */
export const CHUNK_BYTES = 8192;
/**
 * Digest bytes per chunk reference: the whole SHA-256. Chunks are shared by every scenario and
 * the first writer of an address wins (INSERT OR IGNORE), so an address must be one nobody can
 * make collide: the 128-bit truncation records used before schema step 5 left a collision at
 * 2^64 work, within reach of a tenant who wants its bytes read as another's (security review M8).
 */
export const REF_BYTES = 32;
/** What records written before schema step 5 reference their chunks by (`records.chunk_ref_bytes`). */
export const LEGACY_REF_BYTES = 16;

export interface Chunk {
  hash: Buffer;
  data: Buffer;
  /** Known to be in the store already (ChunkMemo), so the writer need not insert it. */
  stored: boolean;
  /**
   * With `stored`: the chunk-GC generation (schema step 6) at which it was known to be stored. A
   * collection since may have deleted it, so a writer that reads another generation inserts it.
   */
  gen?: number;
  /**
   * The payload's last, partial piece (`chunk` with `whole`). The next turn's payload runs on past
   * it, so its bytes almost never come again: neither looked up in nor kept by the memo.
   */
  last?: true;
}

export interface Chunked {
  /** Digests of the full chunks, concatenated; null when the payload was small enough to keep whole. */
  refs: Buffer | null;
  /** What follows the last full chunk (the whole payload when `refs` is null). */
  tail: Buffer;
  chunks: Chunk[];
}

function digest(data: Buffer): Buffer {
  return createHash('sha256').update(data).digest();
}

/**
 * The chunks this store wrote recently, so that the next turn of a session neither hashes nor
 * re-inserts the prefix it shares with the last one: an OpenClaw-sized record has ~16 chunks, and
 * hashing them all (~0.12 ms) plus one no-op INSERT each (~0.1 ms) cost as much as the chunking
 * saved in writes. A chunk is recognised by a fingerprint and then compared byte for byte, so a
 * reused digest is always the digest of these very bytes. Entries hold copies (8 KiB each), not
 * views that would keep whole request buffers alive.
 */
export class ChunkMemo {
  private readonly byKey = new Map<string, Chunk>();

  /** @param maxEntries LRU bound; @default 2048 (16 MiB) */
  constructor(private readonly maxEntries = 2048) {}

  private static key(data: Buffer): string {
    const n = data.length;
    const mid = n >> 1;
    return `${n}:${data.toString('latin1', 0, 24)}${data.toString('latin1', mid, mid + 24)}${data.toString('latin1', n - 24, n)}`;
  }

  /** The digest of a stored chunk with exactly these bytes, and the GC generation it was stored at, or null. */
  find(data: Buffer): { hash: Buffer; gen: number } | null {
    const key = ChunkMemo.key(data);
    const known = this.byKey.get(key);
    if (known === undefined || !known.data.equals(data)) return null;
    this.byKey.delete(key);
    this.byKey.set(key, known);
    return { hash: known.hash, gen: known.gen ?? 0 };
  }

  /** Call once the transaction that inserted (or found) `chunks` at GC generation `gen` has committed. */
  remember(chunks: readonly Chunk[], gen = 0): void {
    for (const c of chunks) {
      if ((c.stored && c.gen === gen) || c.last) continue;
      this.byKey.set(ChunkMemo.key(c.data), { hash: c.hash, data: Buffer.from(c.data), stored: true, gen });
      if (this.byKey.size > this.maxEntries) this.byKey.delete(this.byKey.keys().next().value as string);
    }
  }
}

/**
 * With `whole`, a tail of at least this many bytes becomes a chunk too. Staged payloads are cut so
 * (SqliteStore.stage): their chunks are written while the engine works, and what stays in the
 * record row is written by the commit the receipt waits for. With an OpenClaw turn's two tails
 * (up to 8 KiB each) in the row, that commit wrote 8–9 WAL pages; without them it writes 4. A
 * shorter tail fits the row's own page.
 */
export const TAIL_CHUNK_MIN_BYTES = 1024;

/**
 * Cuts `bytes` at multiples of CHUNK_BYTES. With `utf8`, each cut moves back to the start of a
 * character, so the tail is valid UTF-8 text on its own (the request column is TEXT); identical
 * prefixes still cut identically. With `whole`, the tail goes into a chunk of its own (marked
 * `last`) when it is at least TAIL_CHUNK_MIN_BYTES, and the row keeps none of the payload.
 */
export function chunk(bytes: Buffer, opts: { utf8: boolean; memo?: ChunkMemo | null; whole?: boolean }): Chunked {
  const chunks: Chunk[] = [];
  let start = 0;
  while (bytes.length - start > CHUNK_BYTES) {
    let end = start + CHUNK_BYTES;
    // 0b10xxxxxx is a continuation byte: back up to the byte that starts the character. A character
    // has at most 3 of them; a longer run is not UTF-8 (the gateway stores a client's body as sent,
    // and its decoder only replaced such bytes) and is cut where it stands: backing up through all
    // of it reached `start` and cut nothing, for ever.
    if (opts.utf8) {
      let back = end;
      while (back > end - 3 && (bytes[back]! & 0xc0) === 0x80) back--;
      if ((bytes[back]! & 0xc0) !== 0x80) end = back;
    }
    const data = bytes.subarray(start, end);
    const known = opts.memo?.find(data) ?? null;
    chunks.push(known === null ? { hash: digest(data), data, stored: false } : { hash: known.hash, data, stored: true, gen: known.gen });
    start = end;
  }
  if (opts.whole === true && bytes.length - start >= TAIL_CHUNK_MIN_BYTES) {
    const data = bytes.subarray(start);
    chunks.push({ hash: digest(data), data, stored: false, last: true });
    start = bytes.length;
  }
  if (chunks.length === 0) return { refs: null, tail: bytes, chunks };
  return { refs: Buffer.concat(chunks.map((c) => c.hash)), tail: bytes.subarray(start), chunks };
}

/**
 * Puts a chunked payload back together; `lookup` answers a digest with its chunk's bytes. Every
 * chunk is hashed again and must match its address (the first `refBytes` of its SHA-256): a
 * damaged page, or a row that some other writer put under that address, fails here instead of
 * being served as the record's content.
 */
export function unchunk(refs: Buffer, tail: Buffer, lookup: (hash: Buffer) => Buffer | undefined, what: string, refBytes: number = REF_BYTES): Buffer {
  if (refBytes !== REF_BYTES && refBytes !== LEGACY_REF_BYTES) throw new Error(`${what} references chunks by ${refBytes}-byte digests, which this build does not know`);
  if (refs.length % refBytes !== 0) throw new Error(`${what} has a chunk list of ${refs.length} bytes, not a whole number of ${refBytes}-byte digests`);
  const parts: Buffer[] = [];
  for (let o = 0; o < refs.length; o += refBytes) {
    const hash = refs.subarray(o, o + refBytes);
    const data = lookup(hash);
    if (data === undefined) throw new Error(`${what} references chunk ${hash.toString('hex')}, which is not in the store`);
    if (!digest(data).subarray(0, refBytes).equals(hash)) throw new Error(`${what} references chunk ${hash.toString('hex')}, whose stored bytes do not hash to it (damaged, or not the chunk it names)`);
    parts.push(data);
  }
  parts.push(tail);
  return Buffer.concat(parts);
}
