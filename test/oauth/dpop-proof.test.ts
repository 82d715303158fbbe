/**
 * The DPoP proof verifier (src/oauth/helpers/dpop.ts), with no database: proofs signed by jose for
 * every accepted alg, and each check of RFC 9449 §4.3 broken on an otherwise valid proof (so each
 * test fails if its check goes), proofs jose refuses to sign made by hand with node:crypto, htu
 * normalization, the RFC 7638 thumbprint against jose's, and the bound of the key cache.
 */
import { constants, createHash, createHmac, createPrivateKey, generateKeyPairSync, type JsonWebKey, type KeyObject, randomUUID, sign } from 'node:crypto';
import { calculateJwkThumbprint, type CryptoKey, exportJWK, generateKeyPair, importJWK, type JWK, SignJWT } from 'jose';
import { describe, expect, it } from 'vitest';
import {
  accessTokenHashForDpop,
  DPOP_ALGS,
  type DpopAlg,
  type DpopExpectation,
  DpopProofError,
  dpopKeyCacheSize,
  dpopThumbprint,
  normalizeHtu,
  verifyDpopProof,
} from '../../src/oauth/helpers/dpop.js';

const TOKEN_URL = 'https://auth.example.com/oauth/token';
const NOW = 1_800_000_000;
const EXPECTED: DpopExpectation = { htm: 'POST', htu: TOKEN_URL, now: NOW };

interface Signer {
  alg: DpopAlg;
  key: CryptoKey;
  publicJwk: JWK;
  privateJwk: JWK;
}

async function newSigner(alg: DpopAlg): Promise<Signer> {
  const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true });
  return { alg, key: privateKey, publicJwk: await exportJWK(publicKey), privateJwk: await exportJWK(privateKey) };
}

/** The same key pair for another alg of its type (RS256 and PS256 share an RSA key). */
async function withAlg(signer: Signer, alg: DpopAlg): Promise<Signer> {
  return { ...signer, alg, key: (await importJWK(signer.privateJwk, alg)) as CryptoKey };
}

const signers = {
  ES256: await newSigner('ES256'),
  ES384: await newSigner('ES384'),
  ES512: await newSigner('ES512'),
  EdDSA: await newSigner('EdDSA'),
  RSA: await newSigner('RS256'),
};

function claims(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return { jti: randomUUID(), htm: 'POST', htu: TOKEN_URL, iat: NOW, ...overrides };
}

/** A proof signed by jose; `header` adds to or replaces the protected header. */
function proof(signer: Signer, payload: Record<string, unknown> = claims(), header: Record<string, unknown> = {}): Promise<string> {
  return new SignJWT(payload).setProtectedHeader({ alg: signer.alg, typ: 'dpop+jwt', jwk: signer.publicJwk, ...header }).sign(signer.key);
}

const b64 = (value: unknown): string => Buffer.from(JSON.stringify(value)).toString('base64url');

/** A proof made by hand, for what jose will not sign: `signature` receives the signing input. */
function handmade(header: Record<string, unknown>, payload: Record<string, unknown>, signature: (input: Buffer) => Buffer): string {
  const input = `${b64(header)}.${b64(payload)}`;
  return `${input}.${signature(Buffer.from(input)).toString('base64url')}`;
}

const nodeKey = (signer: Signer): KeyObject => createPrivateKey({ key: signer.privateJwk as JsonWebKey, format: 'jwk' });

async function refused(promise: Promise<unknown>, message: RegExp, error: DpopProofError['error'] = 'invalid_dpop_proof'): Promise<void> {
  const thrown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(thrown, 'the proof was accepted').toBeInstanceOf(DpopProofError);
  expect((thrown as DpopProofError).error).toBe(error);
  expect((thrown as DpopProofError).message).toMatch(message);
}

