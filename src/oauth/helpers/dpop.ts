/**
 * RFC 9449 DPoP proofs: the checks of §4.3 on one proof, as a pure function of the proof and the
 * request (no database, no I/O; replay of `jti` is the caller's: remember it until `replayUntil`).
 *
 * Choices:
 * - The signature is checked by helpers/jws.ts (node:crypto on a worker thread, in batches, off
 *   the event loop; not jose through WebCrypto): this runs on every DPoP API request, and an
 *   ES256 verify (~48 µs) is most of what a proof costs; the rest of the checks add 10–30 µs.
 * - What a proof's header yields (its alg, the imported key and its thumbprint) is cached by the
 *   header's exact encoded text, in an LRU of 1,000: a client signs thousands of proofs with one
 *   header, importing a P-256 JWK costs ~150 µs (the point is checked on the curve), more than the
 *   verify, and decoding and checking the header and hashing its key cost another 5–10 µs. The
 *   header's checks are a function of its text alone, so one text is one outcome; an entry enters
 *   only after a signature verified with its key, and a flood of fresh headers only evicts (Map
 *   order: delete + set on each hit).
 * - The key in the `jwk` header is checked strictly before anything uses it: public members only
 *   (a private JWK would import as its public half, hiding the client's mistake), members in
 *   canonical base64url with the curve's exact length (RFC 7518 §2, §6.2.1; Node would accept
 *   padded or non-canonical forms, giving one key several thumbprints), RSA modulus 2,048 to 8,192
 *   bits and exponent at most 33 bits (BoringSSL's bound: a huge exponent makes each verify cost a
 *   private-key operation), and the alg must fit the key type and curve.
 * - Cheap claim checks run before the signature, so junk costs no crypto; the nonce is checked last,
 *   so use_dpop_nonce is only ever the answer to an otherwise valid proof (RFC 9449 §8, §9).
 * - htu is compared after normalization (§4.3 point 9, RFC 3986 §6.2.2–6.2.3): query and fragment
 *   dropped, scheme and host lower-cased, default port dropped, empty path `/`, dot segments
 *   removed, percent-encoding upper-cased and unreserved characters decoded. Only http(s) URIs with
 *   an authority and without user info (RFC 9110 §4.2.4) normalize; WHATWG URL's leniencies
 *   (`https:///x`, `https:x`, backslashes, stripped whitespace) are refused before it parses.
 */
import { createHash, createPublicKey, type KeyObject } from 'node:crypto';
import { verifyJwsSignature } from './jws.js';

/** What we accept (metadata dpop_signing_alg_values_supported): asymmetric only. */
export const DPOP_ALGS = ['ES256', 'ES384', 'ES512', 'PS256', 'PS384', 'PS512', 'RS256', 'RS384', 'RS512', 'EdDSA'] as const;
export type DpopAlg = (typeof DPOP_ALGS)[number];

export class DpopProofError extends Error {
  constructor(
    readonly error: 'invalid_dpop_proof' | 'use_dpop_nonce',
    message: string,
  ) {
    super(message);
    this.name = 'DpopProofError';
  }
}

export interface DpopExpectation {
  /** The request method, e.g. `POST`; compared exactly. */
  htm: string;
  /** The request URL as the server sees it, absolute; its query and fragment are ignored. */
  htu: string;
  /** The access token presented with the proof: `ath` must be its hash. Absent: `ath` is not checked. */
  accessToken?: string;
  /** The nonce(s) the server currently accepts: the proof's `nonce` must be one, else use_dpop_nonce. */
  nonce?: string | readonly string[] | undefined;
  /** Epoch seconds; default now. */
  now?: number;
  /** How old `iat` may be, in seconds; default 60. */
  maxAgeSeconds?: number;
  /** How far in the future `iat` may be (clock skew), in seconds; default 5. */
  maxFutureSeconds?: number;
}

export interface VerifiedDpopProof {
  /** RFC 7638 SHA-256 thumbprint of the proof's key, base64url: compare with cnf.jkt or dpop_jkt. */
  jkt: string;
  jti: string;
  iat: number;
  /** Seconds since the epoch after which the jti need not be remembered: iat + maxAge + maxFuture, rounded up. */
  replayUntil: number;
}

