import { generateKeyPair, SignJWT, UnsecuredJWT, exportSPKI, base64url } from 'jose';
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from 'vitest';
import { type AccessTokenClaims, AccessTokenVerifier, InvalidTokenError, signAccessToken, verifyAccessToken } from '../../src/oauth/models/access-tokens.js';
import type { Application } from '../../src/db/schema.js';
import type { RevocationList } from '../../src/oauth/models/revocation-list.js';
import { KeyStore } from '../../src/oauth/models/key-store.js';
import { apiResource } from '../../src/oauth/models/resources.js';
import { ensureSigningKey, getActiveSigningKey, importPrivateKey, rotateSigningKey } from '../../src/oauth/models/signing-keys.js';
import { testConfig, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let keys: KeyStore;
const config = testConfig();
const input = { subject: 'client-1', clientId: 'client-1', scopes: ['contacts.read'], organizationId: 7, grantId: 42, resource: apiResource(config) };

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  keys = new KeyStore(t.handle.db, config);
});
afterAll(() => t.close());

async function reason(token: string): Promise<string> {
  try {
    await verifyAccessToken(keys, config, token);
  } catch (err) {
    if (err instanceof InvalidTokenError) return err.reason;
    throw err;
  }
  return 'accepted';
}

/** Signs arbitrary header and claims with the real active key. */
async function forge(claims: Record<string, unknown>, header: Record<string, unknown> = {}): Promise<string> {
  const row = (await getActiveSigningKey(t.handle.db, 'ES256'))!;
  const key = await importPrivateKey(row, TEST_SECRET_KEY);
  return new SignJWT(claims).setProtectedHeader({ alg: 'ES256', kid: row.kid, typ: 'at+jwt', ...header }).sign(key);
}

async function validClaims(): Promise<AccessTokenClaims> {
  return (await signAccessToken(await keys.signingKey(), config, input)).claims;
}

