export interface PieceCacheStats {
  hits: number;
  misses: number;
  entries: number;
  /** Token ids held. */
  ids: number;
  /** What the bound is measured in: ids held plus half the characters of the keys (see `cost`). */
  units: number;
  evictions: number;
}

/**
 * LRU of encoded text pieces (the text between two control tokens), bounded by memory. A Map keeps
 * insertion order, so re-inserting on a hit makes the first key the least recently used.
 *
 * Pieces are their own keys. A digest key was tried first: hashing OpenClaw's 34k-character system
 * block cost ~45 µs per render, while a Map lookup of the text itself costs ~7 µs, because V8
 * hashes a string that long by its length alone and then compares candidates with memcmp. The
 * key is `'s' + piece`, a new string that V8 flattens when it hashes it, so a cached key never
 * keeps the whole rendered prompt it was sliced from alive.
 */
export class PieceCache {
  private readonly map = new Map<string, Int32Array>();
  private held = 0;
  private ids = 0;
  private readonly counts = { hits: 0, misses: 0, evictions: 0 };

  /**
   * @param maxUnits upper bound of ids held plus half the key characters (an id is 4 bytes, a
   *   character at most 2); @default 4_000_000 (about 16 MB)
   */
  constructor(private readonly maxUnits = 4_000_000) {}

  private static cost(key: string, ids: Int32Array): number {
    return ids.length + (key.length >> 1);
  }

  getOrEncode(piece: string, encode: (piece: string) => Int32Array): Int32Array {
    const key = 's' + piece;
    const found = this.map.get(key);
    if (found) {
      this.counts.hits++;
      this.map.delete(key);
      this.map.set(key, found);
      return found;
    }
    this.counts.misses++;
    const ids = encode(piece);
    const cost = PieceCache.cost(key, ids);
    if (cost > this.maxUnits) return ids;
    this.map.set(key, ids);
    this.held += cost;
    this.ids += ids.length;
    while (this.held > this.maxUnits) {
      const oldest = this.map.keys().next().value as string;
      const old = this.map.get(oldest)!;
      this.held -= PieceCache.cost(oldest, old);
      this.ids -= old.length;
      this.map.delete(oldest);
      this.counts.evictions++;
    }
    return ids;
  }

  clear(): void {
    this.map.clear();
    this.held = 0;
    this.ids = 0;
  }

  stats(): PieceCacheStats {
    return { ...this.counts, entries: this.map.size, ids: this.ids, units: this.held };
  }
}
