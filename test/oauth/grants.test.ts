import { sql } from 'kysely';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import argon2 from 'argon2';
import { hashPassword, verifyPassword } from '../../src/accounts/passwords.js';
import { connectDatabase } from '../../src/db/connect.js';
import { migrateToLatest } from '../../src/db/migrate.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { createAuthorizationCode } from '../../src/oauth/models/authorization-codes.js';
import { REVOCATION_CHANNEL, revokeGrant } from '../../src/oauth/models/grants.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { s256 } from '../../src/oauth/helpers/pkce.js';
import { RevocationList } from '../../src/oauth/models/revocation-list.js';
import { buildTestApp, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { basic, createOrgFixture, form, type OrgFixture, SAFE_DESCRIPTION } from '../helpers/oauth.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let org: OrgFixture;
let other: OrgFixture;
const REDIRECT = 'https://client.example.com/cb';
const VERIFIER = 'v'.repeat(43) + '-._~0123456789';

beforeAll(async () => {
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(t.handle.db, { listen: t.handle.listen });
  org = await createOrgFixture(t.handle.db);
  other = await createOrgFixture(t.handle.db);
});
afterAll(async () => {
  await app.close();
  await t.close();
});

const publicAuth = () => ({ authorization: basic(org.publicApp.client_id, org.publicApp.client_secret) });

function post(url: string, fields: Record<string, string>, headers: Record<string, string> = publicAuth()): Promise<LightMyRequestResponse> {
  return app.inject({ method: 'POST', url, headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers }, payload: form(fields) });
}

async function newCode(options: { challenge?: string; scopes?: string[]; organizationId?: number } = {}): Promise<string> {
  return createAuthorizationCode(t.handle.db, {
    organizationId: options.organizationId ?? org.organizationId,
    applicationId: (await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).id,
    userId: org.ownerId,
    redirectUri: REDIRECT,
    scopes: options.scopes ?? ['contacts.read', 'tasks.read'],
    codeChallenge: options.challenge ?? null,
    ttlSeconds: 60,
  });
}

const redeem = (code: string, extra: Record<string, string> = {}, headers?: Record<string, string>) =>
  post('/oauth/token', { grant_type: 'authorization_code', code, redirect_uri: REDIRECT, ...extra }, headers);
const refresh = (refresh_token: string, extra: Record<string, string> = {}, headers?: Record<string, string>) =>
  post('/oauth/token', { grant_type: 'refresh_token', refresh_token, ...extra }, headers);
const introspect = async (token: string) => (await post('/oauth/introspect', { token })).json() as Record<string, unknown>;

function expectError(res: LightMyRequestResponse, status: number, error: string): void {
  expect({ status: res.statusCode, body: res.json() }).toEqual({ status, body: { error, error_description: expect.stringMatching(SAFE_DESCRIPTION) } });
}

async function tokens(code?: string): Promise<{ access_token: string; refresh_token: string; scope: string }> {
  const res = await redeem(code ?? (await newCode()));
  expect(res.statusCode, res.body).toBe(200);
  return res.json();
}

