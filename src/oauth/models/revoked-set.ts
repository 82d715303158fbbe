/**
 * A set of revoked keys (grant ids, access-token jtis) that stays compact at a million entries,
 * for RevocationList (revocation-list.ts): a lookup on the API's hot path is a Map check plus a
 * binary search, with no query.
 *
 * A Map<number, number> of a million revoked grants cost an instance 150 MB and more (entries,
 * boxed values, the hash table's slack) and the load that filled it materialised every row at
 * once. Here each key is a fixed number of 32-bit words (KeyCodec: 2 for a grant id, 4 for a
 * UUID jti), held sorted in one Uint32Array, with a parallel Uint32Array of when the entry
 * stops mattering (`until`, seconds since the epoch; good until 2106): 12 bytes per grant, 20
 * per jti. Additions go to a small Map first (`recent`) and are merged into the sorted arrays
 * once it holds RECENT_LIMIT entries, or when the owner prunes: one pass over the arrays per
 * few thousand revocations, never per revocation. A key without a compact form (a jti that
 * is not a canonical UUID: this server issues none, but the table accepts any text) is kept
 * exactly in a Map of its own; nothing is ever approximated (no false positive, no hashing).
 *
 * A bulk load (startLoad) sorts what it is given a run at a time, with an LSD radix sort on
 * 16-bit digits that moves keys and `until` together (no comparator calls), and merges each run
 * into arrays sized for the whole load up front: no row objects kept, no growing copies.
 */

/** How a key is written as `words` unsigned 32-bit words whose lexicographic order is an order of the keys. */
export interface KeyCodec<K> {
  readonly words: number;
  /** Writes the key at out[offset ...]; false when it has no compact form (it is then kept in a Map). */
  encode(key: K, out: Uint32Array, offset: number): boolean;
}

const TWO_32 = 2 ** 32;

/** Grant ids: bigint in the database, read as safe integers (db/types.ts), so two words (high, low). */
export const grantIdCodec: KeyCodec<number> = {
  words: 2,
  encode(id, out, offset) {
    if (!Number.isSafeInteger(id) || id < 0) return false;
    out[offset] = Math.floor(id / TWO_32);
    // ToUint32: the id modulo 2^32, exact for any safe integer.
    out[offset + 1] = id >>> 0;
    return true;
  },
};

/**
 * An organization's member, written `${organizationId}:${userId}` (memberKey): both ids are
 * bigint in the database and safe integers here, so two words each.
 */
export const memberCodec: KeyCodec<string> = {
  words: 4,
  encode(key, out, offset) {
    const colon = key.indexOf(':');
    if (colon < 0) return false;
    return grantIdCodec.encode(Number(key.slice(0, colon)), out, offset) && grantIdCodec.encode(Number(key.slice(colon + 1)), out, offset + 2) && memberKey(Number(key.slice(0, colon)), Number(key.slice(colon + 1))) === key;
  },
};

export const memberKey = (organizationId: number, userId: number): string => `${organizationId}:${userId}`;

/** Lowercase only: 'A…' and 'a…' are different jtis, and randomUUID() writes lowercase. */
const CANONICAL_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** Access-token jtis (randomUUID(), access-tokens.ts): the 128 bits in four words. */
export const uuidCodec: KeyCodec<string> = {
  words: 4,
  encode(jti, out, offset) {
    if (jti.length !== 36 || !CANONICAL_UUID.test(jti)) return false;
    out[offset] = Number.parseInt(jti.slice(0, 8), 16);
    out[offset + 1] = Number.parseInt(jti.slice(9, 13) + jti.slice(14, 18), 16);
    out[offset + 2] = Number.parseInt(jti.slice(19, 23) + jti.slice(24, 28), 16);
    out[offset + 3] = Number.parseInt(jti.slice(28, 36), 16);
    return true;
  },
};

/** Additions kept in the Map before they are merged into the sorted arrays. */
export const RECENT_LIMIT = 4096;
/** Entries a bulk load sorts at a time (startLoad). */
const LOAD_RUN = 65_536;
/** What byteSize() counts for an entry of a Map (hash table slot, boxed number, a jti string): a generous estimate. */
const MAP_ENTRY_BYTES = 120;
const MIN_CAPACITY = 1024;
const MAX_UNTIL = 0xffffffff;

const clampUntil = (until: number) => Math.min(MAX_UNTIL, Math.max(0, Math.ceil(until)));

