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
 * block cost ~45 µs per render, while a Map lookup of the text itself costs a few µs, because V8
 * hashes a string that long by its length alone and then compares candidates with memcmp. A
 * lookup allocates nothing; only a miss stores a flat copy of the piece (`ownCopy`), so a cached
 * key never keeps alive the whole rendered prompt it was sliced from.
 */
/**
 * A string with its own storage. `piece` is usually a slice of the rendered prompt, and V8 keeps a
 * slice's parent alive; slicing a concatenation makes V8 flatten it into a new string first, so the
 * result points into that copy (one character longer) instead of into the prompt.
 */
function ownCopy(piece: string): string {
  // V8 copies substrings shorter than 13 characters anyway (its minimum slice length).
  return piece.length < 13 ? piece : (' ' + piece).slice(1);
}

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
    const found = this.map.get(piece);
    if (found) {
      this.counts.hits++;
      this.map.delete(piece);
      this.map.set(piece, found);
      return found;
    }
    this.counts.misses++;
    const ids = encode(piece);
    const key = ownCopy(piece);
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