describe('valid proofs', () => {
  const cases: [DpopAlg, () => Promise<Signer>][] = [
    ['ES256', async () => signers.ES256],
    ['ES384', async () => signers.ES384],
    ['ES512', async () => signers.ES512],
    ['EdDSA', async () => signers.EdDSA],
    ...(['RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512'] as const).map((alg): [DpopAlg, () => Promise<Signer>] => [alg, () => withAlg(signers.RSA, alg)]),
  ];

  it('covers every accepted alg', () => {
    expect(cases.map(([alg]) => alg).sort()).toEqual([...DPOP_ALGS].sort());
  });

  it.each(cases)('%s is accepted, with the thumbprint jose computes', async (_alg, make) => {
    const signer = await make();
    const payload = claims();
    const verified = await verifyDpopProof(await proof(signer, payload), EXPECTED);
    expect(verified).toEqual({ jkt: await calculateJwkThumbprint(signer.publicJwk), jti: payload.jti, iat: NOW, replayUntil: NOW + 60 + 5 });
  });

  it.each(cases)('%s with the payload altered after signing is refused', async (_alg, make) => {
    const signer = await make();
    const [header, , signature] = (await proof(signer)).split('.');
    await refused(verifyDpopProof(`${header}.${b64(claims())}.${signature}`, EXPECTED), /signature is invalid/);
  });

  it('replayUntil covers the whole window a jti could be accepted in', async () => {
    const verified = await verifyDpopProof(await proof(signers.ES256, claims({ iat: NOW - 100 })), { ...EXPECTED, maxAgeSeconds: 120, maxFutureSeconds: 10 });
    expect(verified.replayUntil).toBe(NOW - 100 + 120 + 10);
  });

  it('uses the clock when no now is given', async () => {
    const iat = Math.floor(Date.now() / 1000);
    await expect(verifyDpopProof(await proof(signers.ES256, claims({ iat })), { htm: 'POST', htu: TOKEN_URL })).resolves.toMatchObject({ iat });
    await refused(verifyDpopProof(await proof(signers.ES256, claims({ iat: iat + 3600 })), { htm: 'POST', htu: TOKEN_URL }), /future/);
  });
});