describe(`access tokens on ${BACKEND}`, () => {
  it('round-trip: signed with typ at+jwt and a kid, verified with every claim', async () => {
    const { token, claims } = await signAccessToken(await keys.signingKey(), config, input);
    const header = JSON.parse(Buffer.from(token.split('.')[0]!, 'base64url').toString()) as Record<string, string>;
    expect(header).toEqual({ alg: 'ES256', kid: (await getActiveSigningKey(t.handle.db, 'ES256'))!.kid, typ: 'at+jwt' });
    expect(await verifyAccessToken(keys, config, token)).toEqual(claims);
    expect(claims).toMatchObject({ sub: 'client-1', scope: 'contacts.read', organization_id: 7, grant_id: 42, aud: `${config.issuer}/api/v1` });
  });

  it.each(['ES256', 'RS256', 'EdDSA'] as const)('signs with node:crypto in a form jose verifies: %s', async (alg) => {
    const other = await createTestDatabase();
    try {
      await ensureSigningKey(other.handle.db, { alg, secretKey: TEST_SECRET_KEY });
      const store = new KeyStore(other.handle.db, config);
      const { token, claims } = await signAccessToken(await store.signingKey(), config, input);
      expect(await verifyAccessToken(store, config, token)).toEqual(claims);
    } finally {
      await other.close();
    }
  });

  it('caches verified tokens for the API but re-checks revocation every time', async () => {
    const revoked = new Set<number | string>();
    const revocations = { isTokenRevoked: (t: { grant_id: number; jti: string }) => revoked.has(t.grant_id) || revoked.has(t.jti) };
    const application = { disabled: false, scopes: ['contacts.read', 'tasks.read'] } as Application;
    const verifier = new AccessTokenVerifier({ keys, config, revocations: revocations as unknown as RevocationList, applications: { find: async () => application } });
    const { token, claims } = await signAccessToken(await keys.signingKey(), config, input);
    const second = await signAccessToken(await keys.signingKey(), config, input);
    expect((await verifier.verify(token)).claims.grant_id).toBe(42);
    expect((await verifier.verify(token)).claims.grant_id).toBe(42);
    // One token revoked by itself: the other token of the grant still works.
    revoked.add(claims.jti);
    await expect(verifier.verify(token)).rejects.toMatchObject({ reason: 'token revoked' });
    expect((await verifier.verify(second.token)).claims.grant_id).toBe(42);
    // The grant revoked: all its tokens.
    // The application disabled (or deleted): its tokens, revoked or not.
    application.disabled = true;
    await expect(verifier.verify(second.token)).rejects.toMatchObject({ reason: 'application disabled or deleted' });
    application.disabled = false;
    // The application narrowed below the token's scopes: refused at once (its grants are being revoked).
    application.scopes = ['tasks.read'];
    await expect(verifier.verify(second.token)).rejects.toMatchObject({ reason: 'scope beyond the application’s' });
    application.scopes = ['contacts.read', 'tasks.read'];
    expect((await verifier.verify(second.token)).claims.grant_id).toBe(42);
    revoked.add(42);
    await expect(verifier.verify(second.token)).rejects.toMatchObject({ reason: 'token revoked' });
    await expect(verifier.verify(`${token}x`)).rejects.toBeInstanceOf(InvalidTokenError);
  });

  it('rejects alg none (JW-1)', async () => {
    const unsecured = new UnsecuredJWT({ ...(await validClaims()) }).encode();
    expect(await reason(unsecured)).toMatch(/ERR_JOSE_ALG_NOT_ALLOWED|no kid/);
    const withKid = `${base64url.encode(JSON.stringify({ alg: 'none', typ: 'at+jwt', kid: (await getActiveSigningKey(t.handle.db, 'ES256'))!.kid }))}.${unsecured.split('.')[1]}.`;
    expect(await reason(withKid)).not.toBe('accepted');
  });

  it('rejects HMAC signed with the public key (algorithm confusion, JW-1)', async () => {
    const row = (await getActiveSigningKey(t.handle.db, 'ES256'))!;
    const secret = new TextEncoder().encode(JSON.stringify(row.public_jwk));
    const forged = await new SignJWT({ ...(await validClaims()) }).setProtectedHeader({ alg: 'HS256', kid: row.kid, typ: 'at+jwt' }).sign(secret);
    expect(await reason(forged)).not.toBe('accepted');
  });

  it('rejects a token signed by a key we never issued, even with our kid', async () => {
    const { privateKey, publicKey } = await generateKeyPair('ES256');
    expect(await exportSPKI(publicKey)).toContain('PUBLIC KEY');
    const row = (await getActiveSigningKey(t.handle.db, 'ES256'))!;
    const forged = await new SignJWT({ ...(await validClaims()) }).setProtectedHeader({ alg: 'ES256', kid: row.kid, typ: 'at+jwt' }).sign(privateKey);
    expect(await reason(forged)).toBe('ERR_JWS_SIGNATURE_VERIFICATION_FAILED');
  });

  it('rejects an unknown kid without fetching anything (JW-3)', async () => {
    expect(await reason(await forge({ ...(await validClaims()) }, { kid: 'made-up' }))).toBe('unknown kid');
    expect(await reason(await forge({ ...(await validClaims()) }, { kid: undefined }))).toBe('no kid');
  });

  it.each([['jwt'], ['JWT'], ['application/at+jwt+x'], [undefined]])('rejects typ %s (JW-2)', async (typ) => {
    expect(await reason(await forge({ ...(await validClaims()) }, { typ }))).toBe('ERR_JWT_CLAIM_VALIDATION_FAILED');
  });

  it('checks iss, aud, exp and iat with a small leeway (JW-3)', async () => {
    const now = Math.floor(Date.now() / 1000);
    const base = await validClaims();
    expect(await reason(await forge({ ...base, iss: 'https://evil.example.com' }))).toBe('ERR_JWT_CLAIM_VALIDATION_FAILED');
    expect(await reason(await forge({ ...base, aud: 'https://other.example.com/api' }))).toBe('ERR_JWT_CLAIM_VALIDATION_FAILED');
    expect(await reason(await forge({ ...base, exp: now - 120 }))).toBe('ERR_JWT_EXPIRED');
    expect(await reason(await forge({ ...base, exp: now - 30 }))).toBe('accepted');
    expect(await reason(await forge({ ...base, iat: now + 600 }))).toBe('issued in the future');
    expect(await reason(await forge({ ...base, nbf: now + 600 }))).toBe('ERR_JWT_CLAIM_VALIDATION_FAILED');
    const { exp: _exp, ...noExp } = base;
    expect(await reason(await forge(noExp))).toBe('ERR_JWT_CLAIM_VALIDATION_FAILED');
  });

  it('rejects claims of the wrong shape', async () => {
    const base = await validClaims();
    expect(await reason(await forge({ ...base, organization_id: '7' }))).toBe('claims of the wrong shape');
    expect(await reason(await forge({ ...base, grant_id: undefined }))).toBe('claims of the wrong shape');
    const arrayPayload = `${base64url.encode(JSON.stringify({ alg: 'ES256', typ: 'at+jwt', kid: 'x' }))}.${base64url.encode('[1,2]')}.sig`;
    expect(await reason(arrayPayload)).not.toBe('accepted');
    expect(await reason('not.a.jwt')).not.toBe('accepted');
    expect(await reason('')).not.toBe('accepted');
  });

  it('signs with a key rotated elsewhere within a second', async () => {
    const here = new KeyStore(t.handle.db, config);
    const before = (await here.signingKey()).kid;
    const rotated = await rotateSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
    await expect.poll(async () => (await here.signingKey()).kid, { timeout: 2500, interval: 100 }).toBe(rotated.kid);
    expect(rotated.kid).not.toBe(before);
  });

  it('keeps verifying tokens of a retired key, and sees a key rotated by another instance', async () => {
    const { token: old } = await signAccessToken(await keys.signingKey(), config, input);
    // "Another instance": its own KeyStore over the same database.
    const elsewhere = new KeyStore(t.handle.db, config);
    const rotated = await rotateSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
    const { token: fresh } = await signAccessToken(await elsewhere.signingKey(), config, input);
    expect(JSON.parse(Buffer.from(fresh.split('.')[0]!, 'base64url').toString()).kid).toBe(rotated.kid);
    // The unknown-kid reload runs at most once a second: the clock (Date) is moved on by one rather than waited for.
    vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
    onTestFinished(() => void vi.useRealTimers());
    vi.setSystemTime(Date.now() + 1100);
    expect(await reason(fresh)).toBe('accepted');
    expect(await reason(old)).toBe('accepted');
    // The retired key and the new one are both published.
    const kids = (await keys.jwks()).keys.map((k) => k.kid);
    expect(kids).toContain(rotated.kid);
    expect(kids).toContain(JSON.parse(Buffer.from(old.split('.')[0]!, 'base64url').toString()).kid);
  });
});