/** -1, 0 or 1: the key at a[ai ...] against the key at b[bi ...], `words` words each. */
function compareKeys(a: Uint32Array, ai: number, b: Uint32Array, bi: number, words: number): number {
  for (let w = 0; w < words; w++) {
    const x = a[ai + w]!;
    const y = b[bi + w]!;
    if (x !== y) return x < y ? -1 : 1;
  }
  return 0;
}

const DIGITS = 1 << 16;

/** Buffers for sortEntries, reused from one call to the next (a bulk load sorts a run at a time). */
export interface SortScratch {
  keys: Uint32Array;
  until: Uint32Array;
  counts: Uint32Array;
}

export function sortScratch(entries: number, words: number): SortScratch {
  return { keys: new Uint32Array(entries * words), until: new Uint32Array(entries), counts: new Uint32Array(DIGITS) };
}

/**
 * Sorts the first n entries (keys of `words` words, each with its `until`) in key order, in
 * place: an LSD radix sort, 16 bits a pass from the last word's low half to the first word's
 * high half, each pass stable. A pass whose digit is the same for every entry (the high words
 * of grant ids below 2^32, say) moves nothing and is skipped. `scratch` must hold n entries.
 */
export function sortEntries(keys: Uint32Array, until: Uint32Array, n: number, words: number, scratch = sortScratch(n, words)): void {
  if (n < 2) return;
  let srcKeys = keys;
  let srcUntil = until;
  let dstKeys = scratch.keys;
  let dstUntil = scratch.until;
  const counts = scratch.counts;
  for (let w = words - 1; w >= 0; w--) {
    for (let shift = 0; shift <= 16; shift += 16) {
      counts.fill(0);
      for (let i = 0, k = w; i < n; i++, k += words) counts[(srcKeys[k]! >>> shift) & 0xffff]!++;
      if (counts[(srcKeys[w]! >>> shift) & 0xffff] === n) continue;
      for (let d = 0, sum = 0; d < DIGITS; d++) {
        const c = counts[d]!;
        counts[d] = sum;
        sum += c;
      }
      for (let i = 0, k = 0; i < n; i++, k += words) {
        const pos = counts[(srcKeys[k + w]! >>> shift) & 0xffff]!++;
        for (let x = 0, o = pos * words; x < words; x++) dstKeys[o + x] = srcKeys[k + x]!;
        dstUntil[pos] = srcUntil[i]!;
      }
      [srcKeys, dstKeys] = [dstKeys, srcKeys];
      [srcUntil, dstUntil] = [dstUntil, srcUntil];
    }
  }
  if (srcKeys !== keys) {
    keys.set(srcKeys.subarray(0, n * words));
    until.set(srcUntil.subarray(0, n));
  }
}

/**
 * Collapses equal neighbours of the first n sorted entries into one (the latest `until`);
 * returns the count left.
 */
function dedupeSorted(keys: Uint32Array, until: Uint32Array, n: number, words: number): number {
  if (n < 2) return n;
  let last = 0;
  for (let i = 1; i < n; i++) {
    if (compareKeys(keys, i * words, keys, last * words, words) === 0) {
      if (until[i]! > until[last]!) until[last] = until[i]!;
      continue;
    }
    last++;
    if (last !== i) {
      for (let x = 0; x < words; x++) keys[last * words + x] = keys[i * words + x]!;
      until[last] = until[i]!;
    }
  }
  return last + 1;
}

/**
 * Merges m sorted, distinct entries (src) into the first n sorted, distinct entries of
 * keys/until, which must have room for n + m: from the back, in place, O(n + m) moves and no
 * allocation. A key in both keeps the later `until`. Returns the count.
 */
function mergeInto(keys: Uint32Array, until: Uint32Array, n: number, srcKeys: Uint32Array, srcUntil: Uint32Array, m: number, w: number): number {
  let i = n - 1;
  let j = m - 1;
  let out = n + m - 1;
  while (j >= 0) {
    const c = i >= 0 ? compareKeys(keys, i * w, srcKeys, j * w, w) : -1;
    if (c > 0) {
      for (let x = 0; x < w; x++) keys[out * w + x] = keys[i * w + x]!;
      until[out] = until[i]!;
      i--;
    } else {
      for (let x = 0; x < w; x++) keys[out * w + x] = srcKeys[j * w + x]!;
      until[out] = c === 0 ? Math.max(until[i]!, srcUntil[j]!) : srcUntil[j]!;
      if (c === 0) i--;
      j--;
    }
    out--;
  }
  // The old entries [0, i] have not moved; a key in both left a gap (out - i slots) above them.
  const duplicates = out - i;
  if (duplicates > 0) {
    keys.copyWithin((i + 1) * w, (out + 1) * w, (n + m) * w);
    until.copyWithin(i + 1, out + 1, n + m);
  }
  return n + m - duplicates;
}