describe('the header', () => {
  it('refuses a typ other than dpop+jwt, or none', async () => {
    await refused(verifyDpopProof(await proof(signers.ES256, claims(), { typ: 'JWT' }), EXPECTED), /typ/);
    await refused(verifyDpopProof(await proof(signers.ES256, claims(), { typ: undefined }), EXPECTED), /typ/);
  });

  it('refuses alg none', async () => {
    const header = { alg: 'none', typ: 'dpop+jwt', jwk: signers.ES256.publicJwk };
    await refused(verifyDpopProof(`${b64(header)}.${b64(claims())}.`, EXPECTED), /alg header is not an accepted/);
  });

  it('refuses HS256, even with the public key as the HMAC secret', async () => {
    const jwk = signers.ES256.publicJwk;
    const header = { alg: 'HS256', typ: 'dpop+jwt', jwk };
    const proofValue = handmade(header, claims(), (input) => createHmac('sha256', JSON.stringify(jwk)).update(input).digest());
    await refused(verifyDpopProof(proofValue, EXPECTED), /alg header is not an accepted/);
  });

  it('refuses a crit header', async () => {
    const signer = signers.ES256;
    const header = { alg: 'ES256', typ: 'dpop+jwt', jwk: signer.publicJwk, crit: ['exp'], exp: NOW + 10 };
    const proofValue = handmade(header, claims(), (input) => sign('sha256', input, { key: nodeKey(signer), dsaEncoding: 'ieee-p1363' }));
    await refused(verifyDpopProof(proofValue, EXPECTED), /crit/);
  });

  it('refuses a jwk that is not an object', async () => {
    await refused(verifyDpopProof(await proof(signers.ES256, claims(), { jwk: 'key' }), EXPECTED), /jwk header must be a JWK object/);
  });

  it.each(['d', 'p', 'q', 'dp', 'dq', 'qi', 'k', 'oth'])('refuses a jwk with the private member %s', async (member) => {
    const signer = signers.ES256;
    const value = member === 'd' ? signer.privateJwk.d : member === 'oth' ? [] : 'AQAB';
    const jwk = { ...signer.publicJwk, [member]: value };
    await refused(verifyDpopProof(await proof(signer, claims(), { jwk }), EXPECTED), new RegExp(`private member "${member}"`));
  });

  it('refuses a whole private RSA key in the header', async () => {
    const signer = await withAlg(signers.RSA, 'PS256');
    await refused(verifyDpopProof(await proof(signer, claims(), { jwk: signer.privateJwk }), EXPECTED), /private member "d"/);
  });

  it('refuses an alg that does not fit the key type or curve', async () => {
    const ec = signers.ES256;
    // ES384 over a P-256 key: a valid ECDSA signature with SHA-384, refused for the curve alone.
    const es384 = handmade({ alg: 'ES384', typ: 'dpop+jwt', jwk: ec.publicJwk }, claims(), (input) =>
      sign('sha384', input, { key: nodeKey(ec), dsaEncoding: 'ieee-p1363' }),
    );
    await refused(verifyDpopProof(es384, EXPECTED), /alg ES384 does not fit the P-256 curve/);
    const rsa = await withAlg(signers.RSA, 'RS256');
    const es256OnRsa = handmade({ alg: 'ES256', typ: 'dpop+jwt', jwk: rsa.publicJwk }, claims(), (input) => sign('sha256', input, nodeKey(rsa)));
    await refused(verifyDpopProof(es256OnRsa, EXPECTED), /alg ES256 does not fit a RSA key/);
    const rs256OnEc = handmade({ alg: 'RS256', typ: 'dpop+jwt', jwk: ec.publicJwk }, claims(), (input) => sign('sha256', input, nodeKey(ec)));
    await refused(verifyDpopProof(rs256OnEc, EXPECTED), /alg RS256 does not fit a EC key/);
    const ed = signers.EdDSA;
    const es256OnEd = handmade({ alg: 'ES256', typ: 'dpop+jwt', jwk: ed.publicJwk }, claims(), (input) => sign(null, input, nodeKey(ed)));
    await refused(verifyDpopProof(es256OnEd, EXPECTED), /alg ES256 does not fit a OKP key/);
  });

  it('refuses a jwk naming another alg', async () => {
    const signer = signers.ES256;
    await refused(verifyDpopProof(await proof(signer, claims(), { jwk: { ...signer.publicJwk, alg: 'ES384' } }), EXPECTED), /names another alg/);
  });

  it('refuses an RSA modulus under 2048 bits', async () => {
    const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 1024 });
    const header = { alg: 'RS256', typ: 'dpop+jwt', jwk: publicKey.export({ format: 'jwk' }) };
    await refused(verifyDpopProof(handmade(header, claims(), (input) => sign('sha256', input, privateKey)), EXPECTED), /modulus must have 2048 to 8192 bits, not 1024/);
  });

  it('refuses an RSA modulus over 8192 bits and an exponent over 33 bits', async () => {
    const rsa = signers.RSA.publicJwk;
    const bigModulus = Buffer.alloc(1025, 0xc5).toString('base64url');
    const sig = () => Buffer.alloc(1025, 1);
    await refused(verifyDpopProof(handmade({ alg: 'RS256', typ: 'dpop+jwt', jwk: { kty: 'RSA', n: bigModulus, e: 'AQAB' } }, claims(), sig), EXPECTED), /modulus must have 2048 to 8192 bits, not 8200/);
    const bigExponent = Buffer.from([0x01, 0, 0, 0, 0, 0x01]).toString('base64url');
    await refused(verifyDpopProof(handmade({ alg: 'RS256', typ: 'dpop+jwt', jwk: { ...rsa, e: bigExponent } }, claims(), sig), EXPECTED), /exponent must have at most 33 bits/);
  });

  it('refuses key members that are not canonical base64url', async () => {
    const ec = signers.ES256;
    await refused(verifyDpopProof(await proof(ec, claims(), { jwk: { ...ec.publicJwk, x: `${ec.publicJwk.x}=` } }), EXPECTED), /x must be 32 octets/);
    // 43 characters carry 258 bits: the last 2 must be zero. Node would decode this y to the same
    // point, so the same key would have a second thumbprint.
    const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_';
    const y = ec.publicJwk.y!;
    const sloppyY = y.slice(0, -1) + alphabet[alphabet.indexOf(y.at(-1)!) ^ 1];
    expect(Buffer.from(sloppyY, 'base64url')).toEqual(Buffer.from(y, 'base64url'));
    await refused(verifyDpopProof(await proof(ec, claims(), { jwk: { ...ec.publicJwk, y: sloppyY } }), EXPECTED), /y must be 32 octets/);
    // A zero octet in front of x: Node imports the same point, under another thumbprint.
    const longX = Buffer.concat([Buffer.alloc(1), Buffer.from(ec.publicJwk.x!, 'base64url')]).toString('base64url');
    await refused(verifyDpopProof(await proof(ec, claims(), { jwk: { ...ec.publicJwk, x: longX } }), EXPECTED), /x must be 32 octets/);
    // One extra zero octet in front of n: the same RSA key, but not a Base64urlUInt (RFC 7518 §2).
    const rsa = await withAlg(signers.RSA, 'RS256');
    const paddedN = Buffer.concat([Buffer.alloc(1), Buffer.from(rsa.publicJwk.n!, 'base64url')]).toString('base64url');
    await refused(verifyDpopProof(await proof(rsa, claims(), { jwk: { ...rsa.publicJwk, n: paddedN } }), EXPECTED), /n and e must be base64url unsigned integers/);
  });

  it('refuses a curve other than P-256/384/521 or Ed25519, and a point off the curve', async () => {
    const ec = signers.ES256;
    await refused(verifyDpopProof(await proof(ec, claims(), { jwk: { ...ec.publicJwk, crv: 'secp256k1' } }), EXPECTED), /crv must be P-256 or P-384 or P-521/);
    await refused(verifyDpopProof(await proof(ec, claims(), { jwk: { ...ec.publicJwk, y: ec.publicJwk.x } }), EXPECTED), /not a valid public key/);
  });

  it('refuses a PS256 signature whose salt is not as long as the digest', async () => {
    const signer = await withAlg(signers.RSA, 'PS256');
    const header = { alg: 'PS256', typ: 'dpop+jwt', jwk: signer.publicJwk };
    const make = (saltLength: number) => handmade(header, claims(), (input) => sign('sha256', input, { key: nodeKey(signer), padding: constants.RSA_PKCS1_PSS_PADDING, saltLength }));
    await expect(verifyDpopProof(make(32), EXPECTED)).resolves.toMatchObject({ iat: NOW });
    await refused(verifyDpopProof(make(0), EXPECTED), /signature is invalid/);
  });
});

