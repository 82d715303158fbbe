/**
 * What a pushed authorization request (RFC 9126) may leave behind (DO-1, HA-2): anyone who knows
 * a public client_id can push, so the endpoint keeps only what the authorization endpoint reads,
 * refuses large bodies and values, limits pushes per client and per address, caps each client's
 * usable pushed requests, and the retention sweep deletes each once it can no longer be used.
 * Driven through app.inject as a client would, the rows read back from the database, on both
 * databases (TEST_DATABASE_URL or PGlite).
 */
import type { FastifyInstance } from 'fastify';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { sha256Hex } from '../../src/lib/crypto.js';
import { MAX_VALUE_LENGTH, PAR_BODY_LIMIT, PUSHES_PER_MINUTE } from '../../src/oauth/endpoints/par.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { consumePushedRequest, MAX_PENDING_PER_CLIENT } from '../../src/oauth/models/pushed-requests.js';
import { deleteExpired } from '../../src/retention.js';
import { buildTestApp } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { createOrgFixture, form, type OrgFixture, SAFE_DESCRIPTION } from '../helpers/oauth.js';

const REDIRECT = 'https://client.example.com/cb';
/** A valid authorization request of a public client with PKCE (RFC 7636 S256). */
const REQUEST = {
  redirect_uri: REDIRECT,
  response_type: 'code',
  scope: 'contacts.read',
  state: 'state-of-the-request-0001',
  code_challenge: 'E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM',
  code_challenge_method: 'S256',
};

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let app: FastifyInstance;
let fixture: OrgFixture;
const db = () => t.handle.db;

let clients = 0;
/** A public application of the fixture's organization that authenticates by its client_id alone (token_endpoint_auth_method none). */
async function publicClient(): Promise<{ clientId: string; id: number }> {
  const created = await createApplication(db(), { organizationId: fixture.organizationId, type: 'public', name: `Pusher ${++clients}`, redirectUris: [REDIRECT] });
  const row = await db()
    .updateTable('applications')
    .set({ token_endpoint_auth_method: 'none', client_secret_hash: null })
    .where('client_id', '=', created.client_id)
    .returning('id')
    .executeTakeFirstOrThrow();
  return { clientId: created.client_id, id: row.id };
}

function push(clientId: string, fields: Record<string, string>, ip = '192.0.2.10') {
  return app.inject({
    method: 'POST',
    url: '/oauth/par',
    remoteAddress: ip,
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    payload: form({ client_id: clientId, ...fields }),
  });
}

const rowsOf = (applicationId: number) =>
  db().selectFrom('pushed_authorization_requests').select(['params', 'expires_at', 'first_used_at', 'created_at']).where('application_id', '=', applicationId).execute();

const rowOf = (requestUri: string) =>
  db().selectFrom('pushed_authorization_requests').selectAll().where('request_uri_hash', '=', sha256Hex(requestUri)).executeTakeFirst();

beforeAll(async () => {
  t = await createTestDatabase();
  app = await buildTestApp(db());
  fixture = await createOrgFixture(db());
}, 60_000);

afterAll(async () => {
  await app?.close();
  await t?.close();
});