/** A bulk load into a RevokedSet: add() as the rows come, finish() once. See RevokedSet.startLoad. */
export interface RevokedSetLoad<K> {
  add(key: K, until: number): void;
  /** Sorts what was added and merges it into the set. */
  finish(): void;
}

export class RevokedSet<K> {
  private readonly words: number;
  /** size entries, sorted by key, `words` words each; capacity = until.length. */
  private keys: Uint32Array;
  private until: Uint32Array;
  private size = 0;
  /** Added since the last merge; never holds a key the sorted arrays hold. */
  private readonly recent = new Map<K, number>();
  /** Keys without a compact form (see KeyCodec.encode). */
  private readonly others = new Map<K, number>();
  /** One key, encoded for a lookup. */
  private readonly probe: Uint32Array;

  constructor(
    private readonly codec: KeyCodec<K>,
    private readonly recentLimit = RECENT_LIMIT,
  ) {
    this.words = codec.words;
    this.keys = new Uint32Array(0);
    this.until = new Uint32Array(0);
    this.probe = new Uint32Array(this.words);
  }

  /** Entries held (each key once). */
  get count(): number {
    return this.size + this.recent.size + this.others.size;
  }

  has(key: K): boolean {
    if (this.recent.has(key)) return true;
    if (this.codec.encode(key, this.probe, 0)) return this.indexOf(this.probe) >= 0;
    return this.others.has(key);
  }

  /** When the key stops mattering (the latest `until` it was added with), or undefined when it is not held. */
  untilOf(key: K): number | undefined {
    const recent = this.recent.get(key);
    if (recent !== undefined) return recent;
    if (!this.codec.encode(key, this.probe, 0)) return this.others.get(key);
    const i = this.indexOf(this.probe);
    return i >= 0 ? this.until[i] : undefined;
  }

  /** Adds a key that matters until `until` (seconds since the epoch); a key already held keeps the later of the two. */
  add(key: K, until: number): void {
    const u = clampUntil(until);
    if (!this.codec.encode(key, this.probe, 0)) {
      this.others.set(key, Math.max(u, this.others.get(key) ?? 0));
      return;
    }
    const i = this.indexOf(this.probe);
    if (i >= 0) {
      if (u > this.until[i]!) this.until[i] = u;
      return;
    }
    this.recent.set(key, Math.max(u, this.recent.get(key) ?? 0));
    if (this.recent.size >= this.recentLimit) this.merge();
  }

  /** Moves the recent additions into the sorted arrays. */
  merge(): void {
    const m = this.recent.size;
    if (m === 0) return;
    const w = this.words;
    const keys = new Uint32Array(m * w);
    const until = new Uint32Array(m);
    let n = 0;
    for (const [key, u] of this.recent) {
      // Encodable: add() put only such keys here.
      this.codec.encode(key, keys, n * w);
      until[n++] = u;
    }
    this.recent.clear();
    sortEntries(keys, until, n, w);
    this.mergeSorted(keys, until, n);
  }

  /**
   * Drops every entry whose `until` is before nowS, compacting the arrays in one pass, and
   * gives memory back when they are mostly empty. Merges the recent additions first.
   */
  prune(nowS: number): void {
    this.merge();
    for (const [key, u] of this.others) if (u < nowS) this.others.delete(key);
    const w = this.words;
    const keys = this.keys;
    const until = this.until;
    let kept = 0;
    for (let i = 0; i < this.size; i++) {
      if (until[i]! < nowS) continue;
      if (kept !== i) {
        for (let x = 0; x < w; x++) keys[kept * w + x] = keys[i * w + x]!;
        until[kept] = until[i]!;
      }
      kept++;
    }
    this.size = kept;
    if (this.until.length > MIN_CAPACITY && kept < this.until.length / 4) this.resize(this.roomFor(kept));
  }