describe(`authorization_code on ${BACKEND}`, () => {
  it('exchanges a code for tokens carrying the chosen organization', async () => {
    const res = await redeem(await newCode());
    expect(res.statusCode).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(res.json()).toEqual({
      token_type: 'Bearer',
      expires_in: 31_536_000,
      access_token: expect.any(String),
      refresh_token: expect.stringMatching(/^[A-Za-z0-9_-]{43}$/),
      scope: 'contacts.read tasks.read',
      organization_id: org.organizationId,
      organization_name: org.organizationName,
    });
    expect(await introspect(res.json().access_token)).toMatchObject({
      active: true, token_type: 'Bearer', sub: String(org.ownerId), client_id: org.publicApp.client_id, organization_id: org.organizationId,
    });
  });

  it('accepts client_secret_post too', async () => {
    const res = await redeem(await newCode(), { client_id: org.publicApp.client_id, client_secret: org.publicApp.client_secret }, {});
    expect(res.statusCode).toBe(200);
  });

  it('refuses a second redemption and revokes what the first one issued (CD-1)', async () => {
    const code = await newCode();
    const first = await tokens(code);
    expectError(await redeem(code), 400, 'invalid_grant');
    expect(await introspect(first.access_token)).toEqual({ active: false });
    expect(await introspect(first.refresh_token)).toEqual({ active: false });
    expectError(await refresh(first.refresh_token), 400, 'invalid_grant');
    const events = await t.handle.db.selectFrom('audit_events').select('details').where('action', '=', 'grant.revoked').execute();
    expect(events.map((e) => e.details.reason)).toContain('code_replay');
  });

  it('refuses an expired code (CD-2)', async () => {
    const code = await newCode();
    await t.handle.db.updateTable('authorization_codes').set({ expires_at: new Date(Date.now() - 1000) }).where('consumed_at', 'is', null).execute();
    expectError(await redeem(code), 400, 'invalid_grant');
  });

  it("refuses another client's code without burning it, and a different redirect_uri (CD-3)", async () => {
    const code = await newCode();
    expectError(await redeem(code, {}, { authorization: basic(other.publicApp.client_id, other.publicApp.client_secret) }), 400, 'invalid_grant');
    expectError(await redeem(code, { redirect_uri: `${REDIRECT}/` }), 400, 'invalid_grant');
    expectError(await post('/oauth/token', { grant_type: 'authorization_code', code }), 400, 'invalid_request');
    expect((await redeem(code)).statusCode).toBe(200);
  });

  it('verifies PKCE: S256 only, and no downgrade (PK-3, PK-4)', async () => {
    const challenge = s256(VERIFIER);
    expect((await redeem(await newCode({ challenge }), { code_verifier: VERIFIER })).statusCode).toBe(200);
    for (const verifier of [undefined, 'x'.repeat(43), VERIFIER.slice(0, 42), 'v'.repeat(129), `${VERIFIER}!`]) {
      const code = await newCode({ challenge: verifier && verifier.length >= 43 && verifier.length <= 128 ? s256(verifier) + 'x' : challenge });
      expectError(await redeem(code, verifier === undefined ? {} : { code_verifier: verifier }), 400, 'invalid_grant');
    }
    const short = 'a'.repeat(42);
    expectError(await redeem(await newCode({ challenge: s256(short) }), { code_verifier: short }), 400, 'invalid_grant');
    expectError(await redeem(await newCode(), { code_verifier: VERIFIER }), 400, 'invalid_grant');
  });

  it('refuses a code whose user has left the organization since consent', async () => {
    const { addMember, removeMember } = await import('../../src/accounts/organizations.js');
    const { createUser } = await import('../../src/accounts/users.js');
    const leaver = await createUser(t.handle.db, { email: `leaver-${Date.now()}@example.com`, password: 'leaver-password-1' });
    await addMember(t.handle.db, { organizationId: org.organizationId, userId: leaver.id, role: 'member' });
    const applicationId = (await t.handle.db.selectFrom('applications').select('id').where('client_id', '=', org.publicApp.client_id).executeTakeFirstOrThrow()).id;
    const code = await createAuthorizationCode(t.handle.db, {
      organizationId: org.organizationId, applicationId, userId: leaver.id, redirectUri: REDIRECT, scopes: ['contacts.read'], codeChallenge: null, ttlSeconds: 60,
    });
    await removeMember(t.handle.db, { organizationId: org.organizationId, userId: leaver.id });
    expectError(await redeem(code), 400, 'invalid_grant');
  });

  it('gives exactly one of 20 parallel redemptions of a code its tokens, and no 5xx (R-1)', async () => {
    const code = await newCode();
    const results = await Promise.all(Array.from({ length: 20 }, () => redeem(code)));
    const statuses = results.map((r) => r.statusCode);
    expect(statuses.filter((s) => s === 200)).toHaveLength(1);
    expect(statuses.filter((s) => s !== 200).every((s) => s === 400)).toBe(true);
    for (const r of results.filter((x) => x.statusCode === 400)) expect(r.json().error).toBe('invalid_grant');
  });
});