describe('the claims', () => {
  const ec = signers.ES256;

  it('refuses a missing, empty or overlong jti', async () => {
    await refused(verifyDpopProof(await proof(ec, claims({ jti: undefined })), EXPECTED), /jti/);
    await refused(verifyDpopProof(await proof(ec, claims({ jti: '' })), EXPECTED), /jti/);
    await refused(verifyDpopProof(await proof(ec, claims({ jti: 'j'.repeat(257) })), EXPECTED), /jti/);
    await expect(verifyDpopProof(await proof(ec, claims({ jti: 'j'.repeat(256) })), EXPECTED)).resolves.toMatchObject({ jti: 'j'.repeat(256) });
  });

  it('refuses an htm other than the request method, compared exactly', async () => {
    await refused(verifyDpopProof(await proof(ec, claims({ htm: 'GET' })), EXPECTED), /htm does not match the request method/);
    await refused(verifyDpopProof(await proof(ec, claims({ htm: 'post' })), EXPECTED), /htm does not match the request method/);
    await refused(verifyDpopProof(await proof(ec, claims({ htm: undefined })), EXPECTED), /htm claim is missing/);
  });

  it.each([
    ['another path', 'https://auth.example.com/oauth/token2'],
    ['a path in other case', 'https://auth.example.com/OAUTH/token'],
    ['another host', 'https://evil.example.com/oauth/token'],
    ['another scheme', 'http://auth.example.com/oauth/token'],
    ['another port', 'https://auth.example.com:8443/oauth/token'],
  ])('refuses an htu with %s', async (_what, htu) => {
    await refused(verifyDpopProof(await proof(ec, claims({ htu })), EXPECTED), /htu does not match the request URL/);
  });

  it('refuses an htu that is missing or not an absolute http(s) URI', async () => {
    await refused(verifyDpopProof(await proof(ec, claims({ htu: undefined })), EXPECTED), /htu claim is missing/);
    await refused(verifyDpopProof(await proof(ec, claims({ htu: '/oauth/token' })), EXPECTED), /not an absolute http\(s\) URI/);
  });

  it('ignores the query and fragment of htu and of the request URL', async () => {
    await expect(verifyDpopProof(await proof(ec, claims({ htu: `${TOKEN_URL}?a=1#top` })), EXPECTED)).resolves.toMatchObject({ iat: NOW });
    const api = { htm: 'GET', htu: 'https://api.example.com/v1/orgs?limit=10&after=x', now: NOW };
    await expect(verifyDpopProof(await proof(ec, claims({ htm: 'GET', htu: 'https://api.example.com/v1/orgs' })), api)).resolves.toMatchObject({ iat: NOW });
  });

  it('compares htu after normalization: case of scheme and host, default port, percent-encoding, dot segments', async () => {
    for (const htu of ['HTTPS://Auth.EXAMPLE.com:443/oauth/token', 'https://auth.example.com/oauth/%74oken', 'https://auth.example.com/x/../oauth/./token']) {
      await expect(verifyDpopProof(await proof(ec, claims({ htu })), EXPECTED), htu).resolves.toMatchObject({ iat: NOW });
    }
  });

  it('refuses when the request URL itself cannot be normalized (a bad Host header), without a TypeError', async () => {
    await refused(verifyDpopProof(await proof(ec), { ...EXPECTED, htu: 'https://bad host/oauth/token' }), /request URL cannot be compared/);
  });

  it('refuses an iat too old or too far in the future, and accepts the edges', async () => {
    await refused(verifyDpopProof(await proof(ec, claims({ iat: NOW - 61 })), EXPECTED), /too old/);
    await expect(verifyDpopProof(await proof(ec, claims({ iat: NOW - 60 })), EXPECTED)).resolves.toMatchObject({ iat: NOW - 60 });
    await refused(verifyDpopProof(await proof(ec, claims({ iat: NOW + 6 })), EXPECTED), /in the future/);
    await expect(verifyDpopProof(await proof(ec, claims({ iat: NOW + 5 })), EXPECTED)).resolves.toMatchObject({ iat: NOW + 5 });
    await expect(verifyDpopProof(await proof(ec, claims({ iat: NOW - 200 })), { ...EXPECTED, maxAgeSeconds: 300 })).resolves.toMatchObject({ iat: NOW - 200 });
    await refused(verifyDpopProof(await proof(ec, claims({ iat: NOW + 20 })), { ...EXPECTED, maxFutureSeconds: 10 }), /in the future/);
  });

  it('refuses an iat that is not a number', async () => {
    await refused(verifyDpopProof(await proof(ec, claims({ iat: String(NOW) })), EXPECTED), /iat claim must be a number/);
    await refused(verifyDpopProof(await proof(ec, claims({ iat: undefined })), EXPECTED), /iat claim must be a number/);
  });

  describe('ath', () => {
    const token = 'Kz~8mXK1EalYznwH-LC-1fBAo.4Ljp~zsPE_NeO.gxU';
    const withToken = { ...EXPECTED, accessToken: token };

    it('is the hash of RFC 9449 §7.1', () => {
      expect(accessTokenHashForDpop(token)).toBe('fUHyO2r2Z3DZ53EsNrWBb0xWXoaNy59IiKCAqksmQEo');
      expect(accessTokenHashForDpop(token)).toBe(createHash('sha256').update(token).digest('base64url'));
    });

    it('accepts the right ath and refuses a wrong or missing one when a token is presented', async () => {
      await expect(verifyDpopProof(await proof(ec, claims({ ath: accessTokenHashForDpop(token) })), withToken)).resolves.toMatchObject({ iat: NOW });
      await refused(verifyDpopProof(await proof(ec, claims({ ath: accessTokenHashForDpop(`${token}x`) })), withToken), /ath does not match the access token/);
      await refused(verifyDpopProof(await proof(ec, claims()), withToken), /ath claim is missing/);
    });

    it('is not checked when no token is presented', async () => {
      await expect(verifyDpopProof(await proof(ec, claims({ ath: 'anything' })), EXPECTED)).resolves.toMatchObject({ iat: NOW });
    });
  });

  describe('nonce', () => {
    it('answers use_dpop_nonce to a missing or other nonce, and accepts a current one', async () => {
      await refused(verifyDpopProof(await proof(ec), { ...EXPECTED, nonce: 'n1' }), /must carry the nonce/, 'use_dpop_nonce');
      await refused(verifyDpopProof(await proof(ec, claims({ nonce: 'n2' })), { ...EXPECTED, nonce: 'n1' }), /nonce is not current/, 'use_dpop_nonce');
      await refused(verifyDpopProof(await proof(ec, claims({ nonce: 7 })), { ...EXPECTED, nonce: '7' }), /must carry the nonce/, 'use_dpop_nonce');
      await expect(verifyDpopProof(await proof(ec, claims({ nonce: 'n1' })), { ...EXPECTED, nonce: 'n1' })).resolves.toMatchObject({ iat: NOW });
    });

    it('accepts any of several current nonces', async () => {
      const nonce = ['previous', 'current'];
      await expect(verifyDpopProof(await proof(ec, claims({ nonce: 'previous' })), { ...EXPECTED, nonce })).resolves.toMatchObject({ iat: NOW });
      await refused(verifyDpopProof(await proof(ec, claims({ nonce: 'older' })), { ...EXPECTED, nonce }), /nonce is not current/, 'use_dpop_nonce');
    });

    it('never answers use_dpop_nonce to a proof that is invalid otherwise', async () => {
      const [header, , signature] = (await proof(ec)).split('.');
      await refused(verifyDpopProof(`${header}.${b64(claims())}.${signature}`, { ...EXPECTED, nonce: 'n1' }), /signature is invalid/);
    });
  });
});

