/**
 * The open-session table: sessions in least-recently-active order (a Map re-inserted on every
 * touch, so the oldest is always first and expiry and eviction are O(1) each), plus two hash
 * indexes over untagged sessions so that a request finds its candidates by lookup, never by scan:
 * `byExt` (prefix hash of the last request's messages + the assistant reply: what a continuation
 * carries at that position) and `byFull` (prefix hash of the last request's messages: what an exact
 * repeat carries). A session holds hashes and ids, never transcripts.
 */
export interface Session {
  /** `scenario \0 key id \0 key` (sessionMapKey): unique across scenarios and API keys. */
  mapKey: string;
  /** `tag:<session tag>` or `chain:<id of the record that opened it>`. */
  key: string;
  scenario: string;
  /** The API key id of the records it binds (records before key ids: null); another key's records never join it. */
  keyId: string | null;
  tagged: boolean;
  /** The last main request: its record id (the pending turn), message count and hashes. */
  turnId: string;
  n: number;
  /** Untagged: prefix hash of its messages. Tagged: hash of its newest message. */
  full: number;
  /** Untagged: `full` + the assistant reply. Tagged: hash of the reply. */
  ext: number;
  /** Hash of its first message; with `sysVaries`, the same as `conv`. */
  root: number;
  /** Hash of its conversation root: the first message that is not a system or developer message. */
  conv: number;
  /**
   * Tag mode: the main line has moved to another system prompt with the same conversation (a prompt
   * that carries a timestamp or injected memory), so roots are compared without it.
   */
  sysVaries: boolean;
  /** Tag mode: the request an exact repeat replaced, in case the client went on from its reply. */
  altId: string | null;
  altExt: number;
  /** Tag mode: a request with another root, side unless the next request extends it. */
  candId: string | null;
  candN: number;
  candExt: number;
  /** The candidate's conversation root. */
  candConv: number;
  /**
   * Untagged: an exact repeat came after it, or a member of its group of identical requests was
   * extended, so if left unextended it was a retry, not a lost turn.
   */
  repeat: boolean;
  lastAt: number;
  /** Global activity sequence: the larger, the more recently active (breaks ties within a ms). */
  seq: number;
}

/**
 * A session's table key. The key id is part of it because a tag is only a client's word: another
 * API key allowed in the same scenario that sends the same tag would otherwise become this
 * session's next state, and set the reward and hint of a turn it never saw.
 */
export function sessionMapKey(scenario: string, keyId: string | null, key: string): string {
  return `${scenario}\u0000${keyId ?? ''}\u0000${key}`;
}

type Bucket = Session | Session[];

function bucketAdd(index: Map<number, Bucket>, h: number, s: Session): void {
  const b = index.get(h);
  if (b === undefined) index.set(h, s);
  else if (Array.isArray(b)) b.push(s);
  else index.set(h, [b, s]);
}

function bucketRemove(index: Map<number, Bucket>, h: number, s: Session): void {
  const b = index.get(h);
  if (b === undefined) return;
  if (!Array.isArray(b)) {
    if (b === s) index.delete(h);
    return;
  }
  const i = b.indexOf(s);
  if (i >= 0) b.splice(i, 1);
  if (b.length === 1) index.set(h, b[0]!);
  else if (b.length === 0) index.delete(h);
}

function newest(b: Bucket | undefined): Session | null {
  if (b === undefined) return null;
  if (!Array.isArray(b)) return b;
  let best: Session | null = null;
  for (const s of b) if (best === null || s.seq > best.seq) best = s;
  return best;
}

/** Whose sessions they are: one scenario's, of one API key. The unit eviction is fair between. */
function tenantOf(s: Session): string {
  return `${s.scenario}\u0000${s.keyId ?? ''}`;
}

export class SessionTable {
  private readonly byKey = new Map<string, Session>();
  /** Each tenant's sessions, least recently active first (as `byKey`). */
  private readonly byTenant = new Map<string, Map<string, Session>>();
  private readonly byExt = new Map<number, Bucket>();
  private readonly byFull = new Map<number, Bucket>();
  /** Map keys of the sessions added, changed or removed since `saved()`: what the judge's next commit writes. */
  private readonly unsaved = new Set<string>();