describe(`what /oauth/par keeps, on ${BACKEND}`, () => {
  it('keeps only the authorization parameters the authorization endpoint reads, dropping unknown ones', async () => {
    const { clientId, id } = await publicClient();
    const res = await push(clientId, {
      ...REQUEST,
      login_hint: 'ada@example.com',
      prompt: 'login',
      // Unknown to the authorization endpoint (RFC 6749 §3.1: ignored there), and what a form or the sign-in adds.
      tracking: 'x'.repeat(5000),
      ui_theme: 'dark',
      csrf_token: 'not-from-a-push',
      signed_in_after: '1.abc',
      organization_id: '7',
    });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toEqual({ request_uri: expect.stringMatching(/^urn:ietf:params:oauth:request_uri:/), expires_in: 60 });
    expect((await rowsOf(id)).map((r) => r.params)).toEqual([{ ...REQUEST, login_hint: 'ada@example.com', prompt: 'login', client_id: clientId }]);
  });

  it(`refuses a body over ${PAR_BODY_LIMIT} bytes (413) and a kept value over ${MAX_VALUE_LENGTH} characters (400), keeping nothing`, async () => {
    const { clientId, id } = await publicClient();
    const large = await push(clientId, { ...REQUEST, padding: 'x'.repeat(PAR_BODY_LIMIT) });
    expect(large.statusCode).toBe(413);
    expect(large.json()).toEqual({ error: 'request_too_large', error_description: expect.stringMatching(SAFE_DESCRIPTION) });

    const longState = await push(clientId, { ...REQUEST, state: 's'.repeat(MAX_VALUE_LENGTH + 1) });
    expect(longState.statusCode).toBe(400);
    expect(longState.json()).toEqual({ error: 'invalid_request', error_description: `state must be at most ${MAX_VALUE_LENGTH} characters` });
    const longHint = await push(clientId, { ...REQUEST, login_hint: 'h'.repeat(MAX_VALUE_LENGTH + 1) });
    expect(longHint.statusCode).toBe(400);
    expect(longHint.json()).toEqual({ error: 'invalid_request', error_description: `login_hint must be at most ${MAX_VALUE_LENGTH} characters` });
    expect(await rowsOf(id)).toEqual([]);

    // At the limit, accepted.
    const atLimit = await push(clientId, { ...REQUEST, state: 's'.repeat(MAX_VALUE_LENGTH) });
    expect(atLimit.statusCode, atLimit.body).toBe(201);
    expect(await rowsOf(id)).toHaveLength(1);
  });
});

describe(`limits of /oauth/par, on ${BACKEND}`, () => {
  it(`refuses a client's push past ${MAX_PENDING_PER_CLIENT} usable pushed requests (429); expired and used-up ones do not count`, async () => {
    const { clientId, id } = await publicClient();
    const other = await publicClient();
    // Expired and used-up ones first: they are not waiting for anyone.
    await sql`
      insert into pushed_authorization_requests (request_uri_hash, application_id, params, expires_at, consumed_at)
      select 'cap-dead-' || i, ${id}, '{}', now() + interval '60 seconds', case when i % 2 = 0 then now() end
      from generate_series(1, 10) i`.execute(db());
    await db().updateTable('pushed_authorization_requests').set({ expires_at: sql`now() - interval '1 second'` }).where('request_uri_hash', 'like', 'cap-dead-%').where('consumed_at', 'is', null).execute();
    // One short of the cap: usable ones, unused or in a sign-in.
    await sql`
      insert into pushed_authorization_requests (request_uri_hash, application_id, params, expires_at, first_used_at)
      select 'cap-live-' || i, ${id}, '{}', now() + interval '60 seconds', case when i % 2 = 0 then now() end
      from generate_series(1, ${MAX_PENDING_PER_CLIENT - 1}) i`.execute(db());

    const last = await push(clientId, REQUEST);
    expect(last.statusCode, last.body).toBe(201);
    const refused = await push(clientId, REQUEST);
    expect(refused.statusCode).toBe(429);
    expect(refused.json()).toEqual({ error: 'too_many_requests', error_description: 'too many pushed authorization requests of this client are waiting for their users; retry later' });
    expect(refused.headers['retry-after']).toBe('60');
    expect(await db().selectFrom('pushed_authorization_requests').select('id').where('application_id', '=', id).execute()).toHaveLength(MAX_PENDING_PER_CLIENT + 10);

    // Another client is not held up.
    expect((await push(other.clientId, REQUEST)).statusCode).toBe(201);
    // One used up (its code issued) makes room.
    const { id: usedUp } = await db().selectFrom('pushed_authorization_requests').select('id').where('request_uri_hash', '=', 'cap-live-1').executeTakeFirstOrThrow();
    expect(await consumePushedRequest(db(), usedUp)).toBe(true);
    expect((await push(clientId, REQUEST)).statusCode).toBe(201);
  });

  it(`answers 429 with Retry-After past ${PUSHES_PER_MINUTE} pushes a minute from one client, whatever its address`, async () => {
    const { clientId } = await publicClient();
    const bystander = await publicClient();
    // Counted whether or not the push is kept: these lack redirect_uri, and each comes from another address.
    for (let i = 0; i < PUSHES_PER_MINUTE; i++) {
      const res = await push(clientId, { ...REQUEST, redirect_uri: '' }, `10.1.${i >> 8}.${i & 255}`);
      expect(res.statusCode).toBe(400);
    }
    const refused = await push(clientId, REQUEST, '10.1.99.1');
    expect(refused.statusCode).toBe(429);
    expect(refused.json()).toEqual({ error: 'too_many_requests', error_description: `at most ${PUSHES_PER_MINUTE} pushed authorization requests a minute from one client; retry later` });
    const wait = Number(refused.headers['retry-after']);
    expect(wait).toBeGreaterThan(0);
    expect(wait).toBeLessThanOrEqual(60);
    // Another client from the same address is not.
    expect((await push(bystander.clientId, REQUEST, '10.1.99.1')).statusCode).toBe(201);
  });

  it(`answers 429 with Retry-After past ${PUSHES_PER_MINUTE} pushes a minute from one address, whatever the client`, async () => {
    const first = await publicClient();
    const second = await publicClient();
    const third = await publicClient();
    const address = '10.2.0.1';
    for (let i = 0; i < PUSHES_PER_MINUTE; i++) {
      const res = await push((i % 2 === 0 ? first : second).clientId, { ...REQUEST, redirect_uri: '' }, address);
      expect(res.statusCode).toBe(400);
    }
    const refused = await push(third.clientId, REQUEST, address);
    expect(refused.statusCode).toBe(429);
    expect(refused.json()).toEqual({ error: 'too_many_requests', error_description: `at most ${PUSHES_PER_MINUTE} pushed authorization requests a minute from one address; retry later` });
    expect(Number(refused.headers['retry-after'])).toBeGreaterThan(0);
    // An IPv6 address counts with its /64: another address in it is refused too, one elsewhere is not.
    for (let i = 0; i < PUSHES_PER_MINUTE; i++) await push(first.clientId, { ...REQUEST, redirect_uri: '' }, `2001:db8:5:6::${(i + 1).toString(16)}`);
    expect((await push(third.clientId, REQUEST, '2001:db8:5:6::ffff')).statusCode).toBe(429);
    expect((await push(third.clientId, REQUEST, '10.2.0.2')).statusCode).toBe(201);
  });
});