describe('malformed proofs', () => {
  it('refuses a proof over 8 KiB before parsing, even if valid', async () => {
    const big = await proof(signers.ES256, claims({ pad: 'x'.repeat(6200) }));
    expect(big.length).toBeGreaterThan(8192);
    await refused(verifyDpopProof(big, EXPECTED), /larger than 8 KiB/);
    const fits = await proof(signers.ES256, claims({ pad: 'x'.repeat(5500) }));
    expect(fits.length).toBeLessThanOrEqual(8192);
    await expect(verifyDpopProof(fits, EXPECTED)).resolves.toMatchObject({ iat: NOW });
  });

  it('refuses a valid proof with a part added', async () => {
    const valid = await proof(signers.ES256);
    await refused(verifyDpopProof(`${valid}.e30`, EXPECTED), /three parts/);
    await refused(verifyDpopProof(`${valid}.`, EXPECTED), /three parts/);
  });

  const header = b64({ alg: 'ES256', typ: 'dpop+jwt', jwk: signers.ES256.publicJwk });
  it.each([
    ['a.b.c', 'a.b.c'],
    ['empty', ''],
    ['one part', 'x'],
    ['two parts', 'a.b'],
    ['four parts', 'a.b.c.d'],
    ['only dots', '..'],
    ['a header that is not base64url', 'a*b.c.d'],
    ['a header that is not JSON', `${Buffer.from('{nope').toString('base64url')}.e30.c2ln`],
    ['a header that is a JSON array', `${b64([1])}.e30.c2ln`],
    ['a header that is JSON null', `${b64(null)}.e30.c2ln`],
    ['a header that is not UTF-8', `${Buffer.from([0x7b, 0xff, 0x7d]).toString('base64url')}.e30.c2ln`],
    ['a header with base64 padding', `${header}=.e30.c2ln`],
    ['a payload that is not JSON', `${header}.bm9wZQ.c2ln`],
    ['a payload that is a string', `${header}.${b64('claims')}.c2ln`],
    ['an empty signature', `${header}.${b64(claims())}.`],
    ['a signature that is not base64url', `${header}.${b64(claims())}.s!g`],
    ['a signature of the wrong length', `${header}.${b64(claims())}.c2ln`],
  ])('refuses %s as invalid_dpop_proof, never a TypeError', async (_what, value) => {
    await refused(verifyDpopProof(value, EXPECTED), /./);
  });

  it('refuses a proof that is not a string', async () => {
    await refused(verifyDpopProof(undefined as unknown as string, EXPECTED), /missing or empty/);
    await refused(verifyDpopProof({ length: 3 } as unknown as string, EXPECTED), /missing or empty/);
  });
});

