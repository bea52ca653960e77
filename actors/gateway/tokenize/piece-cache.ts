import { createHash } from 'node:crypto';

/** Pieces shorter than this are their own key; longer ones are keyed by a digest to bound key memory. */
const INLINE_KEY_CHARS = 96;

export interface PieceCacheStats {
  hits: number;
  misses: number;
  entries: number;
  /** Token ids held, the measure the cache is bounded by. */
  ids: number;
  evictions: number;
}

/**
 * LRU of encoded text pieces (the text between two control tokens), bounded by the total number of
 * ids it holds. A Map keeps insertion order, so re-inserting on a hit makes the first key the least
 * recently used.
 */
export class PieceCache {
  private readonly map = new Map<string, Int32Array>();
  private held = 0;
  private readonly counts = { hits: 0, misses: 0, evictions: 0 };

  /** @param maxIds upper bound of ids held; @default 4_000_000 (16 MB) */
  constructor(private readonly maxIds = 4_000_000) {}

  static keyOf(piece: string): string {
    if (piece.length <= INLINE_KEY_CHARS) return 's' + piece;
    return 'h' + createHash('sha256').update(piece).digest('base64') + piece.length.toString(36);
  }

  getOrEncode(piece: string, encode: (piece: string) => Int32Array): Int32Array {
    const key = PieceCache.keyOf(piece);
    const found = this.map.get(key);
    if (found) {
      this.counts.hits++;
      this.map.delete(key);
      this.map.set(key, found);
      return found;
    }
    this.counts.misses++;
    const ids = encode(piece);
    if (ids.length > this.maxIds) return ids;
    this.map.set(key, ids);
    this.held += ids.length;
    while (this.held > this.maxIds) {
      const oldest = this.map.keys().next().value as string;
      this.held -= this.map.get(oldest)!.length;
      this.map.delete(oldest);
      this.counts.evictions++;
    }
    return ids;
  }

  clear(): void {
    this.map.clear();
    this.held = 0;
  }

  stats(): PieceCacheStats {
    return { ...this.counts, entries: this.map.size, ids: this.held };
  }
}