describe(`refresh_token on ${BACKEND}`, () => {
  it('rotates: each use returns a new refresh token and retires the old (RT-3)', async () => {
    const first = await tokens();
    const res = await refresh(first.refresh_token);
    expect(res.statusCode).toBe(200);
    const second = res.json();
    expect(second).toMatchObject({ token_type: 'Bearer', scope: 'contacts.read tasks.read', organization_id: org.organizationId, organization_name: org.organizationName });
    expect(second.refresh_token).not.toBe(first.refresh_token);
    expect(await introspect(first.refresh_token)).toEqual({ active: false });
    expect(await introspect(second.refresh_token)).toMatchObject({ active: true, token_type: 'refresh_token' });
  });

  it('refuses a just-rotated token within the grace period without revoking the grant', async () => {
    const first = await tokens();
    const second = (await refresh(first.refresh_token)).json();
    expectError(await refresh(first.refresh_token), 400, 'invalid_grant');
    expect(await introspect(second.access_token)).toMatchObject({ active: true });
    expect((await refresh(second.refresh_token)).statusCode).toBe(200);
  });

  it('revokes the whole grant when a rotated token comes back after the grace period (RT-3)', async () => {
    const first = await tokens();
    const second = (await refresh(first.refresh_token)).json();
    await t.handle.db.updateTable('refresh_tokens').set({ rotated_at: new Date(Date.now() - 60_000) }).where('rotated_at', 'is not', null).execute();
    expectError(await refresh(first.refresh_token), 400, 'invalid_grant');
    expect(await introspect(second.access_token)).toEqual({ active: false });
    expect(await introspect(second.refresh_token)).toEqual({ active: false });
    expectError(await refresh(second.refresh_token), 400, 'invalid_grant');
  });

  it("refuses another client's refresh token (RT-1)", async () => {
    const first = await tokens();
    expectError(await refresh(first.refresh_token, {}, { authorization: basic(other.publicApp.client_id, other.publicApp.client_secret) }), 400, 'invalid_grant');
    expect((await refresh(first.refresh_token)).statusCode).toBe(200);
  });

  it('may narrow the scope, never widen it; the organization stays (RT-2)', async () => {
    const first = await tokens();
    expectError(await refresh(first.refresh_token, { scope: 'contacts.read contacts.write' }), 400, 'invalid_scope');
    const narrowed = await refresh(first.refresh_token, { scope: 'tasks.read' });
    expect(narrowed.json()).toMatchObject({ scope: 'tasks.read', organization_id: org.organizationId });
    // The new refresh token keeps the original scope (RFC 6749 §6).
    expect((await refresh(narrowed.json().refresh_token)).json().scope).toBe('contacts.read tasks.read');
  });

  it('never answers 5xx when a revocation races a refresh, and no token outlives the revocation', async () => {
    for (let i = 0; i < 8; i++) {
      const issued = await tokens();
      const [refreshed, revoked] = await Promise.all([refresh(issued.refresh_token), post('/oauth/revoke', { token: issued.access_token })]);
      expect(revoked.statusCode).toBe(200);
      expect([200, 400]).toContain(refreshed.statusCode);
      if (refreshed.statusCode === 200) {
        expect(await introspect(refreshed.json().access_token)).toEqual({ active: false });
        expect(await introspect(refreshed.json().refresh_token)).toEqual({ active: false });
      }
    }
  });

  it('gives exactly one of 20 parallel refreshes a new token, and no 5xx (R-2)', async () => {
    const first = await tokens();
    const results = await Promise.all(Array.from({ length: 20 }, () => refresh(first.refresh_token)));
    expect(results.filter((r) => r.statusCode === 200)).toHaveLength(1);
    expect(results.every((r) => r.statusCode === 200 || r.json().error === 'invalid_grant')).toBe(true);
    const successors = await t.handle.db
      .selectFrom('refresh_tokens as r')
      .innerJoin('refresh_tokens as p', 'p.id', 'r.parent_id')
      .select('r.id')
      .where('p.token_hash', '=', sha256Hex(first.refresh_token))
      .execute();
    expect(successors).toHaveLength(1);
  });
});