const MAX_PROOF_LENGTH = 8192;
const MAX_JTI_LENGTH = 256;
const DEFAULT_MAX_AGE_SECONDS = 60;
const DEFAULT_MAX_FUTURE_SECONDS = 5;
const MIN_RSA_BITS = 2048;
const MAX_RSA_BITS = 8192;
const MAX_RSA_EXPONENT_BITS = 33;
const HEADER_CACHE_MAX = 1000;

type AlgSpec = { kty: 'EC'; crv: 'P-256' | 'P-384' | 'P-521'; size: number } | { kty: 'RSA' } | { kty: 'OKP'; crv: 'Ed25519'; size: number };

const ALGS = new Map<string, AlgSpec>([
  ['ES256', { kty: 'EC', crv: 'P-256', size: 32 }],
  ['ES384', { kty: 'EC', crv: 'P-384', size: 48 }],
  ['ES512', { kty: 'EC', crv: 'P-521', size: 66 }],
  ['PS256', { kty: 'RSA' }],
  ['PS384', { kty: 'RSA' }],
  ['PS512', { kty: 'RSA' }],
  ['RS256', { kty: 'RSA' }],
  ['RS384', { kty: 'RSA' }],
  ['RS512', { kty: 'RSA' }],
  ['EdDSA', { kty: 'OKP', crv: 'Ed25519', size: 32 }],
] satisfies [DpopAlg, AlgSpec][]);

const CURVES = { EC: new Set(['P-256', 'P-384', 'P-521']), OKP: new Set(['Ed25519']) };
/** Members only a private (or symmetric) JWK has (RFC 7518 §6.2.2, §6.3.2, §6.4.1; RFC 8037 §2). */
const PRIVATE_MEMBERS = ['d', 'p', 'q', 'dp', 'dq', 'qi', 'k', 'oth'] as const;
const B64U = /^[A-Za-z0-9_-]+$/;
const utf8 = new TextDecoder('utf-8', { fatal: true });

function invalid(message: string): DpopProofError {
  return new DpopProofError('invalid_dpop_proof', message);
}

type JsonObject = Record<string, unknown>;

function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** The bytes of canonical unpadded base64url (what re-encodes to itself), else undefined. */
function b64uBytes(value: unknown): Buffer | undefined {
  if (typeof value !== 'string' || !B64U.test(value)) return undefined;
  const bytes = Buffer.from(value, 'base64url');
  return bytes.toString('base64url') === value ? bytes : undefined;
}

function decodeJsonPart(part: string, name: string): JsonObject {
  const bytes = b64uBytes(part);
  if (bytes === undefined) throw invalid(`the DPoP proof ${name} is not base64url`);
  let value: unknown;
  try {
    value = JSON.parse(utf8.decode(bytes));
  } catch {
    throw invalid(`the DPoP proof ${name} is not JSON`);
  }
  if (!isObject(value)) throw invalid(`the DPoP proof ${name} is not a JSON object`);
  return value;
}

function bitLength(bytes: Buffer): number {
  return bytes.length === 0 ? 0 : (bytes.length - 1) * 8 + (32 - Math.clz32(bytes[0]!));
}

/** A Base64urlUInt (RFC 7518 §2): canonical base64url, no leading zero octet. */
function unsignedInt(value: unknown): Buffer | undefined {
  const bytes = b64uBytes(value);
  return bytes !== undefined && bytes[0] !== 0 ? bytes : undefined;
}

/**
 * The RFC 7638 thumbprint input of a public JWK the proof's alg can use, after checking it; throws
 * invalid_dpop_proof naming what is wrong.
 */