  /**
   * Bytes held: the typed arrays exactly, the Maps at MAP_ENTRY_BYTES an entry (there are at
   * most RECENT_LIMIT recent ones, and other keys only if something wrote jtis that are not UUIDs).
   */
  byteSize(): number {
    return this.keys.byteLength + this.until.byteLength + (this.recent.size + this.others.size) * MAP_ENTRY_BYTES;
  }

  /**
   * Starts a bulk load of about `expected` entries (more or fewer only cost a copy). The set
   * answers as before meanwhile and gets the loaded entries at finish(); a load abandoned half
   * way (the database went away) leaves it untouched but for keys without a compact form, which
   * go straight in.
   *
   * Entries are gathered in runs of LOAD_RUN, each sorted and merged into the loaded ones as it
   * fills: with `expected` right, the only large allocation is the final arrays themselves (no
   * growing copies, no scratch the size of the whole), which keeps the instance's resident
   * memory close to what the set holds, not to what loading it took.
   */
  startLoad(expected = 0): RevokedSetLoad<K> {
    const w = this.words;
    let keys = new Uint32Array(this.roomFor(expected) * w);
    let until = new Uint32Array(keys.length / w);
    let n = 0;
    const run = { keys: new Uint32Array(LOAD_RUN * w), until: new Uint32Array(LOAD_RUN), n: 0 };
    const scratch = sortScratch(LOAD_RUN, w);
    const flush = () => {
      if (run.n === 0) return;
      sortEntries(run.keys, run.until, run.n, w, scratch);
      const m = dedupeSorted(run.keys, run.until, run.n, w);
      run.n = 0;
      if (n + m > until.length) {
        // More than expected: grow by half.
        const capacity = Math.max(this.roomFor(n + m), Math.ceil(until.length * 1.5));
        const k = new Uint32Array(capacity * w);
        k.set(keys.subarray(0, n * w));
        const t = new Uint32Array(capacity);
        t.set(until.subarray(0, n));
        keys = k;
        until = t;
      }
      n = mergeInto(keys, until, n, run.keys, run.until, m, w);
    };
    return {
      add: (key, u) => {
        if (!this.codec.encode(key, run.keys, run.n * w)) {
          this.add(key, u);
          return;
        }
        run.until[run.n++] = clampUntil(u);
        if (run.n === LOAD_RUN) flush();
      },
      finish: () => {
        flush();
        if (this.size === 0) {
          // Adopted, less any slack well beyond the usual headroom (expected was too high, or growing left it).
          this.keys = keys;
          this.until = until;
          this.size = n;
          if (until.length > this.roomFor(n) * 1.25) this.resize(this.roomFor(n));
        } else {
          this.mergeSorted(keys, until, n);
        }
        // Recent additions (made while loading, say) may be loaded keys too: the merge keeps one of each.
        this.merge();
        keys = new Uint32Array(0);
        until = new Uint32Array(0);
        n = 0;
      },
    };
  }

  /** Capacity for n entries: some headroom, so that the next merges do not reallocate. */
  private roomFor(n: number): number {
    return Math.max(MIN_CAPACITY, n + (n >>> 3) + this.recentLimit);
  }

  private resize(capacity: number): void {
    const keys = new Uint32Array(capacity * this.words);
    keys.set(this.keys.subarray(0, this.size * this.words));
    const until = new Uint32Array(capacity);
    until.set(this.until.subarray(0, this.size));
    this.keys = keys;
    this.until = until;
  }

  /** The index of the encoded key in the sorted arrays, or -1. */
  private indexOf(probe: Uint32Array): number {
    const w = this.words;
    const keys = this.keys;
    let lo = 0;
    let hi = this.size - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      const c = compareKeys(keys, mid * w, probe, 0, w);
      if (c < 0) lo = mid + 1;
      else if (c > 0) hi = mid - 1;
      else return mid;
    }
    return -1;
  }

  /** Merges m sorted, distinct entries into the sorted arrays (mergeInto), making room first if needed. */
  private mergeSorted(srcKeys: Uint32Array, srcUntil: Uint32Array, m: number): void {
    if (m === 0) return;
    if (this.until.length < this.size + m) this.resize(this.roomFor(this.size + m));
    this.size = mergeInto(this.keys, this.until, this.size, srcKeys, srcUntil, m, this.words);
  }
}
