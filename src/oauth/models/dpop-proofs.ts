/**
 * DPoP proofs as the server checks them (RFC 9449): the proof itself (helpers/dpop.ts), the
 * server nonce (§8, §9) and the single use of each proof (§11.1), for the token endpoint, PAR,
 * userinfo and the API alike.
 *
 * Single use across instances: a proof's jti is remembered in the database (dpop_proof_jtis,
 * keyed by key thumbprint and jti) until no proof carrying it could still be accepted (iat plus
 * DPOP_PROOF_MAX_AGE plus the skew). The database and not Redis: every instance already shares
 * it, Redis is optional here (rate limits fall back to memory without it; a replay cache cannot),
 * and the embedded database needs no other server. The table is UNLOGGED (no WAL), and the
 * checks of requests arriving together go in one statement (RemembersJtis below), so the API
 * pays a fraction of a round trip per proof under load rather than one each.
 *
 * Nonces are stateless: an HMAC of the current minute under SECRET_KEY, so every instance makes
 * and accepts the same ones without sharing anything; the current and the previous minute's are
 * accepted, so a nonce lives 60 to 120 seconds.
 */
import { createHmac } from 'node:crypto';
import { sql } from 'kysely';
import type { FastifyRequest } from 'fastify';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import { deriveKey } from '../../lib/crypto.js';
import { AppError } from '../../errors.js';
import { DPOP_ALGS, DpopProofError, verifyDpopProof, type VerifiedDpopProof } from '../helpers/dpop.js';

export { DpopProofError };

const NONCE_WINDOW_S = 60;
/** Expiry times come from an instance's clock, and are compared with the database's: a row is let go only this much later. */
export const CLOCK_MARGIN_S = 300;
const MAX_SKEW_S = 5;
/** The statement's batch: at most this many proofs in one insert. */
const MAX_BATCH = 500;

/** The algs a client may sign proofs with, as the metadata and the challenges list them. */
export const DPOP_SIGNING_ALGS: readonly string[] = DPOP_ALGS;

/** The `DPoP` request header: exactly one (RFC 9449 §4.3 point 1), or none. */
export function dpopHeader(headers: Record<string, string | string[] | undefined>): string | undefined {
  const value = headers.dpop;
  if (Array.isArray(value)) throw new DpopProofError('invalid_dpop_proof', 'more than one DPoP header');
  if (value === undefined) return undefined;
  if (value.includes(',')) throw new DpopProofError('invalid_dpop_proof', 'more than one DPoP proof');
  return value;
}

interface Pending {
  key: string;
  expiresAt: number;
  resolve(fresh: boolean): void;
  reject(err: unknown): void;
}

/**
 * Remembers jtis in the database, batching the proofs of one turn of the event loop into one
 * insert. Returns whether each was new (not seen within its window).
 */
class RemembersJtis {
  private pending: Pending[] = [];
  private scheduled = false;

  constructor(private readonly db: DB) {}

  remember(key: string, expiresAt: number): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.pending.push({ key, expiresAt, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.scheduled = false;
    while (this.pending.length > 0) {
      const batch = this.pending.splice(0, MAX_BATCH);
      void this.insert(batch);
    }
  }

  private async insert(batch: Pending[]): Promise<void> {
    // Twice in one batch: the second is a replay of the first.
    const first = new Map<string, Pending>();
    for (const p of batch) if (!first.has(p.key)) first.set(p.key, p);
    try {
      const keys = [...first.keys()];
      const expiries = [...first.values()].map((p) => new Date(p.expiresAt * 1000).toISOString());
      // A row whose window has closed is taken over (jtis are random; this only keeps the table from growing between cleanups).
      const { rows } = await sql<{ key: string }>`
        insert into dpop_proof_jtis (key, expires_at)
        select * from unnest(${keys}::text[], ${expiries}::timestamptz[])
        on conflict (key) do update set expires_at = excluded.expires_at where dpop_proof_jtis.expires_at < now() - make_interval(secs => ${CLOCK_MARGIN_S})
        returning key`.execute(this.db);
      const fresh = new Set(rows.map((r) => r.key));
      for (const p of batch) p.resolve(first.get(p.key) === p && fresh.has(p.key));
    } catch (err) {
      for (const p of batch) p.reject(err);
    }
  }
}

export interface DpopCheck {
  method: string;
  /** The URL the request was sent to, as the client wrote it in htu (the issuer's origin and the path). */
  url: string;
  /** The access token presented with the proof (resource requests): the proof must carry its hash (ath). */
  accessToken?: string | undefined;
}

export class DpopProofs {
  private readonly nonceKey: Uint8Array;
  private readonly jtis: RemembersJtis;

  constructor(
    db: DB,
    private readonly config: Pick<Config, 'secretKey' | 'dpop'>,
  ) {
    this.nonceKey = deriveKey(config.secretKey, 'dpop-nonce');
    this.jtis = new RemembersJtis(db);
  }

  get requireNonce(): boolean {
    return this.config.dpop.requireNonce;
  }

  private nonceFor(window: number): string {
    const mac = createHmac('sha256', this.nonceKey).update(String(window)).digest().subarray(0, 16).toString('base64url');
    return `${window.toString(36)}.${mac}`;
  }

  /** The nonce to hand out now (DPoP-Nonce). */
  nonce(now = Date.now()): string {
    return this.nonceFor(Math.floor(now / 1000 / NONCE_WINDOW_S));
  }

  /** The nonces accepted now: this minute's and the last one's. */
  private acceptedNonces(now = Date.now()): string[] {
    const current = Math.floor(now / 1000 / NONCE_WINDOW_S);
    return [this.nonceFor(current), this.nonceFor(current - 1)];
  }

  /**
   * Checks `proof` for the request and remembers its jti. Throws DpopProofError
   * (invalid_dpop_proof, or use_dpop_nonce when a nonce is required and missing or stale).
   */
  async check(proof: string, request: DpopCheck): Promise<VerifiedDpopProof> {
    const verified = await verifyDpopProof(proof, {
      htm: request.method,
      htu: request.url,
      ...(request.accessToken !== undefined ? { accessToken: request.accessToken } : {}),
      ...(this.config.dpop.requireNonce ? { nonce: this.acceptedNonces() } : {}),
      maxAgeSeconds: this.config.dpop.proofMaxAge,
      maxFutureSeconds: MAX_SKEW_S,
    });
    if (!(await this.jtis.remember(`${verified.jkt}.${verified.jti}`, verified.replayUntil))) {
      throw new DpopProofError('invalid_dpop_proof', 'the DPoP proof was used before (its jti was seen)');
    }
    return verified;
  }
}

/**
 * The DPoP proof of a request to an authorization server endpoint (token, PAR), checked: the
 * thumbprint of its key, or null without one. A bad proof is 400 invalid_dpop_proof, a missing
 * or stale nonce 400 use_dpop_nonce with a fresh DPoP-Nonce (RFC 9449 §5, §8).
 */
export async function endpointDpopJkt(dpop: DpopProofs, config: Pick<Config, 'issuer'>, req: FastifyRequest, path: string): Promise<string | null> {
  try {
    const proof = dpopHeader(req.headers);
    if (proof === undefined) return null;
    return (await dpop.check(proof, { method: req.method, url: `${config.issuer}${path}` })).jkt;
  } catch (err) {
    if (!(err instanceof DpopProofError)) throw err;
    throw new AppError(400, err.error, err.message, { headers: err.error === 'use_dpop_nonce' ? { 'dpop-nonce': dpop.nonce() } : {} });
  }
}