  get size(): number {
    return this.byKey.size;
  }

  get(mapKey: string): Session | undefined {
    return this.byKey.get(mapKey);
  }

  /** The least recently active session. */
  oldest(): Session | undefined {
    return this.byKey.values().next().value;
  }

  /** Sessions, least recently active first. */
  values(): IterableIterator<Session> {
    return this.byKey.values();
  }

  /** How many tenants (scenario and API key) hold open sessions. */
  get tenants(): number {
    return this.byTenant.size;
  }

  /** Open sessions of one scenario's API key. */
  sizeOf(scenario: string, keyId: string | null): number {
    return this.byTenant.get(`${scenario}\u0000${keyId ?? ''}`)?.size ?? 0;
  }

  /**
   * Whom eviction takes from: the least recently active session of the tenant that holds the most
   * (of two as large, the one whose oldest session is older). A tenant that floods sessions then
   * evicts its own, and one holding no more than its share of the cap is never evicted by another:
   * one global LRU let a single key close every other tenant's sessions and drop their turns.
   * Linear in the number of tenants, which the configured keys and scenarios bound.
   */
  evictionVictim(): Session | undefined {
    let best: Map<string, Session> | undefined;
    let bestOldest: Session | undefined;
    for (const m of this.byTenant.values()) {
      const oldest = m.values().next().value as Session;
      if (best === undefined || m.size > best.size || (m.size === best.size && oldest.seq < bestOldest!.seq)) {
        best = m;
        bestOldest = oldest;
      }
    }
    return bestOldest;
  }

  /** Most recently active untagged session whose last request + reply hashes to `ext`. */
  findByExt(ext: number): Session | null {
    return newest(this.byExt.get(ext));
  }

  /** Most recently active untagged session whose last request hashes to `full`. */
  findByFull(full: number): Session | null {
    return newest(this.byFull.get(full));
  }

  /** Every untagged session whose last request hashes to `full`. */
  withFull(full: number): readonly Session[] {
    const b = this.byFull.get(full);
    return b === undefined ? [] : Array.isArray(b) ? [...b] : [b];
  }

  /** Map keys of the sessions added, changed (`changed`, `touch`) or removed since `saved()`. */
  unsavedKeys(): IterableIterator<string> {
    return this.unsaved.values();
  }

  /** Call after changing a session other than through `add`, `touch` or `remove`. */
  changed(mapKey: string): void {
    this.unsaved.add(mapKey);
  }

  /** What `unsavedKeys` named is saved. */
  saved(): void {
    this.unsaved.clear();
  }

  add(s: Session): void {
    this.unsaved.add(s.mapKey);
    this.byKey.set(s.mapKey, s);
    const t = tenantOf(s);
    let m = this.byTenant.get(t);
    if (m === undefined) this.byTenant.set(t, (m = new Map()));
    m.set(s.mapKey, s);
    this.index(s);
  }

  /** Moves `s` to the most recently active end. */
  touch(s: Session, now: number, seq: number): void {
    this.unsaved.add(s.mapKey);
    s.lastAt = now;
    s.seq = seq;
    this.byKey.delete(s.mapKey);
    this.byKey.set(s.mapKey, s);
    const m = this.byTenant.get(tenantOf(s))!;
    m.delete(s.mapKey);
    m.set(s.mapKey, s);
  }

  /** Call before changing `s.full` / `s.ext`, then `index(s)` after. */
  unindex(s: Session): void {
    if (s.tagged) return;
    bucketRemove(this.byExt, s.ext, s);
    bucketRemove(this.byFull, s.full, s);
  }

  index(s: Session): void {
    if (s.tagged) return;
    bucketAdd(this.byExt, s.ext, s);
    bucketAdd(this.byFull, s.full, s);
  }

  remove(s: Session): void {
    this.unsaved.add(s.mapKey);
    this.unindex(s);
    this.byKey.delete(s.mapKey);
    const t = tenantOf(s);
    const m = this.byTenant.get(t);
    m?.delete(s.mapKey);
    if (m?.size === 0) this.byTenant.delete(t);
  }
}
