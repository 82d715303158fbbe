/**
 * DPoP proofs as the server checks them (RFC 9449): the proof itself (helpers/dpop.ts), the
 * server nonce (§8, §9) and the single use of each proof (§11.1), for the token endpoint, PAR,
 * userinfo and the API alike.
 *
 * Single use across instances: a proof's key thumbprint and jti are remembered in the database
 * (seen-jtis.ts) until no proof carrying them could still be accepted (iat plus
 * DPOP_PROOF_MAX_AGE plus the skew).
 *
 * Nonces are stateless: an HMAC of the current minute under SECRET_KEY, so every instance makes
 * and accepts the same ones without sharing anything; the current and the previous minute's are
 * accepted, so a nonce lives 60 to 120 seconds.
 */
import { createHmac } from 'node:crypto';
import type { FastifyRequest } from 'fastify';
import type { Config } from '../../config.js';
import type { SeenJtis } from './seen-jtis.js';
import { deriveKey } from '../../lib/crypto.js';
import { AppError } from '../../errors.js';
import { DPOP_ALGS, DpopProofError, verifyDpopProof, type VerifiedDpopProof } from '../helpers/dpop.js';

export { DpopProofError };

const NONCE_WINDOW_S = 60;
const MAX_SKEW_S = 5;

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

export interface DpopCheck {
  method: string;
  /** The URL the request was sent to, as the client wrote it in htu (the issuer's origin and the path). */
  url: string;
  /** The access token presented with the proof (resource requests): the proof must carry its hash (ath). */
  accessToken?: string | undefined;
}

export class DpopProofs {
  private readonly nonceKey: Uint8Array;

  constructor(
    private readonly jtis: SeenJtis,
    private readonly config: Pick<Config, 'secretKey' | 'dpop'>,
  ) {
    this.nonceKey = deriveKey(config.secretKey, 'dpop-nonce');
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
    if (!(await this.jtis.firstUse(`dpop:${verified.jkt}:${verified.jti}`, verified.replayUntil))) {
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
export function endpointDpopJkt(dpop: DpopProofs, config: Pick<Config, 'issuer'>, req: FastifyRequest, path: string): Promise<string | null> | null {
  // No proof (most requests): answered without a promise, which the token endpoint's every request awaited (issue 46).
  return req.headers.dpop === undefined ? null : checkedEndpointProof(dpop, config, req, path);
}

async function checkedEndpointProof(dpop: DpopProofs, config: Pick<Config, 'issuer'>, req: FastifyRequest, path: string): Promise<string | null> {
  try {
    const proof = dpopHeader(req.headers);
    if (proof === undefined) return null;
    return (await dpop.check(proof, { method: req.method, url: `${config.issuer}${path}` })).jkt;
  } catch (err) {
    if (!(err instanceof DpopProofError)) throw err;
    throw new AppError(400, err.error, err.message, { headers: err.error === 'use_dpop_nonce' ? { 'dpop-nonce': dpop.nonce() } : {} });
  }
}