describe('normalizeHtu', () => {
  it.each([
    ['https://auth.example.com/oauth/token', 'https://auth.example.com/oauth/token'],
    ['HTTPS://AUTH.Example.COM/oauth/token', 'https://auth.example.com/oauth/token'],
    ['https://auth.example.com:443/oauth/token', 'https://auth.example.com/oauth/token'],
    ['http://auth.example.com:80/a', 'http://auth.example.com/a'],
    ['https://auth.example.com:8443/a', 'https://auth.example.com:8443/a'],
    ['https://auth.example.com', 'https://auth.example.com/'],
    ['https://auth.example.com:/a', 'https://auth.example.com/a'],
    ['https://auth.example.com/a?b=c#d', 'https://auth.example.com/a'],
    ['https://auth.example.com?b', 'https://auth.example.com/'],
    ['https://auth.example.com#/a', 'https://auth.example.com/'],
    ['https://auth.example.com/a%2fb%c3%a9', 'https://auth.example.com/a%2Fb%C3%A9'],
    ['https://auth.example.com/%7euser/%41', 'https://auth.example.com/~user/A'],
    ['https://auth.example.com/a/./b/../c', 'https://auth.example.com/a/c'],
    ['https://auth.example.com/a/%2e%2E/c', 'https://auth.example.com/c'],
    ['https://auth.example.com/A/B', 'https://auth.example.com/A/B'],
    ['https://[::1]:443/x', 'https://[::1]/x'],
    ['https://auth.example.com/a?q=\u00e9 x', 'https://auth.example.com/a'],
  ])('%s -> %s', (input, output) => {
    expect(normalizeHtu(input)).toBe(output);
  });

  it.each([
    ['a relative reference', '/oauth/token'],
    ['no scheme', 'auth.example.com/oauth/token'],
    ['empty', ''],
    ['another scheme', 'ftp://auth.example.com/x'],
    ['no authority', 'https:auth.example.com/x'],
    ['an empty authority', 'https:///auth.example.com/x'],
    ['user info', 'https://user:pass@auth.example.com/x'],
    ['a backslash', 'https://auth.example.com\\x'],
    ['leading whitespace', ' https://auth.example.com/x'],
    ['a space in the path', 'https://auth.example.com/a b'],
    ['a non-ASCII path', 'https://auth.example.com/\u00e9'],
    ['a broken percent-encoding', 'https://auth.example.com/%zz'],
    ['a bad port', 'https://auth.example.com:99999/x'],
    ['a bad host', 'https://auth%00example.com/x'],
    ['an unclosed IPv6 literal', 'https://[::1/x'],
  ])('refuses %s', (_what, input) => {
    expect(normalizeHtu(input)).toBeUndefined();
  });
});