describe(`secrets at rest on ${BACKEND} (CD-4)`, () => {
  it('keeps codes and refresh tokens only as SHA-256 digests of 256-bit random values', async () => {
    const code = await newCode();
    const issued = await tokens(code);
    expect(code).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const dump = JSON.stringify([
      await t.handle.db.selectFrom('authorization_codes').selectAll().execute(),
      await t.handle.db.selectFrom('refresh_tokens').selectAll().execute(),
    ]);
    expect(dump).toContain(sha256Hex(code));
    expect(dump).toContain(sha256Hex(issued.refresh_token));
    expect(dump).not.toContain(code);
    expect(dump).not.toContain(issued.refresh_token);
  });
});

describe('no slow hashing on the token endpoint (argon2 is for passwords only)', () => {
  it('authenticates clients and issues tokens without calling argon2', async () => {
    const hash = vi.spyOn(argon2, 'hash');
    const verify = vi.spyOn(argon2, 'verify');
    try {
      const issued = await tokens();
      expect((await refresh(issued.refresh_token)).statusCode).toBe(200);
      expectError(await post('/oauth/token', { grant_type: 'refresh_token', refresh_token: 'x' }, { authorization: basic(org.publicApp.client_id, 'wrong') }), 401, 'invalid_client');
      expect(hash).not.toHaveBeenCalled();
      expect(verify).not.toHaveBeenCalled();
      // The spies do see argon2 where it is used: for passwords.
      expect(await verifyPassword(await hashPassword('a password of some length'), 'a password of some length')).toBe(true);
      expect(hash).toHaveBeenCalledTimes(1);
      expect(verify).toHaveBeenCalledTimes(1);
    } finally {
      hash.mockRestore();
      verify.mockRestore();
    }
  });
});

describe('when the database is away (MD-1)', () => {
  it('revocation and introspection answer 503, never 200 or active', async () => {
    const handle = await connectDatabase({ kind: 'pglite', dataDir: null });
    await migrateToLatest(handle.db);
    await ensureSigningKey(handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
    const fixture = await createOrgFixture(handle.db);
    const down = await buildTestApp(handle.db);
    try {
      await handle.close();
      for (const url of ['/oauth/revoke', '/oauth/introspect', '/oauth/token']) {
        const res = await down.inject({
          method: 'POST',
          url,
          headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(fixture.publicApp.client_id, fixture.publicApp.client_secret) },
          payload: form({ token: 'anything', grant_type: 'refresh_token', refresh_token: 'x' }),
        });
        expect({ url, status: res.statusCode, body: res.json() }).toEqual({
          url, status: 503, body: { error: 'temporarily_unavailable', error_description: expect.any(String) },
        });
      }
    } finally {
      await down.close();
    }
  });
});

