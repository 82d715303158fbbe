/**
 * private_key_jwt client assertions (src/oauth/helpers/client-assertion.ts): keys made by jose,
 * assertions signed with jose's SignJWT, a jwks_uri served by a real node:http server on
 * 127.0.0.1 and fetched through the guarded outbound client; no database. Each refused
 * assertion would be accepted but for the one thing wrong with it, and each refusal is checked
 * by its cause, so that removing the check makes the test fail rather than pass on another
 * refusal. Time is the verifier's clock (`clock`), moved by the tests, not waited for; fetches
 * are counted on the server.
 */
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { calculateJwkThumbprint, type CryptoKey, exportJWK, generateKeyPair, importJWK, type JWK, SignJWT, UnsecuredJWT } from 'jose';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { Config } from '../../src/config.js';
import { createOutboundFetch } from '../../src/lib/outbound.js';
import {
  type AssertionClient,
  CLIENT_ASSERTION_ALGS,
  CLIENT_ASSERTION_TYPE,
  ClientAssertionVerifier,
  jwksUriProblem,
  MAX_CACHED_CLIENTS,
  publicJwksSchema,
} from '../../src/oauth/helpers/client-assertion.js';
import { InvalidClientError } from '../../src/oauth/errors.js';

const ISSUER = 'https://auth.example.com';
const TOKEN_ENDPOINT = `${ISSUER}/oauth/token`;
const PAR_ENDPOINT = `${ISSUER}/oauth/par`;
const ENDPOINTS = [ISSUER, TOKEN_ENDPOINT, PAR_ENDPOINT];

/** Loopback is not among the networks: the verifiers below reach the test server only through the `fetch` they are given. */
const config: Pick<Config, 'issuer' | 'outbound'> = {
  issuer: ISSUER,
  outbound: { allowHttp: true, allowedNetworks: [], timeoutMs: 5000, maxBytes: 1024 * 1024, caFile: null },
};
const testFetch = createOutboundFetch({ allowHttp: true, allowedNetworks: ['127.0.0.0/8'], timeoutMs: 2000, maxBytes: 65536 });

/** The verifier's clock, in milliseconds; `later` moves it. */
let clock = 0;
const now = () => clock;
const later = (seconds: number) => {
  clock += seconds * 1000;
};
const nowS = () => Math.floor(clock / 1000);
let verifier: ClientAssertionVerifier;

beforeEach(() => {
  // A whole second, so that claims made from nowS() are exactly as far from now as they say.
  clock = Math.floor(Date.now() / 1000) * 1000;
  verifier = new ClientAssertionVerifier(config, { now, fetch: testFetch });
});

// --- keys and assertions ---

type TestAlg = 'ES256' | 'ES384' | 'RS256' | 'PS256' | 'EdDSA';
interface TestKey {
  alg: TestAlg;
  privateKey: CryptoKey;
  /** The public JWK, with kid when the key has one. */
  jwk: JWK;
  privateJwk: JWK;
}

async function makeKey(alg: TestAlg, kid?: string, extra: Partial<JWK> = {}): Promise<TestKey> {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
  const jwk: JWK = { ...(await exportJWK(publicKey)), ...(kid === undefined ? {} : { kid }), ...extra };
  return { alg, privateKey, jwk, privateJwk: await exportJWK(privateKey) };
}

let es256: TestKey;
let rs256: TestKey;
let eddsa: TestKey;
let es384: TestKey;
beforeAll(async () => {
  [es256, rs256, eddsa, es384] = await Promise.all([makeKey('ES256', 'ec-1'), makeKey('RS256'), makeKey('EdDSA', 'ed-1'), makeKey('ES384', 'ec384-1')]);
});

let clientCount = 0;
/** A fresh client (its own cache entry) registering `keys` inline, or a jwks_uri. */
function inlineClient(...keys: TestKey[]): AssertionClient {
  return { client_id: `client-${++clientCount}`, jwks: { keys: keys.map((k) => k.jwk) }, jwks_uri: null };
}
function uriClient(uri: string): AssertionClient {
  return { client_id: `client-${++clientCount}`, jwks: null, jwks_uri: uri };
}

/** The claims of a valid assertion for `clientId`, now; an override of undefined removes the claim. */
function claimsFor(clientId: string, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  const claims: Record<string, unknown> = { iss: clientId, sub: clientId, aud: ISSUER, iat: nowS(), exp: nowS() + 60, jti: randomUUID(), ...overrides };
  for (const [name, value] of Object.entries(claims)) if (value === undefined) delete claims[name];
  return claims;
}

/** An assertion for `client` signed by `key`, with its kid (unless the header says otherwise). */
async function sign(key: TestKey, client: AssertionClient, overrides: Record<string, unknown> = {}, header: Record<string, unknown> = {}): Promise<string> {
  const protectedHeader = { alg: key.alg, ...(key.jwk.kid === undefined ? {} : { kid: key.jwk.kid }), ...header };
  for (const [name, value] of Object.entries(protectedHeader)) if (value === undefined) delete (protectedHeader as Record<string, unknown>)[name];
  // Another alg of the same key (PS256 with an RS256 key): WebCrypto wants the key imported for it.
  const privateKey = protectedHeader.alg === key.alg ? key.privateKey : ((await importJWK(key.privateJwk, protectedHeader.alg)) as CryptoKey);
  return new SignJWT(claimsFor(client.client_id, overrides)).setProtectedHeader(protectedHeader).sign(privateKey);
}