describe('dpopThumbprint', () => {
  it('is the RFC 7638 thumbprint jose computes, for EC, RSA and OKP, ignoring other members and their order', async () => {
    for (const signer of Object.values(signers)) {
      const expected = await calculateJwkThumbprint(signer.publicJwk);
      expect(dpopThumbprint(signer.publicJwk)).toBe(expected);
      const reordered = Object.fromEntries(Object.entries({ ...signer.publicJwk, kid: 'k1', use: 'sig' }).reverse());
      expect(dpopThumbprint(reordered)).toBe(expected);
    }
  });

  it('refuses a JWK without a usable kty or with a required member missing', () => {
    expect(() => dpopThumbprint({ kty: 'oct', k: 'AAAA' })).toThrow(DpopProofError);
    expect(() => dpopThumbprint({ kty: 'EC', crv: 'P-256', x: 'AAAA' })).toThrow(/"y"/);
  });
});

describe('the key cache', () => {
  it('holds a key once its signature verified, once however often it is used', async () => {
    const signer = await newSigner('EdDSA');
    const [header, , signature] = (await proof(signer)).split('.');
    const before = dpopKeyCacheSize();
    await refused(verifyDpopProof(`${header}.${b64(claims())}.${signature}`, EXPECTED), /signature is invalid/);
    expect(dpopKeyCacheSize()).toBe(before);
    await verifyDpopProof(await proof(signer), EXPECTED);
    expect(dpopKeyCacheSize()).toBe(before + 1);
    await verifyDpopProof(await proof(signer), EXPECTED);
    expect(dpopKeyCacheSize()).toBe(before + 1);
    // A cached key still checks the signature.
    await refused(verifyDpopProof(`${header}.${b64(claims())}.${signature}`, EXPECTED), /signature is invalid/);
  });

  it('stays at 1,000 keys after 1,200 distinct ones', async () => {
    for (let i = 0; i < 1200; i++) {
      const signer = await newSigner(i % 2 === 0 ? 'EdDSA' : 'ES256');
      await verifyDpopProof(await proof(signer), EXPECTED);
    }
    expect(dpopKeyCacheSize()).toBe(1000);
  });
});