describe(`revocation (MD-1) and introspection (MD-2) on ${BACKEND}`, () => {
  it('revoking a refresh token kills the access tokens of its grant', async () => {
    const issued = await tokens();
    const res = await post('/oauth/revoke', { token: issued.refresh_token });
    expect(res.statusCode).toBe(200);
    expect(res.headers['cache-control']).toBe('no-store');
    expect(await introspect(issued.access_token)).toEqual({ active: false });
    expectError(await refresh(issued.refresh_token), 400, 'invalid_grant');
  });

  it('revoking an access token revokes its grant', async () => {
    const issued = await tokens();
    expect((await post('/oauth/revoke', { token: issued.access_token, token_type_hint: 'access_token' })).statusCode).toBe(200);
    expect(await introspect(issued.refresh_token)).toEqual({ active: false });
  });

  it("answers 200 for unknown tokens and leaves another client's tokens alone", async () => {
    expect((await post('/oauth/revoke', { token: 'no-such-token' })).statusCode).toBe(200);
    const issued = await tokens();
    const otherAuth = { authorization: basic(other.publicApp.client_id, other.publicApp.client_secret) };
    expect((await post('/oauth/revoke', { token: issued.access_token }, otherAuth)).statusCode).toBe(200);
    expect((await post('/oauth/revoke', { token: issued.refresh_token }, otherAuth)).statusCode).toBe(200);
    expect(await introspect(issued.access_token)).toMatchObject({ active: true });
  });

  it('requires client authentication', async () => {
    const res = await post('/oauth/revoke', { token: 'x' }, {});
    expect(res.statusCode).toBe(401);
    expect((await post('/oauth/introspect', { token: 'x' }, {})).statusCode).toBe(401);
    expectError(await post('/oauth/revoke', {}), 400, 'invalid_request');
  });

  it("introspects only the client's own live tokens; everything else is exactly {active: false}", async () => {
    const issued = await tokens();
    expect(await introspect(issued.access_token)).toEqual({
      active: true, token_type: 'Bearer', scope: 'contacts.read tasks.read', client_id: org.publicApp.client_id, sub: String(org.ownerId),
      organization_id: org.organizationId, organization_name: org.organizationName, iat: expect.any(Number), exp: expect.any(Number), iss: expect.any(String), aud: expect.any(String), jti: expect.any(String),
    });
    const otherView = await post('/oauth/introspect', { token: issued.access_token }, { authorization: basic(other.publicApp.client_id, other.publicApp.client_secret) });
    expect(otherView.json()).toEqual({ active: false });
    for (const garbage of ['garbage', 'a.b.c', 'x'.repeat(5000)]) expect(await introspect(garbage)).toEqual({ active: false });
  });
});

describe(`revocations reach other instances on ${BACKEND} (BR-5)`, () => {
  it('are published with NOTIFY when the revoking transaction commits', async () => {
    const received: string[] = [];
    const stop = await t.handle.listen(REVOCATION_CHANNEL, (payload) => received.push(payload));
    try {
      const issued = await tokens();
      const grantId = (await introspect(issued.access_token)).jti ? (await t.handle.db.selectFrom('grants').select('id').orderBy('id', 'desc').executeTakeFirstOrThrow()).id : 0;
      expect(await revokeGrant(t.handle.db, grantId, 'revoked_by_user')).toBe(true);
      await vi.waitFor(() => expect(received).toContain(String(grantId)), { timeout: 1000, interval: 10 });
      expect(await revokeGrant(t.handle.db, grantId, 'revoked_by_user')).toBe(false);
    } finally {
      await stop();
    }
  });

  it("are in another instance's revocation list within a second", async () => {
    const elsewhere = new RevocationList(t.handle.db, { accessTokenTtl: 3600, listen: t.handle.listen });
    await elsewhere.start();
    try {
      await tokens();
      const grant = await t.handle.db.selectFrom('grants').select('id').orderBy('id', 'desc').executeTakeFirstOrThrow();
      expect(elsewhere.isRevoked(grant.id)).toBe(false);
      expect((await post('/oauth/revoke', { token: (await tokens()).refresh_token })).statusCode).toBe(200);
      const revoked = await t.handle.db.selectFrom('grants').select('id').where('revoked_at', 'is not', null).orderBy('id', 'desc').executeTakeFirstOrThrow();
      await vi.waitFor(() => expect(elsewhere.isRevoked(revoked.id)).toBe(true), { timeout: 1000, interval: 10 });
    } finally {
      await elsewhere.stop();
    }
  });

  it('are loaded by an instance starting within the 60 s of leeway after the token expired', async () => {
    await tokens();
    const grant = await t.handle.db.selectFrom('grants').select(['id', 'organization_id']).orderBy('id', 'desc').executeTakeFirstOrThrow();
    await t.handle.db
      .insertInto('revoked_access_tokens')
      .values({ jti: 'expired-30-s-ago', organization_id: grant.organization_id, grant_id: grant.id, expires_at: sql<Date>`now() - interval '30 seconds'` })
      .execute();
    const starting = new RevocationList(t.handle.db, { accessTokenTtl: 3600 });
    await starting.start();
    try {
      expect(starting.isTokenRevoked({ jti: 'expired-30-s-ago', grant_id: grant.id, organization_id: grant.organization_id, sub: 'app', client_id: 'app', iat: 0 })).toBe(true);
    } finally {
      await starting.stop();
    }
  });
});