function checkedThumbprintInput(jwk: JsonObject, alg: DpopAlg, spec: AlgSpec): string {
  for (const member of PRIVATE_MEMBERS) {
    if (Object.hasOwn(jwk, member)) throw invalid(`the jwk header must be a public key, but it has the private member "${member}"`);
  }
  const { kty } = jwk;
  if (kty !== 'EC' && kty !== 'RSA' && kty !== 'OKP') throw invalid('the jwk header kty must be EC, RSA or OKP');
  if (kty !== spec.kty) throw invalid(`alg ${alg} does not fit a ${kty} key`);
  if (jwk.alg !== undefined && jwk.alg !== alg) throw invalid(`the jwk header names another alg than ${alg}`);
  if (spec.kty === 'RSA') {
    const n = unsignedInt(jwk.n);
    const e = unsignedInt(jwk.e);
    if (n === undefined || e === undefined) throw invalid('the jwk header n and e must be base64url unsigned integers');
    const bits = bitLength(n);
    if (bits < MIN_RSA_BITS || bits > MAX_RSA_BITS) {
      throw invalid(`the jwk header RSA modulus must have ${MIN_RSA_BITS} to ${MAX_RSA_BITS} bits, not ${bits}`);
    }
    if (bitLength(e) > MAX_RSA_EXPONENT_BITS) throw invalid(`the jwk header RSA exponent must have at most ${MAX_RSA_EXPONENT_BITS} bits`);
    return thumbprintInput(jwk, ['e', 'kty', 'n']);
  }
  if (typeof jwk.crv !== 'string' || !CURVES[spec.kty].has(jwk.crv)) {
    throw invalid(`the jwk header crv must be ${[...CURVES[spec.kty]].join(' or ')}`);
  }
  if (jwk.crv !== spec.crv) throw invalid(`alg ${alg} does not fit the ${jwk.crv} curve`);
  const coordinates = spec.kty === 'EC' ? (['x', 'y'] as const) : (['x'] as const);
  for (const member of coordinates) {
    if (b64uBytes(jwk[member])?.length !== spec.size) {
      throw invalid(`the jwk header ${member} must be ${spec.size} octets in base64url`);
    }
  }
  return thumbprintInput(jwk, spec.kty === 'EC' ? ['crv', 'kty', 'x', 'y'] : ['crv', 'kty', 'x']);
}

/** RFC 7638 §3.2: the required members, in lexicographic order, as JSON without whitespace. */
function thumbprintInput(jwk: JsonObject, members: readonly string[]): string {
  const parts: string[] = [];
  for (const member of members) {
    const value = jwk[member];
    if (typeof value !== 'string') throw invalid(`the jwk has no "${member}" member`);
    parts.push(`${JSON.stringify(member)}:${JSON.stringify(value)}`);
  }
  return `{${parts.join(',')}}`;
}

function sha256(input: string, encoding: 'utf8' | 'ascii'): string {
  return createHash('sha256').update(input, encoding).digest('base64url');
}

/**
 * The RFC 7638 SHA-256 thumbprint of a public (EC, RSA or OKP) JWK, base64url: the value of cnf.jkt
 * and dpop_jkt. The same as jose's calculateJwkThumbprint, synchronously. Throws DpopProofError
 * when a required member is missing.
 */
export function dpopThumbprint(jwk: object): string {
  const key = jwk as JsonObject;
  const members = key.kty === 'RSA' ? ['e', 'kty', 'n'] : key.kty === 'EC' ? ['crv', 'kty', 'x', 'y'] : key.kty === 'OKP' ? ['crv', 'kty', 'x'] : undefined;
  if (members === undefined) throw invalid('the jwk kty must be EC, RSA or OKP');
  return sha256(thumbprintInput(key, members), 'utf8');
}

/** The `ath` of a proof sent with this access token: base64url(SHA-256(ASCII)) (RFC 9449 §4.2). */
export function accessTokenHashForDpop(accessToken: string): string {
  return sha256(accessToken, 'ascii');
}