/** Asserts an InvalidClientError whose cause's message matches `reason`. */
async function expectRefused(promise: Promise<unknown>, reason: RegExp): Promise<void> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error, 'the assertion was accepted').toBeInstanceOf(InvalidClientError);
  const cause = (error as InvalidClientError).cause;
  expect(cause).toBeInstanceOf(Error);
  expect((cause as Error).message).toMatch(reason);
}

// --- a jwks_uri server ---

let server: http.Server;
let origin: string;
const routes = new Map<string, (res: http.ServerResponse) => void>();
const hits = new Map<string, number>();
let pathCount = 0;

/** A new path answering with `document()` (JSON, read at each request) and `status`; its URL. */
function serveJson(document: () => unknown, status = 200, headers: Record<string, string> = {}): string {
  const path = `/jwks-${++pathCount}`;
  routes.set(path, (res) => res.writeHead(status, { 'content-type': 'application/json', ...headers }).end(JSON.stringify(document())));
  return `${origin}${path}`;
}
function serveRaw(handler: (res: http.ServerResponse) => void): string {
  const path = `/raw-${++pathCount}`;
  routes.set(path, handler);
  return `${origin}${path}`;
}
const hitsOf = (url: string) => hits.get(new URL(url).pathname) ?? 0;

beforeAll(async () => {
  server = http.createServer((req, res) => {
    const path = req.url ?? '';
    hits.set(path, (hits.get(path) ?? 0) + 1);
    const route = routes.get(path);
    if (route) route(res);
    else res.writeHead(404).end();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  server?.closeAllConnections();
  await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
});

// --- the tests ---

describe('constants', () => {
  it('names the RFC 7523 assertion type and the algorithms offered', () => {
    expect(CLIENT_ASSERTION_TYPE).toBe('urn:ietf:params:oauth:client-assertion-type:jwt-bearer');
    expect([...CLIENT_ASSERTION_ALGS]).toEqual(['ES256', 'ES384', 'PS256', 'PS384', 'RS256', 'RS384', 'EdDSA']);
  });
});

describe('publicJwksSchema', () => {
  const messages = (input: unknown): string[] => {
    const result = publicJwksSchema.safeParse(input);
    return result.success ? [] : result.error.issues.map((i) => i.message);
  };
  const rsaJwk = (bits: number): JWK => generateKeyPairSync('rsa', { modulusLength: bits }).publicKey.export({ format: 'jwk' }) as JWK;

  it('accepts public EC (P-256, P-384, P-521), RSA and Ed25519 keys, keeping the public members, kid, use and alg', () => {
    const p521 = generateKeyPairSync('ec', { namedCurve: 'P-521' }).publicKey.export({ format: 'jwk' }) as JWK;
    const input = {
      keys: [
        { ...es256.jwk, use: 'sig', alg: 'ES256', key_ops: ['verify'], x5c: ['MIIB'], ext: true },
        es384.jwk,
        p521,
        rs256.jwk,
        eddsa.jwk,
      ],
      extra: 'dropped',
    };
    const result = publicJwksSchema.safeParse(input);
    expect(result.success, JSON.stringify(result.error?.issues)).toBe(true);
    expect(result.data?.keys).toHaveLength(5);
    expect(result.data?.keys[0]).toEqual({ kty: 'EC', crv: 'P-256', x: es256.jwk.x, y: es256.jwk.y, kid: 'ec-1', use: 'sig', alg: 'ES256' });
    expect(result.data?.keys[3]).toEqual({ kty: 'RSA', n: rs256.jwk.n, e: rs256.jwk.e });
    expect(result.data).not.toHaveProperty('extra');
  });

  it('refuses a private key, naming it', () => {
    expect(messages({ keys: [es256.jwk, es256.privateJwk] })).toEqual(['key 2 is a private key; register only the public half']);
    expect(messages({ keys: [rs256.privateJwk] })).toEqual(['key 1 is a private key; register only the public half']);
    expect(messages({ keys: [eddsa.privateJwk] })).toEqual(['key 1 is a private key; register only the public half']);
    // Only `p` and `q` of a key: still private material.
    expect(messages({ keys: [{ ...rs256.jwk, p: 'AQAB', q: 'AQAB' }] })).toEqual(['key 1 is a private key; register only the public half']);
  });

  it('refuses a symmetric key', () => {
    expect(messages({ keys: [{ kty: 'oct', k: 'c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0' }] })).toEqual(['key 1 is a symmetric key (kty oct); register a public key']);
  });

  it('refuses an RSA key under 2048 bits and one with an unsafe exponent', () => {
    expect(messages({ keys: [rsaJwk(1024)] })).toEqual(['key 1 is a 1024-bit RSA key; use at least 2048 bits']);
    expect(messages({ keys: [rsaJwk(2048)] })).toEqual([]);
    // e = 1: every message would be its own signature.
    expect(messages({ keys: [{ ...rs256.jwk, e: 'AQ' }] })).toEqual(['key 1 has an unsafe RSA public exponent (1)']);
  });

  it('refuses other key types and curves, and key material that is not a key', () => {
    const x25519 = generateKeyPairSync('x25519').publicKey.export({ format: 'jwk' });
    const secp256k1 = generateKeyPairSync('ec', { namedCurve: 'secp256k1' }).publicKey.export({ format: 'jwk' });
    expect(messages({ keys: [x25519] })).toEqual(['key 1 is an OKP key on curve "X25519"; only Ed25519 (EdDSA) is accepted']);
    expect(messages({ keys: [secp256k1] })).toEqual(['key 1 is an EC key on curve "secp256k1"; use P-256, P-384 or P-521']);
    expect(messages({ keys: [{ kty: 'AKP', alg: 'ML-DSA-44', pub: 'AAAA' }] })).toEqual(['key 1 has kty "AKP"; only EC, RSA and OKP keys are accepted']);
    expect(messages({ keys: [{ n: rs256.jwk.n, e: 'AQAB' }] })).toEqual(['key 1 has no kty']);
    // A point off the curve: y replaced by x.
    expect(messages({ keys: [{ ...es256.jwk, y: es256.jwk.x }] })).toEqual(['key 1 is not a valid EC P-256 public key']);
    expect(messages({ keys: [{ kty: 'EC', crv: 'P-256', x: es256.jwk.x }] })).toEqual(['key 1 is an EC key without base64url x and y']);
    expect(messages({ keys: ['not a key'] })).toEqual(['key 1 is not a JSON object']);
  });

  it('refuses use other than sig, key_ops without verify, an alg not offered or not fitting the key', () => {
    expect(messages({ keys: [{ ...es256.jwk, use: 'enc' }] })).toEqual(['key 1 has use "enc"; a key for client authentication has use "sig" or none']);
    expect(messages({ keys: [{ ...es256.jwk, key_ops: ['encrypt'] }] })).toEqual(['key 1 has key_ops without "verify"']);
    expect(messages({ keys: [{ ...es256.jwk, alg: 'HS256' }] })).toEqual([`key 1 has alg "HS256"; use one of ${CLIENT_ASSERTION_ALGS.join(', ')} (or none)`]);
    expect(messages({ keys: [{ ...es256.jwk, alg: 'ES384' }] })).toEqual(['key 1 has alg ES384, which does not fit an EC P-256 key']);
    expect(messages({ keys: [{ ...rs256.jwk, alg: 'ES256' }] })).toEqual(['key 1 has alg ES256, which does not fit an RSA key']);
    expect(messages({ keys: [{ ...rs256.jwk, alg: 'PS384' }] })).toEqual([]);
  });

  it('refuses a kid that is not a short string, and a kid twice', () => {
    expect(messages({ keys: [{ ...es256.jwk, kid: 'k'.repeat(201) }] })).toEqual(['key 1 has a kid that is not a string of 1 to 200 characters']);
    expect(messages({ keys: [{ ...es256.jwk, kid: 7 }] })).toEqual(['key 1 has a kid that is not a string of 1 to 200 characters']);
    expect(messages({ keys: [{ ...es256.jwk, kid: 'same' }, { ...rs256.jwk, kid: 'same' }] })).toEqual(['key 2 has the same kid as key 1']);
  });

  it('holds a set to 1..20 keys and 64 KiB, and to being a JWK Set', () => {
    expect(messages({ keys: [] })).toEqual(['a JWK Set needs at least one key']);
    const many = Array.from({ length: 21 }, (_, i) => ({ ...es256.jwk, kid: `k${i}` }));
    expect(messages({ keys: many })).toEqual(['at most 20 keys can be registered']);
    expect(messages({ keys: many.slice(0, 20) })).toEqual([]);
    expect(messages({ keys: [{ ...es256.jwk, x5c: ['A'.repeat(65 * 1024)] }] })).toEqual(['the JWK Set is larger than 64 KiB']);
    expect(messages({ keys: [{ ...es256.jwk, x5c: ['A'.repeat(60 * 1024)] }] })).toEqual([]);
    expect(messages([es256.jwk])).toHaveLength(1);
    expect(messages({ key: [es256.jwk] })).toHaveLength(1);
  });
});

describe('jwksUriProblem', () => {
  it('accepts an https URL, and http only when allowed', () => {
    expect(jwksUriProblem('https://client.example.com/.well-known/jwks.json', { allowHttp: false })).toBeNull();
    expect(jwksUriProblem('https://client.example.com/jwks?v=2', { allowHttp: false })).toBeNull();
    expect(jwksUriProblem('http://client.example.com/jwks', { allowHttp: false })).toBe('must use https');
    expect(jwksUriProblem('http://127.0.0.1:8080/jwks', { allowHttp: true })).toBeNull();
  });

  it('refuses relative URLs, other schemes, fragments, user info, control characters and length', () => {
    expect(jwksUriProblem('/jwks.json', { allowHttp: true })).toBe('must be an absolute URL');
    expect(jwksUriProblem('ftp://client.example.com/jwks', { allowHttp: true })).toBe('must use https or http');
    expect(jwksUriProblem('file:///etc/passwd', { allowHttp: false })).toBe('must use https');
    expect(jwksUriProblem('https://client.example.com/jwks#keys', { allowHttp: false })).toBe('must not contain a fragment');
    expect(jwksUriProblem('https://client.example.com/jwks#', { allowHttp: false })).toBe('must not contain a fragment');
    expect(jwksUriProblem('https://user:pw@client.example.com/jwks', { allowHttp: false })).toBe('must not contain user info');
    expect(jwksUriProblem('https://@client.example.com/jwks', { allowHttp: false })).toBe('must not contain user info');
    expect(jwksUriProblem('https://client.example.com/jw\nks', { allowHttp: false })).toBe('must not contain spaces or control characters');
    expect(jwksUriProblem(' https://client.example.com/jwks', { allowHttp: false })).toBe('must not contain spaces or control characters');
    const base = 'https://client.example.com/';
    expect(jwksUriProblem(`${base}${'a'.repeat(2000 - base.length)}`, { allowHttp: false })).toBeNull();
    expect(jwksUriProblem(`${base}${'a'.repeat(2001 - base.length)}`, { allowHttp: false })).toBe('must be at most 2000 characters');
  });
});

describe('ClientAssertionVerifier: inline jwks', () => {
  it('accepts ES256 with kid, returning jti, exp and the kid', async () => {
    const client = inlineClient(es256);
    const assertion = await sign(es256, client, { jti: 'the-jti', exp: nowS() + 30 });
    expect(await verifier.verify(client, assertion, ENDPOINTS)).toEqual({ jti: 'the-jti', exp: nowS() + 30, keyId: 'ec-1' });
  });

  it('accepts RS256 without kid; the key id is then its thumbprint', async () => {
    const client = inlineClient(rs256);
    const result = await verifier.verify(client, await sign(rs256, client), ENDPOINTS);
    expect(result.keyId).toBe(await calculateJwkThumbprint(rs256.jwk));
  });

  it('accepts EdDSA, ES384 and PS256 (an RSA key without alg serves RS256 and PS256)', async () => {
    const client = inlineClient(eddsa, es384, rs256);
    expect((await verifier.verify(client, await sign(eddsa, client), ENDPOINTS)).keyId).toBe('ed-1');
    expect((await verifier.verify(client, await sign(es384, client), ENDPOINTS)).keyId).toBe('ec384-1');
    expect((await verifier.verify(client, await sign(rs256, client, {}, { alg: 'PS256' }), ENDPOINTS)).jti).toBeTypeOf('string');
    expect((await verifier.verify(client, await sign(rs256, client), ENDPOINTS)).jti).toBeTypeOf('string');
  });

  it('accepts aud as the issuer, the token endpoint, the PAR endpoint, or an array holding one', async () => {
    const client = inlineClient(es256);
    for (const aud of [ISSUER, TOKEN_ENDPOINT, PAR_ENDPOINT, ['https://other.example.com', TOKEN_ENDPOINT]]) {
      await expect(verifier.verify(client, await sign(es256, client, { aud }), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    }
    // The issuer is accepted even when the caller names only the token endpoint.
    await expect(verifier.verify(client, await sign(es256, client, { aud: ISSUER }), [TOKEN_ENDPOINT])).resolves.toMatchObject({ keyId: 'ec-1' });
  });

  it('refuses an aud naming none of them', async () => {
    const client = inlineClient(es256);
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: 'https://other.example.com' }), ENDPOINTS), /aud .* names none of/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: `${ISSUER}/` }), ENDPOINTS), /aud .* names none of/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: ['https://a.example', 'https://b.example'] }), ENDPOINTS), /aud .* names none of/);
    // The PAR endpoint is accepted only when the caller names it.
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: PAR_ENDPOINT }), [TOKEN_ENDPOINT]), /aud .* names none of/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: undefined }), ENDPOINTS), /aud \(absent\) is not a string/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: [] }), ENDPOINTS), /aud \[\] is not a string or a non-empty array/);
  });

  it('refuses an iss or a sub other than the client_id', async () => {
    const client = inlineClient(es256);
    await expectRefused(verifier.verify(client, await sign(es256, client, { iss: 'client-other' }), ENDPOINTS), /iss "client-other" is not the client_id/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { sub: 'client-other' }), ENDPOINTS), /sub "client-other" is not the client_id/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { sub: undefined }), ENDPOINTS), /sub \(absent\) is not the client_id/);
  });

  it('refuses an expired assertion, with no leeway', async () => {
    const client = inlineClient(es256);
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: nowS() - 60, exp: nowS() }), ENDPOINTS), /expired 0 s ago/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: nowS() - 60, exp: nowS() - 1 }), ENDPOINTS), /expired 1 s ago/);
    const assertion = await sign(es256, client, { iat: nowS(), exp: nowS() + 30 });
    later(29);
    await expect(verifier.verify(client, assertion, ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    later(1);
    await expectRefused(verifier.verify(client, assertion, ENDPOINTS), /expired/);
  });

  it('refuses a lifetime (exp - iat) over 300 s, or over maxLifetimeSeconds', async () => {
    const client = inlineClient(es256);
    await expect(verifier.verify(client, await sign(es256, client, { exp: nowS() + 300 }), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    await expectRefused(verifier.verify(client, await sign(es256, client, { exp: nowS() + 301 }), ENDPOINTS), /valid for 301 s .*more than 300 s/);
    // An old iat makes the lifetime long although exp is near.
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: nowS() - 3600, exp: nowS() + 10 }), ENDPOINTS), /more than 300 s/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: nowS(), exp: nowS() }), ENDPOINTS), /expired/);
    const strict = new ClientAssertionVerifier(config, { now, fetch: testFetch, maxLifetimeSeconds: 30 });
    await expectRefused(strict.verify(client, await sign(es256, client, { exp: nowS() + 31 }), ENDPOINTS), /valid for 31 s .*more than 30 s/);
    await expect(strict.verify(client, await sign(es256, client, { exp: nowS() + 30 }), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
  });

  it('allows iat and nbf 60 s in the future, no more, and refuses exp before iat', async () => {
    const client = inlineClient(es256);
    await expect(verifier.verify(client, await sign(es256, client, { iat: nowS() + 60, exp: nowS() + 120 }), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: nowS() + 61, exp: nowS() + 120 }), ENDPOINTS), /iat is 61 s in the future/);
    await expect(verifier.verify(client, await sign(es256, client, { nbf: nowS() + 60 }), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    await expectRefused(verifier.verify(client, await sign(es256, client, { nbf: nowS() + 61 }), ENDPOINTS), /not valid before 61 s from now/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: nowS() + 50, exp: nowS() + 40 }), ENDPOINTS), /exp is not after its iat/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { nbf: 'soon' }), ENDPOINTS), /nbf is not a number/);
  });

  it('requires exp, iat and jti', async () => {
    const client = inlineClient(es256);
    await expectRefused(verifier.verify(client, await sign(es256, client, { exp: undefined }), ENDPOINTS), /no exp/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { exp: String(nowS() + 60) }), ENDPOINTS), /no exp/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { iat: undefined }), ENDPOINTS), /no iat/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { jti: undefined }), ENDPOINTS), /no jti/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { jti: '' }), ENDPOINTS), /no jti/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { jti: 12345 }), ENDPOINTS), /no jti/);
    await expectRefused(verifier.verify(client, await sign(es256, client, { jti: 'j'.repeat(257) }), ENDPOINTS), /no jti/);
    await expect(verifier.verify(client, await sign(es256, client, { jti: 'j'.repeat(256) }), ENDPOINTS)).resolves.toMatchObject({ jti: 'j'.repeat(256) });
  });

  it('refuses alg none, and HS256 keyed with the client’s own public key', async () => {
    const client = inlineClient(es256);
    const unsecured = new UnsecuredJWT(claimsFor(client.client_id)).encode();
    await expectRefused(verifier.verify(client, unsecured, ENDPOINTS), /alg "none" is not accepted/);
    // The classic confusion: an HMAC whose secret is the verifier's public key, as text or as bytes.
    for (const secret of [JSON.stringify(es256.jwk), JSON.stringify({ keys: [es256.jwk] }), es256.jwk.x!]) {
      const hs256 = await new SignJWT(claimsFor(client.client_id)).setProtectedHeader({ alg: 'HS256', kid: 'ec-1' }).sign(new TextEncoder().encode(secret));
      await expectRefused(verifier.verify(client, hs256, ENDPOINTS), /alg "HS256" is not accepted/);
    }
  });

  it('refuses a signature by a key that is not registered', async () => {
    const client = inlineClient(es256);
    const stranger = await makeKey('ES256');
    await expectRefused(verifier.verify(client, await sign(stranger, client), ENDPOINTS), /signature does not verify with the registered key$/);
    // Claiming the registered key's kid.
    await expectRefused(verifier.verify(client, await sign(stranger, client, {}, { kid: 'ec-1' }), ENDPOINTS), /signature does not verify with the registered key with kid "ec-1"/);
    // A signature of another type than any registered key.
    await expectRefused(verifier.verify(client, await sign(rs256, client), ENDPOINTS), /no registered key fits alg RS256/);
    // An EC key of another curve.
    const p384 = inlineClient(es384);
    await expectRefused(verifier.verify(p384, await sign(es256, p384, {}, { kid: undefined }), ENDPOINTS), /no registered key fits alg ES256/);
  });

  it('selects by kid: an unknown kid is refused though a registered key made the signature', async () => {
    const client = inlineClient(es256);
    await expectRefused(verifier.verify(client, await sign(es256, client, {}, { kid: 'ec-2' }), ENDPOINTS), /no registered key has kid "ec-2"/);
    await expectRefused(verifier.verify(client, await sign(es256, client, {}, { kid: 7 }), ENDPOINTS), /kid is not a string of 1 to 200 characters/);
    await expectRefused(verifier.verify(client, await sign(es256, client, {}, { kid: '' }), ENDPOINTS), /kid is not a string of 1 to 200 characters/);
  });

  it('uses a key whose alg is set only with that alg', async () => {
    const pinned: TestKey = { ...rs256, jwk: { ...rs256.jwk, kid: 'rsa-pinned', alg: 'RS256' } };
    const client = inlineClient(pinned);
    await expect(verifier.verify(client, await sign(pinned, client), ENDPOINTS)).resolves.toMatchObject({ keyId: 'rsa-pinned' });
    await expectRefused(verifier.verify(client, await sign(pinned, client, {}, { alg: 'PS256' }), ENDPOINTS), /the registered key with kid "rsa-pinned" does not fit alg PS256/);
  });

  it('tries up to 5 keys that fit when there is no kid, and asks for a kid past that', async () => {
    const keys = await Promise.all(Array.from({ length: 6 }, () => makeKey('ES256')));
    const five = inlineClient(...keys.slice(0, 5));
    await expect(verifier.verify(five, await sign(keys[4]!, five), ENDPOINTS)).resolves.toMatchObject({ jti: expect.any(String) });
    const six = inlineClient(...keys);
    await expectRefused(verifier.verify(six, await sign(keys[0]!, six), ENDPOINTS), /6 registered keys fit alg ES256; the assertion must name its key with kid/);
    // Other types do not count: 5 EC keys and an RSA key.
    const mixed = inlineClient(...keys.slice(0, 5), rs256);
    await expect(verifier.verify(mixed, await sign(keys[0]!, mixed), ENDPOINTS)).resolves.toMatchObject({ jti: expect.any(String) });
  });

  it('refuses a typ made for another kind of token, and accepts JWT and client-authentication+jwt', async () => {
    const client = inlineClient(es256);
    await expectRefused(verifier.verify(client, await sign(es256, client, {}, { typ: 'at+jwt' }), ENDPOINTS), /typ "at\+jwt" names another kind of token/);
    await expectRefused(verifier.verify(client, await sign(es256, client, {}, { typ: 'dpop+jwt' }), ENDPOINTS), /typ "dpop\+jwt"/);
    for (const typ of ['JWT', 'client-authentication+jwt', 'application/client-authentication+jwt']) {
      await expect(verifier.verify(client, await sign(es256, client, {}, { typ }), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    }
  });

  it('refuses an assertion over 8 KiB, and one that is not a JWS', async () => {
    const client = inlineClient(es256);
    const padded = await sign(es256, client, { padding: 'x'.repeat(5800) });
    expect(padded.length).toBeLessThanOrEqual(8192);
    await expect(verifier.verify(client, padded, ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    const tooLong = await sign(es256, client, { padding: 'x'.repeat(6200) });
    expect(tooLong.length).toBeGreaterThan(8192);
    await expectRefused(verifier.verify(client, tooLong, ENDPOINTS), /longer than 8192 characters/);
    await expectRefused(verifier.verify(client, 'not-a-jwt', ENDPOINTS), /not a compact JWS/);
    await expectRefused(verifier.verify(client, 'e30.e30.e30.e30.e30', ENDPOINTS), /not a compact JWS/);
    await expectRefused(verifier.verify(client, 'WzFd.WzFd.AAAA', ENDPOINTS), /not a JWT/);
  });

  it('refuses a client with both jwks and jwks_uri, or neither', async () => {
    const both: AssertionClient = { ...inlineClient(es256), jwks_uri: 'https://client.example.com/jwks' };
    await expectRefused(verifier.verify(both, await sign(es256, both), ENDPOINTS), /both jwks and jwks_uri/);
    const neither: AssertionClient = { ...inlineClient(es256), jwks: null };
    await expectRefused(verifier.verify(neither, await sign(es256, neither), ENDPOINTS), /no registered keys/);
  });

  it('refuses a registered set holding a private key, whatever the schema let through', async () => {
    const client: AssertionClient = { client_id: `client-${++clientCount}`, jwks: { keys: [es256.privateJwk] }, jwks_uri: null };
    await expectRefused(verifier.verify(client, await sign({ ...es256, jwk: es256.privateJwk }, client), ENDPOINTS), /key 1 is a private key/);
  });

  it('follows a change of the registered set without forget', async () => {
    const client = inlineClient(es256);
    await expect(verifier.verify(client, await sign(es256, client), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    const replaced: AssertionClient = { ...client, jwks: { keys: [eddsa.jwk] } };
    await expect(verifier.verify(replaced, await sign(eddsa, replaced), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ed-1' });
    await expectRefused(verifier.verify(replaced, await sign(es256, replaced), ENDPOINTS), /no registered key has kid "ec-1"/);
  });
});

describe('ClientAssertionVerifier: jwks_uri', () => {
  it('accepts with keys fetched from the jwks_uri, fetched once for many assertions', async () => {
    const uri = serveJson(() => ({ keys: [es256.jwk, rs256.jwk] }));
    const client = uriClient(uri);
    expect(await verifier.verify(client, await sign(es256, client), ENDPOINTS)).toMatchObject({ keyId: 'ec-1' });
    expect(await verifier.verify(client, await sign(rs256, client), ENDPOINTS)).toMatchObject({ keyId: await calculateJwkThumbprint(rs256.jwk) });
    expect(hitsOf(uri)).toBe(1);
  });

  it('uses a fetched set for 5 minutes, then fetches it again', async () => {
    const uri = serveJson(() => ({ keys: [es256.jwk] }));
    const client = uriClient(uri);
    await verifier.verify(client, await sign(es256, client), ENDPOINTS);
    later(299);
    await verifier.verify(client, await sign(es256, client), ENDPOINTS);
    expect(hitsOf(uri)).toBe(1);
    later(1);
    await verifier.verify(client, await sign(es256, client), ENDPOINTS);
    expect(hitsOf(uri)).toBe(2);
  });

  it('shares one fetch among concurrent verifications', async () => {
    const uri = serveJson(() => ({ keys: [es256.jwk] }));
    const client = uriClient(uri);
    const assertions = await Promise.all(Array.from({ length: 5 }, () => sign(es256, client)));
    const results = await Promise.all(assertions.map((a) => verifier.verify(client, a, ENDPOINTS)));
    expect(results.map((r) => r.keyId)).toEqual(Array(5).fill('ec-1'));
    expect(hitsOf(uri)).toBe(1);
  });

  it('fetches nothing for an assertion refused on its claims', async () => {
    const uri = serveJson(() => ({ keys: [es256.jwk] }));
    const client = uriClient(uri);
    await expectRefused(verifier.verify(client, await sign(es256, client, { aud: 'https://other.example.com' }), ENDPOINTS), /aud/);
    expect(hitsOf(uri)).toBe(0);
  });

  it('refuses when the jwks_uri cannot be reached', async () => {
    const closed = http.createServer();
    closed.listen(0, '127.0.0.1');
    await once(closed, 'listening');
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((resolve) => closed.close(() => resolve()));
    const client = uriClient(`http://127.0.0.1:${port}/jwks`);
    await expectRefused(verifier.verify(client, await sign(es256, client), ENDPOINTS), /jwks_uri could not be fetched: its server could not be reached \(ECONNREFUSED\)/);
  });

  it('refuses a redirect, a status other than 200, a body that is not JSON or not a usable set', async () => {
    const good = () => ({ keys: [es256.jwk] });
    const cases: [string, RegExp][] = [
      [serveJson(good, 302, { location: serveJson(good) }), /answered with a redirect \(HTTP 302\), which is not followed/],
      [serveJson(good, 404), /HTTP status 404, not 200/],
      [serveJson(good, 201), /HTTP status 201, not 200/],
      [serveRaw((res) => res.writeHead(200, { 'content-type': 'application/json' }).end('{"keys": [')), /did not answer with JSON/],
      [serveJson(() => ({ keys: 'none' })), /is not a JWK Set/],
      [serveJson(() => [es256.jwk]), /is not a JWK Set/],
      [serveJson(() => ({ keys: [es256.jwk, es256.privateJwk] })), /the JWK Set at the jwks_uri: key 2 is a private key/],
      [serveJson(() => ({ keys: [{ ...es256.jwk, use: 'enc' }] })), /has no key usable for signatures \(key 1 has use "enc"/],
      [serveJson(() => ({ keys: Array(101).fill(es256.jwk) })), /more than 100 keys/],
    ];
    for (const [uri, reason] of cases) {
      const client = uriClient(uri);
      await expectRefused(verifier.verify(client, await sign(es256, client), ENDPOINTS), reason);
    }
    // The same set behind the redirect, and beside a key for encryption, is accepted.
    const mixed = uriClient(serveJson(() => ({ keys: [{ ...eddsa.jwk, kid: 'enc-1', use: 'enc' }, es256.jwk] })));
    await expect(verifier.verify(mixed, await sign(es256, mixed), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
  });

  it('remembers a failed fetch for 10 seconds', async () => {
    let status = 500;
    const uri = serveRaw((res) => res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: [es256.jwk] })));
    const client = uriClient(uri);
    await expectRefused(verifier.verify(client, await sign(es256, client), ENDPOINTS), /HTTP status 500/);
    status = 200;
    later(9);
    await expectRefused(verifier.verify(client, await sign(es256, client), ENDPOINTS), /HTTP status 500, not 200 \(9 s ago; not fetched again yet\)/);
    expect(hitsOf(uri)).toBe(1);
    later(1);
    await expect(verifier.verify(client, await sign(es256, client), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    expect(hitsOf(uri)).toBe(2);
  });

  it('picks up rotated keys: an unknown kid fetches the set again, at most once a minute', async () => {
    const k1 = await makeKey('ES256', 'rot-1');
    const k2 = await makeKey('ES256', 'rot-2');
    const k3 = await makeKey('ES256', 'rot-3');
    let keys = [k1.jwk];
    const uri = serveJson(() => ({ keys }));
    const client = uriClient(uri);
    await expect(verifier.verify(client, await sign(k1, client), ENDPOINTS)).resolves.toMatchObject({ keyId: 'rot-1' });
    expect(hitsOf(uri)).toBe(1);

    // The client rotates to k2 within the set's 5 minutes, a minute after the fetch.
    keys = [k2.jwk];
    later(60);
    await expect(verifier.verify(client, await sign(k2, client), ENDPOINTS)).resolves.toMatchObject({ keyId: 'rot-2' });
    expect(hitsOf(uri)).toBe(2);
    await expectRefused(verifier.verify(client, await sign(k1, client), ENDPOINTS), /no registered key has kid "rot-1"/);

    // Another unknown kid within the minute: no fetch, although the set now has it.
    keys = [k2.jwk, k3.jwk];
    later(59);
    await expectRefused(verifier.verify(client, await sign(k3, client), ENDPOINTS), /no registered key has kid "rot-3"/);
    expect(hitsOf(uri)).toBe(2);
    later(1);
    await expect(verifier.verify(client, await sign(k3, client), ENDPOINTS)).resolves.toMatchObject({ keyId: 'rot-3' });
    expect(hitsOf(uri)).toBe(3);
  });

  it('picks up a rotated key without kid when the signature fails, at most once a minute', async () => {
    const before = await makeKey('ES256');
    const after = await makeKey('ES256');
    let keys = [before.jwk];
    const uri = serveJson(() => ({ keys }));
    const client = uriClient(uri);
    await verifier.verify(client, await sign(before, client), ENDPOINTS);
    keys = [after.jwk];
    later(30);
    await expectRefused(verifier.verify(client, await sign(after, client), ENDPOINTS), /signature does not verify with the registered key/);
    expect(hitsOf(uri)).toBe(1);
    later(30);
    await expect(verifier.verify(client, await sign(after, client), ENDPOINTS)).resolves.toMatchObject({ keyId: await calculateJwkThumbprint(after.jwk) });
    expect(hitsOf(uri)).toBe(2);
  });

  it('fetches a changed jwks_uri at once, and again after forget', async () => {
    const first = serveJson(() => ({ keys: [es256.jwk] }));
    const second = serveJson(() => ({ keys: [es256.jwk] }));
    const client = uriClient(first);
    await verifier.verify(client, await sign(es256, client), ENDPOINTS);
    const moved: AssertionClient = { ...client, jwks_uri: second };
    await verifier.verify(moved, await sign(es256, moved), ENDPOINTS);
    expect([hitsOf(first), hitsOf(second)]).toEqual([1, 1]);
    await verifier.verify(moved, await sign(es256, moved), ENDPOINTS);
    expect(hitsOf(second)).toBe(1);
    verifier.forget(client.client_id);
    await verifier.verify(moved, await sign(es256, moved), ENDPOINTS);
    expect(hitsOf(second)).toBe(2);
  });

  it('keeps at most 10,000 clients, dropping the least recently used', async () => {
    const uri = serveJson(() => ({ keys: [es256.jwk] }));
    const watched = uriClient(uri);
    await verifier.verify(watched, await sign(es256, watched), ENDPOINTS);
    // Other clients, each with an entry: an inline set, and an assertion refused on its kid (no signature needed).
    const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
    const header = b64({ alg: 'ES256', kid: 'nobody' });
    const fill = async (count: number) => {
      for (let i = 0; i < count; i++) {
        const other = inlineClient(es256);
        await expectRefused(verifier.verify(other, `${header}.${b64(claimsFor(other.client_id))}.AAAA`, ENDPOINTS), /no registered key has kid "nobody"/);
      }
    };
    await fill(MAX_CACHED_CLIENTS - 1);
    await verifier.verify(watched, await sign(es256, watched), ENDPOINTS);
    expect(hitsOf(uri)).toBe(1);
    // Used just now, so these do not push it out.
    await fill(MAX_CACHED_CLIENTS - 1);
    await verifier.verify(watched, await sign(es256, watched), ENDPOINTS);
    expect(hitsOf(uri)).toBe(1);
    await fill(MAX_CACHED_CLIENTS);
    await verifier.verify(watched, await sign(es256, watched), ENDPOINTS);
    expect(hitsOf(uri)).toBe(2);
  }, 120_000);

  it('by default fetches through the outbound client: the instance’s networks and http rule, 64 KiB', async () => {
    const loopback: Pick<Config, 'issuer' | 'outbound'> = { issuer: ISSUER, outbound: { ...config.outbound, allowedNetworks: ['127.0.0.0/8'] } };
    const own = new ClientAssertionVerifier(loopback, { now });
    const ok = uriClient(serveJson(() => ({ keys: [es256.jwk] })));
    await expect(own.verify(ok, await sign(es256, ok), ENDPOINTS)).resolves.toMatchObject({ keyId: 'ec-1' });
    // 1 MiB is the instance's limit; a jwks_uri gets 64 KiB.
    const large = uriClient(serveJson(() => ({ keys: [es256.jwk], padding: 'x'.repeat(70 * 1024) })));
    await expectRefused(own.verify(large, await sign(es256, large), ENDPOINTS), /could not be fetched: the answer is larger than 64 KiB/);
    // Without loopback among the networks (the instance's own), the address is refused.
    const blocked = uriClient(serveJson(() => ({ keys: [es256.jwk] })));
    await expectRefused(new ClientAssertionVerifier(config, { now }).verify(blocked, await sign(es256, blocked), ENDPOINTS), /could not be fetched: 127\.0\.0\.1 is a special-use address/);
    expect(hitsOf(blocked.jwks_uri!)).toBe(0);
    // Where the instance allows no http (production), neither does the jwks_uri.
    const https = new ClientAssertionVerifier({ issuer: ISSUER, outbound: { ...loopback.outbound, allowHttp: false } }, { now });
    const plain = uriClient(serveJson(() => ({ keys: [es256.jwk] })));
    await expectRefused(https.verify(plain, await sign(es256, plain), ENDPOINTS), /the jwks_uri must use https/);
    expect(hitsOf(plain.jwks_uri!)).toBe(0);
  });
});