describe(`retention of pushed requests, on ${BACKEND}`, () => {
  it('deletes an unused one once its 60 seconds are over and a used-up one at once, keeping one whose sign-in is under way', async () => {
    const { clientId } = await publicClient();
    const pushUri = async () => {
      const res = await push(clientId, REQUEST, '10.3.0.1');
      expect(res.statusCode, res.body).toBe(201);
      return res.json<{ request_uri: string }>().request_uri;
    };
    const [expired, started, usedUp, waiting] = [await pushUri(), await pushUri(), await pushUri(), await pushUri()];
    // A minute on for one (its expiry moved back, as the clock would).
    await db().updateTable('pushed_authorization_requests').set({ expires_at: sql`now() - interval '1 second'` }).where('request_uri_hash', '=', sha256Hex(expired)).execute();
    // The browser brings one to the authorization endpoint: it is sent to sign in, which may take 15 minutes.
    const authorize = await app.inject({ method: 'GET', url: `/oauth/authorize?${new URLSearchParams({ client_id: clientId, request_uri: started })}` });
    expect(authorize.statusCode, authorize.body).toBe(303);
    expect(authorize.headers.location).toMatch(/^\/login\?/);
    const inSignIn = (await rowOf(started))!;
    expect((inSignIn.expires_at.getTime() - inSignIn.first_used_at!.getTime()) / 1000).toBe(15 * 60);
    // One whose code was issued.
    expect(await consumePushedRequest(db(), (await rowOf(usedUp))!.id)).toBe(true);

    await deleteExpired(db());
    expect(await rowOf(expired)).toBeUndefined();
    expect(await rowOf(usedUp)).toBeUndefined();
    expect(await rowOf(started)).toBeDefined();
    expect(await rowOf(waiting)).toBeDefined();
    // The one in its sign-in is still usable by its browser.
    const again = await app.inject({ method: 'GET', url: `/oauth/authorize?${new URLSearchParams({ client_id: clientId, request_uri: started })}` });
    expect(again.statusCode).toBe(303);
    expect(again.headers.location).toMatch(/^\/login\?/);
  });
});