const SCHEME_AUTHORITY_PATH = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/]+)(\/.*)?$/;
/** RFC 3986 characters allowed outside query and fragment (no `?` or `#`), and well-formed `%XX`. */
const URI_CHARS = /^(?:[A-Za-z0-9\-._~:/[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*$/;

/** The path part of a URL as sent, without query and fragment (what htu is compared on). */
function withoutQuery(url: string): string {
  const end = url.search(/[?#]/);
  return end === -1 ? url : url.slice(0, end);
}

/**
 * The htu comparison form of a URL (RFC 9449 §4.3 point 9): scheme, authority and path; no query,
 * no fragment; after RFC 3986 §6.2.2 syntax-based and §6.2.3 scheme-based normalization.
 * Undefined for anything but an absolute http(s) URI with a host and no user info.
 */
export function normalizeHtu(url: string): string | undefined {
  if (typeof url !== 'string') return undefined;
  const base = withoutQuery(url);
  if (!URI_CHARS.test(base)) return undefined;
  const parts = SCHEME_AUTHORITY_PATH.exec(base);
  if (parts === null) return undefined;
  const scheme = parts[1]!.toLowerCase();
  if ((scheme !== 'https' && scheme !== 'http') || parts[2]!.includes('@')) return undefined;
  let parsed: URL;
  try {
    parsed = new URL(base);
  } catch {
    return undefined;
  }
  // WHATWG URL lower-cases scheme and host, drops the default port, makes an empty path `/` and
  // removes dot segments (also `%2e` ones); the percent-encoding of the path is left as sent.
  const path = parsed.pathname.replace(/%([0-9A-Fa-f]{2})/g, (_, hex: string) => {
    const char = String.fromCharCode(Number.parseInt(hex, 16));
    return /^[A-Za-z0-9\-._~]$/.test(char) ? char : `%${hex.toUpperCase()}`;
  });
  return `${parsed.protocol}//${parsed.host}${path}`;
}

// ---- The header cache (LRU by the header's encoded text) ----

/** What a checked header yields: the proof's alg, its key imported, and the key's thumbprint. */
interface CheckedHeader {
  alg: DpopAlg;
  key: KeyObject;
  jkt: string;
}

const headerCache = new Map<string, CheckedHeader>();

function cachedHeader(encodedHeader: string): CheckedHeader | undefined {
  const checked = headerCache.get(encodedHeader);
  if (checked !== undefined) {
    headerCache.delete(encodedHeader);
    headerCache.set(encodedHeader, checked);
  }
  return checked;
}

function rememberHeader(encodedHeader: string, checked: CheckedHeader): void {
  headerCache.delete(encodedHeader);
  headerCache.set(encodedHeader, checked);
  if (headerCache.size > HEADER_CACHE_MAX) headerCache.delete(headerCache.keys().next().value!);
}

/** How many checked headers (and imported keys) the cache holds (at most 1,000). */
export function dpopKeyCacheSize(): number {
  return headerCache.size;
}

/** A header checked now: its key not imported yet. */
interface FreshHeader {
  alg: DpopAlg;
  jwk: JsonObject;
  jkt: string;
}

/** The header's checks (§4.2, §4.3 points 4, 5, 7): its alg, its JWK, and the JWK's thumbprint. */
function checkHeader(encodedHeader: string): FreshHeader {
  const header = decodeJsonPart(encodedHeader, 'header');
  if (header.typ !== 'dpop+jwt') throw invalid('the DPoP proof typ header must be dpop+jwt');
  if (header.crit !== undefined) throw invalid('the DPoP proof has a crit header, and no extension is understood');
  const spec = typeof header.alg === 'string' ? ALGS.get(header.alg) : undefined;
  if (spec === undefined) throw invalid(`the DPoP proof alg header is not an accepted algorithm (${DPOP_ALGS.join(', ')})`);
  const alg = header.alg as DpopAlg;
  if (!isObject(header.jwk)) throw invalid('the DPoP proof jwk header must be a JWK object');
  const jwk = header.jwk;
  return { alg, jwk, jkt: sha256(checkedThumbprintInput(jwk, alg, spec), 'utf8') };
}

/** The last token's ath: a client sends one token with many proofs. */
let lastAth: { token: string; ath: string } | undefined;

function athOf(accessToken: string): string {
  if (lastAth?.token !== accessToken) lastAth = { token: accessToken, ath: accessTokenHashForDpop(accessToken) };
  return lastAth.ath;
}

// ---- The verifier ----

/**
 * Checks a DPoP proof against the request (RFC 9449 §4.3); resolves to its key's thumbprint and
 * what replay detection needs, or rejects with a DpopProofError: use_dpop_nonce when only the
 * nonce is missing or not current, invalid_dpop_proof for anything else.
 */
export async function verifyDpopProof(proof: string, expected: DpopExpectation): Promise<VerifiedDpopProof> {
  if (typeof proof !== 'string' || proof.length === 0) throw invalid('the DPoP proof is missing or empty');
  if (proof.length > MAX_PROOF_LENGTH) throw invalid('the DPoP proof is larger than 8 KiB');
  const parts = proof.split('.');
  if (parts.length !== 3) throw invalid('the DPoP proof is not a compact JWS of three parts');
  const [encodedHeader, encodedPayload, encodedSignature] = parts as [string, string, string];
  const header: CheckedHeader | FreshHeader = cachedHeader(encodedHeader) ?? checkHeader(encodedHeader);
  const { alg, jkt } = header;

  // Claims (§4.2, §4.3 points 3, 8, 9, 11, 12), before any crypto.
  const payload = decodeJsonPart(encodedPayload, 'payload');
  const { jti, htm, htu, iat, ath } = payload;
  if (typeof jti !== 'string' || jti.length === 0 || jti.length > MAX_JTI_LENGTH) {
    throw invalid(`the jti claim must be a string of 1 to ${MAX_JTI_LENGTH} characters`);
  }
  if (typeof htm !== 'string') throw invalid('the htm claim is missing');
  if (htm !== expected.htm) throw invalid('htm does not match the request method');
  if (typeof htu !== 'string') throw invalid('the htu claim is missing');
  // The request URL comes partly from the Host header: a bad one is the caller's, not a server error.
  // The same text normalizes alike: only a different one is normalized too (most clients send the URL as is).
  const requestPath = withoutQuery(expected.htu);
  const claimedPath = withoutQuery(htu);
  const requestUrl = normalizeHtu(requestPath);
  const claimedUrl = claimedPath === requestPath ? requestUrl : normalizeHtu(claimedPath);
  if (claimedUrl === undefined) throw invalid('the htu claim is not an absolute http(s) URI');
  if (requestUrl === undefined) throw invalid('the request URL cannot be compared with htu');
  if (claimedUrl !== requestUrl) throw invalid('htu does not match the request URL');
  if (typeof iat !== 'number' || !Number.isFinite(iat)) throw invalid('the iat claim must be a number');
  const now = expected.now ?? Date.now() / 1000;
  const maxAge = expected.maxAgeSeconds ?? DEFAULT_MAX_AGE_SECONDS;
  const maxFuture = expected.maxFutureSeconds ?? DEFAULT_MAX_FUTURE_SECONDS;
  if (iat < now - maxAge) throw invalid('the DPoP proof is too old (iat)');
  if (iat > now + maxFuture) throw invalid('the DPoP proof is issued in the future (iat)');
  if (expected.accessToken !== undefined) {
    if (typeof ath !== 'string') throw invalid('the ath claim is missing, and an access token is presented');
    if (ath !== athOf(expected.accessToken)) throw invalid('ath does not match the access token');
  }

  // Signature (§4.3 point 6).
  const signature = b64uBytes(encodedSignature);
  if (signature === undefined) throw invalid('the DPoP proof signature is not base64url');
  let key: KeyObject;
  if ('key' in header) {
    key = header.key;
  } else {
    try {
      key = createPublicKey({ key: header.jwk, format: 'jwk' });
    } catch {
      throw invalid('the DPoP proof jwk header is not a valid public key');
    }
  }
  const signed = Buffer.from(`${encodedHeader}.${encodedPayload}`, 'ascii');
  let valid: boolean;
  try {
    valid = await verifyJwsSignature(alg, signed, signature, key);
  } catch {
    valid = false;
  }
  if (!valid) throw invalid('the DPoP proof signature is invalid');
  if (!('key' in header)) rememberHeader(encodedHeader, { alg, key, jkt });

  // Nonce last (§4.3 point 10, §8): use_dpop_nonce only ever answers an otherwise valid proof.
  if (expected.nonce !== undefined) {
    const { nonce } = payload;
    if (typeof nonce !== 'string') throw new DpopProofError('use_dpop_nonce', 'the DPoP proof must carry the nonce the server provided');
    const accepted = typeof expected.nonce === 'string' ? [expected.nonce] : expected.nonce;
    if (!accepted.includes(nonce)) throw new DpopProofError('use_dpop_nonce', 'the DPoP proof nonce is not current');
  }

  return { jkt, jti, iat, replayUntil: Math.ceil(iat + maxAge + maxFuture) };
}
