/**
 * R-6 and issue 7 "Several instances": two real server processes (the built dist/bundle/server.js)
 * on ONE PostgreSQL database, as behind a load balancer. Whatever is done through one of them (or
 * through the `orgauth` CLI, a third process writing the same database) must be honoured by the
 * other within one second: tokens it issued, revocations, client secret rotations, disabled
 * applications and signing key rotations. With REDIS_URL the API rate limit is one shared count.
 *
 * Every "within one second" is a poll: the probe is repeated until it sees the expected answer,
 * and fails if no probe started within DEADLINE_MS of the change having returned (the HTTP
 * response or the CLI's exit, both after the commit) saw it. Caches are warmed on the other
 * instance first, so an in-memory cache that is not invalidated across instances fails here.
 *
 * PostgreSQL only: two processes cannot share an embedded PGlite database.
 */
import { existsSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createOrganization } from '../src/accounts/organizations.js';
import { createUser } from '../src/accounts/users.js';
import { connectDatabase, type DatabaseHandle } from '../src/db/connect.js';
import { type ApplicationWithSecret, createApplication } from '../src/oauth/models/applications.js';
import { createEmptyDatabase, TEST_DATABASE_URL, type TestDatabase } from './helpers/db.js';
import { basic } from './helpers/oauth.js';
import { csrfIn, deadlinePoll, describeObserved, formPost, hiddenIn, type Observed, observe, UserAgent } from './helpers/instances.js';
import { CLI, freePort, ROOT, run, type Running, SERVER, start } from './helpers/process.js';
import { REDIS_URL, redisAnswers } from './helpers/redis.js';
import { finishJobs } from './helpers/jobs.js';

/** How soon the other instance must honour a change (SECURITY.md BR-5, R-6; issue 7). */
const DEADLINE_MS = 1000;
/** API_RATE_LIMIT of both instances: high enough for the polls below, low enough to reach in test 6. */
const RATE_LIMIT = 60;
/** The public base URL both instances share, as behind one load balancer. */
const ISSUER = 'http://auth.orgauth.test';
const REDIRECT_URI = 'http://localhost:8080/callback';
const PASSWORD = 'instances-password-1';

const REDIS = TEST_DATABASE_URL ? await redisAnswers() : false;

if (!TEST_DATABASE_URL) {
  console.log('instances.test.ts: skipped: two server processes need one PostgreSQL database (set TEST_DATABASE_URL); an embedded PGlite database opens in one process only');
}

interface Instance {
  name: 'A' | 'B';
  url: string;
  process: Running;
}

const { honouredWithin, timings } = deadlinePoll(DEADLINE_MS);

const jwtHeader = (token: string): { kid?: string; alg?: string; typ?: string } =>
  JSON.parse(Buffer.from(token.split('.')[0] ?? '', 'base64url').toString('utf8'));

describe.skipIf(!TEST_DATABASE_URL)('two server processes on one PostgreSQL database (R-6)', () => {
  let database: TestDatabase;
  let handle: DatabaseHandle;
  let A: Instance;
  let B: Instance;
  let organizationId: number;
  const owner = { email: `owner-${process.pid}@example.com` };
  const apps: ApplicationWithSecret[] = [];
  /** The owner's browser, signed in (on B) once; its session is honoured by both instances. */
  const browser = new UserAgent();

  async function privateApp(name: string): Promise<ApplicationWithSecret> {
    const app = await createApplication(handle.db, { organizationId, type: 'private', name });
    apps.push(app);
    return app;
  }

  const clientCredentials = async (instance: Instance, app: { client_id: string }, secret: string): Promise<Observed> =>
    observe(
      await formPost(`${instance.url}/oauth/token`, { grant_type: 'client_credentials', organization_id: String(organizationId) }, {
        authorization: basic(app.client_id, secret),
      }),
    );

  async function accessToken(instance: Instance, app: ApplicationWithSecret): Promise<string> {
    const res = await clientCredentials(instance, app, app.client_secret);
    if (res.status !== 200) throw new Error(`client_credentials on ${instance.name}: ${describeObserved(res)}`);
    return res.body.access_token as string;
  }

  const apiGet = async (instance: Instance, token: string): Promise<Observed> =>
    observe(await fetch(`${instance.url}/api/v1/${organizationId}/contacts`, { headers: { authorization: `Bearer ${token}`, accept: 'application/json' } }));

  const introspect = async (instance: Instance, clientId: string, secret: string, token: string): Promise<Observed> =>
    observe(await formPost(`${instance.url}/oauth/introspect`, { token }, { authorization: basic(clientId, secret) }));

  const revoke = async (instance: Instance, clientId: string, secret: string, token: string): Promise<Observed> =>
    observe(await formPost(`${instance.url}/oauth/revoke`, { token }, { authorization: basic(clientId, secret) }));

  const refresh = async (instance: Instance, clientId: string, secret: string, refreshToken: string): Promise<Observed> =>
    observe(await formPost(`${instance.url}/oauth/token`, { grant_type: 'refresh_token', refresh_token: refreshToken }, { authorization: basic(clientId, secret) }));

  /** A dashboard action of the signed-in owner, posted to `instance` with the session's CSRF token. */
  async function dashboardAction(instance: Instance, clientId: string, action: 'secret' | 'disable'): Promise<Response> {
    const page = await browser.fetch(instance, `/dashboard/applications/${clientId}`);
    expect(page.status).toBe(200);
    // Confirmed, as the confirmation page's form posts it.
    return browser.postForm(instance, `/dashboard/applications/${clientId}/${action}`, { csrf_token: csrfIn(await page.text()), confirm: action === 'secret' ? 'rotate' : 'disable' });
  }

  /**
   * The authorization code flow with its steps spread over both instances: /oauth/authorize on
   * `authorizeOn`, the consent form posted to the other; returns the code.
   */
  async function authorizationCode(app: ApplicationWithSecret, authorizeOn: Instance, consentOn: Instance): Promise<string> {
    const state = `state-${Math.random().toString(36).slice(2)}-0123456789`;
    const query = new URLSearchParams({ client_id: app.client_id, redirect_uri: REDIRECT_URI, response_type: 'code', scope: 'contacts.read tasks.read', state });
    const consentPage = await browser.fetch(authorizeOn, `/oauth/authorize?${query}`);
    const html = await consentPage.text();
    expect(consentPage.status, html.slice(0, 300)).toBe(200);
    const back = await browser.postForm(consentOn, '/oauth/authorize', { ...hiddenIn(html), csrf_token: csrfIn(html), organization_id: String(organizationId), decision: 'approve' });
    expect(back.status).toBe(303);
    const location = new URL(back.headers.get('location') ?? '');
    expect(location.searchParams.get('state')).toBe(state);
    expect(location.searchParams.get('iss')).toBe(ISSUER);
    return location.searchParams.get('code') ?? '';
  }

  async function exchangeCode(instance: Instance, app: ApplicationWithSecret, code: string): Promise<{ access_token: string; refresh_token: string }> {
    const res = await observe(
      await formPost(`${instance.url}/oauth/token`, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT_URI }, {
        authorization: basic(app.client_id, app.client_secret),
      }),
    );
    expect(res.status, describeObserved(res)).toBe(200);
    return res.body;
  }

  async function startInstance(name: 'A' | 'B', port: number): Promise<Instance> {
    const env: Record<string, string> = {
      ...database.env,
      PORT: String(port),
      ISSUER,
      // info: the line that says it is ready.
      LOG_LEVEL: 'info',
      API_RATE_LIMIT: String(RATE_LIMIT),
      ...(REDIS ? { REDIS_URL } : {}),
    };
    return { name, url: `http://127.0.0.1:${port}`, process: start(SERVER, [], env) };
  }

  /** Waits for the line that says the instance is ready (it fails at once if the process exits first); then its /readyz answers 200. */
  async function waitReady(instance: Instance): Promise<void> {
    await instance.process.waitForOutput(/"msg":"orgauth is ready"/, 60_000);
    const status = await fetch(`${instance.url}/readyz`).then((r) => r.status);
    expect(status, `instance ${instance.name}'s /readyz`).toBe(200);
  }

  beforeAll(async () => {
    if (!existsSync(path.join(ROOT, SERVER))) throw new Error(`${SERVER} is missing: run \`npm run build\` (npm test builds first)`);
    const started = performance.now();
    database = await createEmptyDatabase();
    // Both start at once on the EMPTY database: both migrate (Kysely's migration lock makes one
    // wait for the other) and both try to create the first signing key.
    const [portA, portB] = [await freePort(), await freePort()];
    A = await startInstance('A', portA);
    B = await startInstance('B', portB);
    await Promise.all([waitReady(A), waitReady(B)]);
    timings['both instances ready (cold start, concurrent migrations)'] = Math.round(performance.now() - started);

    handle = await connectDatabase(database.target);
    const user = await createUser(handle.db, { email: owner.email, password: PASSWORD, name: 'Owner' });
    const org = await createOrganization(handle.db, { name: 'Shared Org', ownerUserId: user.id });
    organizationId = org.id;

    // Signed in through B once; the session lives in the database, so A's dashboard knows it too.
    const login = await browser.fetch(B, '/login');
    const signedIn = await browser.postForm(B, '/login', { email: owner.email, password: PASSWORD, csrf_token: csrfIn(await login.text()) });
    expect(signedIn.status).toBe(303);
  });

  afterAll(async () => {
    const exits = await Promise.all(
      [A, B].filter((i): i is Instance => i !== undefined).map(async (instance) => {
        instance.process.child.kill('SIGTERM');
        return { name: instance.name, exit: await instance.process.exited, stderr: instance.process.output.stderr };
      }),
    );
    if (REDIS && apps.length > 0) {
      // Only this file's keys (the Redis is shared): the API rate limiter's key per application
      // made here, `orgauth-api-rl:<client_id>:<organization_id>` (src/api/rate-limit.ts).
      const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
      try {
        await redis.connect();
        await redis.del(...apps.map((app) => `orgauth-api-rl:${app.client_id}:${organizationId}`));
      } finally {
        redis.disconnect();
      }
    }
    await handle?.close();
    await database?.drop();
    console.log(
      `instances.test.ts timings (ms; deadline ${DEADLINE_MS}):\n${Object.entries(timings)
        .map(([what, ms]) => `  ${String(ms).padStart(5)}  ${what}`)
        .join('\n')}`,
    );
    for (const { name, exit, stderr } of exits) {
      // R-4: SIGTERM closes the server cleanly.
      expect(exit, `instance ${name} on SIGTERM; stderr:\n${stderr}`).toEqual({ code: 0, signal: null });
    }
  });

  it('started both instances at once on an empty database: one schema, one active signing key', async () => {
    // Every migration applied, although both instances ran the migrator at the same moment.
    const { rows } = await sql<{ name: string }>`select name from kysely_migration order by name`.execute(handle.db);
    // The compiled migrations, which are what the server runs.
    const files = readdirSync(path.join(ROOT, 'dist/migrations')).filter((f) => f.endsWith('.js')).map((f) => f.replace(/\.js$/, '')).sort();
    expect(rows.map((r) => r.name)).toEqual(files);
    // One active key per algorithm in use (access tokens' ES256, ID tokens' RS256), though both instances created them at once.
    const active = await handle.db.selectFrom('signing_keys').select('alg').where('retired_at', 'is', null).orderBy('alg').execute();
    expect(active).toEqual([{ alg: 'ES256' }, { alg: 'RS256' }]);
    const [jwksA, jwksB] = await Promise.all([A, B].map(async (i) => (await fetch(`${i.url}/.well-known/jwks.json`)).json()));
    expect(jwksA).toEqual(jwksB);
    for (const instance of [A, B]) {
      const metadata = (await (await fetch(`${instance.url}/.well-known/oauth-authorization-server`)).json()) as { issuer: string };
      expect(metadata.issuer).toBe(ISSUER);
    }
  });

  it('1. a client_credentials token issued by A is accepted by B’s API and B’s introspection', async () => {
    const app = await privateApp('Issued on A');
    const token = await accessToken(A, app);
    const since = performance.now();
    await honouredWithin('1. A’s client_credentials token accepted by B’s API', since, () => apiGet(B, token), (o) => o.status === 200);
    await honouredWithin(
      '1. A’s client_credentials token active in B’s introspection',
      since,
      () => introspect(B, app.client_id, app.client_secret, token),
      (o) => o.status === 200 && o.body.active === true,
    );
    const introspected = await introspect(B, app.client_id, app.client_secret, token);
    expect(introspected.body).toMatchObject({ active: true, client_id: app.client_id, organization_id: organizationId, iss: ISSUER });
    // And the other way round.
    expect((await apiGet(A, await accessToken(B, app))).status).toBe(200);
  });

  it('1. an authorization code flow spread over both instances: its tokens work on either; a refresh on B', async () => {
    const app = await createApplication(handle.db, { organizationId, type: 'public', name: 'Web app', redirectUris: [REDIRECT_URI] });
    apps.push(app);
    // /oauth/authorize on A, consent posted to B (the browser's session is B's login), code redeemed on A.
    const code = await authorizationCode(app, A, B);
    const tokens = await exchangeCode(A, app, code);
    const since = performance.now();
    await honouredWithin('1. A’s authorization_code token accepted by B’s API', since, () => apiGet(B, tokens.access_token), (o) => o.status === 200);
    await honouredWithin(
      '1. A’s authorization_code token active in B’s introspection',
      since,
      () => introspect(B, app.client_id, app.client_secret, tokens.access_token),
      (o) => o.status === 200 && o.body.active === true,
    );
    // The refresh token A issued is redeemed on B (rotation), and B's tokens work on A.
    const refreshed = await refresh(B, app.client_id, app.client_secret, tokens.refresh_token);
    expect(refreshed.status, describeObserved(refreshed)).toBe(200);
    expect(refreshed.body.refresh_token).not.toBe(tokens.refresh_token);
    expect(refreshed.body.organization_id).toBe(organizationId);
    expect((await apiGet(A, refreshed.body.access_token)).status).toBe(200);
    // A code is single use across instances too: B refuses the code A redeemed.
    const replay = await observe(
      await formPost(`${B.url}/oauth/token`, { grant_type: 'authorization_code', code, redirect_uri: REDIRECT_URI }, { authorization: basic(app.client_id, app.client_secret) }),
    );
    expect(replay.status).toBe(400);
    expect(replay.body.error).toBe('invalid_grant');
  });

  it('2. a token revoked through A’s /oauth/revoke is refused by B’s API (401) and inactive in B’s introspection', async () => {
    const app = await privateApp('Revoked on A');
    const token = await accessToken(A, app);
    // Warm B: the token verified and cached there, active in its introspection.
    for (let i = 0; i < 3; i++) expect((await apiGet(B, token)).status).toBe(200);
    expect((await introspect(B, app.client_id, app.client_secret, token)).body.active).toBe(true);

    const revoked = await revoke(A, app.client_id, app.client_secret, token);
    expect(revoked.status).toBe(200);
    const since = performance.now();
    await honouredWithin('2. token revoked on A refused by B’s API', since, () => apiGet(B, token), (o) => o.status === 401);
    await honouredWithin(
      '2. token revoked on A inactive in B’s introspection',
      since,
      () => introspect(B, app.client_id, app.client_secret, token),
      (o) => o.status === 200 && o.body.active === false,
    );
    const refused = await apiGet(B, token);
    expect(refused.body).toMatchObject({ error: 'invalid_token' });
    expect(refused.headers.get('www-authenticate')).toMatch(/^Bearer realm="orgauth", resource_metadata="[^"]+\/\.well-known\/oauth-protected-resource\/api\/v1", error="invalid_token"$/);
    expect((await introspect(B, app.client_id, app.client_secret, token)).body).toEqual({ active: false });
  });

  it('2. a refresh token revoked on A cannot be used on B, and its grant’s access token dies on B', async () => {
    const app = await createApplication(handle.db, { organizationId, type: 'public', name: 'Revoked refresh', redirectUris: [REDIRECT_URI] });
    apps.push(app);
    const tokens = await exchangeCode(B, app, await authorizationCode(app, B, A));
    // Warm B with the grant's access token.
    expect((await apiGet(B, tokens.access_token)).status).toBe(200);

    expect((await revoke(A, app.client_id, app.client_secret, tokens.refresh_token)).status).toBe(200);
    const since = performance.now();
    // Refresh tokens are looked up in the database on every use: refused at the first attempt
    // (a success here would already have minted new tokens, so this is not polled).
    const attempt = await refresh(B, app.client_id, app.client_secret, tokens.refresh_token);
    expect(attempt.status, describeObserved(attempt)).toBe(400);
    expect(attempt.body.error).toBe('invalid_grant');
    timings['2. refresh token revoked on A refused by B (first attempt)'] = Math.round(performance.now() - since);
    expect((await introspect(B, app.client_id, app.client_secret, tokens.refresh_token)).body).toEqual({ active: false });
    await honouredWithin('2. access token of the grant whose refresh token A revoked refused by B’s API', since, () => apiGet(B, tokens.access_token), (o) => o.status === 401);
  });

  /** Warms `instance`'s caches: several successful authentications with `secret`. */
  async function warm(instance: Instance, app: ApplicationWithSecret, secret: string, times = 5): Promise<void> {
    for (let i = 0; i < times; i++) {
      const res = await clientCredentials(instance, app, secret);
      expect(res.status, `warming ${instance.name}: ${describeObserved(res)}`).toBe(200);
    }
  }

  /**
   * After a rotation: `instance` refuses the old secret with 401 invalid_client and accepts the
   * new one. Polled at 150 ms so a stale instance stays below the client-auth throttle (10
   * failures a minute) and keeps answering 401/200 rather than 429.
   */
  async function expectRotationHonoured(label: string, instance: Instance, app: ApplicationWithSecret, oldSecret: string, newSecret: string, since: number) {
    await honouredWithin(
      `${label}: ${instance.name} refuses the old secret (401 invalid_client)`,
      since,
      () => clientCredentials(instance, app, oldSecret),
      (o) => o.status === 401 && o.body.error === 'invalid_client',
      150,
    );
    await honouredWithin(`${label}: ${instance.name} accepts the new secret`, since, () => clientCredentials(instance, app, newSecret), (o) => o.status === 200, 150);
    const old = await clientCredentials(instance, app, oldSecret);
    expect(old.status).toBe(401);
    expect(old.headers.get('www-authenticate')).toMatch(/^Basic/);
  }

  it('3. a secret rotated through A’s dashboard: B (warmed with the old secret) refuses it and accepts the new one', async () => {
    const app = await privateApp('Rotated in the dashboard');
    await warm(B, app, app.client_secret);
    await warm(A, app, app.client_secret, 2);

    const res = await dashboardAction(A, app.client_id, 'secret');
    const page = await res.text();
    expect(res.status, page.slice(0, 300)).toBe(200);
    const since = performance.now();
    const newSecret = /name="client_secret" value="([^"]+)"/.exec(page)?.[1] ?? '';
    expect(newSecret).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(newSecret).not.toBe(app.client_secret);

    await expectRotationHonoured('3. dashboard rotation on A', B, app, app.client_secret, newSecret, since);
    await expectRotationHonoured('3. dashboard rotation on A', A, app, app.client_secret, newSecret, since);
  });

  it('3. a secret rotated by the CLI (`orgauth app rotate-secret`): both instances, warmed, switch within a second', async () => {
    const app = await privateApp('Rotated by the CLI');
    await warm(A, app, app.client_secret);
    await warm(B, app, app.client_secret);

    const cli = await run(CLI, ['app', 'rotate-secret', '--client-id', app.client_id, '--json'], database.env);
    const since = performance.now();
    expect(cli.code, cli.stderr).toBe(0);
    const rotated = JSON.parse(cli.stdout) as { client_id: string; client_secret: string };
    expect(rotated.client_id).toBe(app.client_id);

    await expectRotationHonoured('3. CLI rotation', B, app, app.client_secret, rotated.client_secret, since);
    await expectRotationHonoured('3. CLI rotation', A, app, app.client_secret, rotated.client_secret, since);
  });

  it('4. an application disabled through A’s dashboard: B refuses its client_credentials and its outstanding tokens', async () => {
    const app = await privateApp('Disabled in the dashboard');
    // Warm B: successful authentications, and tokens from both instances verified on B.
    await warm(B, app, app.client_secret);
    const fromA = await accessToken(A, app);
    const fromB = await accessToken(B, app);
    for (const token of [fromA, fromB]) expect((await apiGet(B, token)).status).toBe(200);
    const grants = await handle.db.selectFrom('applications').innerJoin('grants', 'grants.application_id', 'applications.id').select('grants.id').where('client_id', '=', app.client_id).execute();
    expect(grants.length).toBeGreaterThanOrEqual(1);

    const res = await dashboardAction(A, app.client_id, 'disable');
    expect(res.status).toBe(303);
    const since = performance.now();

    await honouredWithin(
      '4. disabled on A: B refuses client_credentials (401 invalid_client)',
      since,
      () => clientCredentials(B, app, app.client_secret),
      (o) => o.status === 401 && o.body.error === 'invalid_client',
      150,
    );
    // Disabling revokes every grant of the application (reason application_disabled), so its
    // access tokens die on every instance like any revoked token.
    await honouredWithin('4. disabled on A: B’s API refuses the token A issued', since, () => apiGet(B, fromA), (o) => o.status === 401);
    await honouredWithin('4. disabled on A: B’s API refuses the token B issued', since, () => apiGet(B, fromB), (o) => o.status === 401);
    // The grants' revocations are a job the change queued; either instance runs it.
    await finishJobs(handle.db);
    const rows = await handle.db
      .selectFrom('applications')
      .innerJoin('grants', 'grants.application_id', 'applications.id')
      .select(['applications.disabled', 'grants.revoked_at', 'grants.revoked_reason'])
      .where('client_id', '=', app.client_id)
      .execute();
    // No grant appeared after the disable, and every one is revoked for that reason.
    expect(rows.length).toBe(grants.length);
    for (const row of rows) expect(row).toMatchObject({ disabled: true, revoked_at: expect.any(Date), revoked_reason: 'application_disabled' });
  });

  it('4. the CLI (`orgauth grant revoke`, `app disable`, `app delete`) is honoured by both instances within a second', async () => {
    const revokedApp = await privateApp('Grant revoked by the CLI');
    const revokedToken = await accessToken(A, revokedApp);
    const disabledApp = await privateApp('Disabled by the CLI');
    const disabledTokens = [await accessToken(A, disabledApp), await accessToken(B, disabledApp)];
    const deletedApp = await privateApp('Deleted by the CLI');
    const deletedToken = await accessToken(B, deletedApp);
    for (const token of [revokedToken, ...disabledTokens, deletedToken]) for (const instance of [A, B]) expect((await apiGet(instance, token)).status).toBe(200);

    const grant = JSON.parse(Buffer.from(revokedToken.split('.')[1]!, 'base64url').toString()) as { grant_id: number };
    const revoked = await run(CLI, ['grant', 'revoke', '--id', String(grant.grant_id), '--json'], database.env);
    expect(revoked.code, revoked.stderr).toBe(0);
    let since = performance.now();
    for (const instance of [A, B]) await honouredWithin(`4. CLI grant revoke: ${instance.name}’s API refuses the token`, since, () => apiGet(instance, revokedToken), (o) => o.status === 401);

    const disabled = await run(CLI, ['app', 'disable', '--client-id', disabledApp.client_id, '--json'], database.env);
    expect(disabled.code, disabled.stderr).toBe(0);
    since = performance.now();
    for (const instance of [A, B]) {
      await honouredWithin(`4. CLI app disable: ${instance.name} refuses client_credentials`, since, () => clientCredentials(instance, disabledApp, disabledApp.client_secret), (o) => o.status === 401, 150);
      for (const token of disabledTokens) await honouredWithin(`4. CLI app disable: ${instance.name}’s API refuses its tokens`, since, () => apiGet(instance, token), (o) => o.status === 401);
    }

    const deleted = await run(CLI, ['app', 'delete', '--client-id', deletedApp.client_id, '--json'], database.env);
    expect(deleted.code, deleted.stderr).toBe(0);
    since = performance.now();
    for (const instance of [A, B]) await honouredWithin(`4. CLI app delete: ${instance.name}’s API refuses its token`, since, () => apiGet(instance, deletedToken), (o) => o.status === 401);
  });

  it('5. a signing key rotated by the CLI: B signs with the new kid within a second, A’s new-key tokens work on B, old tokens stay valid', async () => {
    const app = await privateApp('Key rotation');
    // B has been signing with the current key (cached) right before the rotation.
    const before = await accessToken(B, app);
    const oldKid = jwtHeader(before).kid;
    expect(oldKid).toBeDefined();
    expect(jwtHeader(await accessToken(A, app)).kid).toBe(oldKid);

    const cli = await run(CLI, ['keys', 'rotate', '--json'], database.env);
    const since = performance.now();
    expect(cli.code, cli.stderr).toBe(0);
    const { kid: newKid } = JSON.parse(cli.stdout) as { kid: string };
    expect(newKid).not.toBe(oldKid);

    const issuedWithKid = (instance: Instance) => async (): Promise<Observed> => {
      const res = await clientCredentials(instance, app, app.client_secret);
      return { ...res, body: { ...res.body, kid: res.status === 200 ? jwtHeader(res.body.access_token).kid : undefined } };
    };
    await honouredWithin('5. key rotated: B signs with the new kid', since, issuedWithKid(B), (o) => o.body.kid === newKid);
    let fromA = '';
    await honouredWithin('5. key rotated: A signs with the new kid', since, issuedWithKid(A), (o) => {
      if (o.body.kid === newKid) fromA = o.body.access_token;
      return o.body.kid === newKid;
    });
    const accepted = performance.now();
    await honouredWithin('5. A’s new-key token accepted by B’s API (from when A issued it)', accepted, () => apiGet(B, fromA), (o) => o.status === 200);
    expect((await introspect(B, app.client_id, app.client_secret, fromA)).body.active).toBe(true);

    // By design a retired key keeps verifying until its tokens expire (ACCESS_TOKEN_TTL).
    for (const instance of [A, B]) {
      expect((await apiGet(instance, before)).status).toBe(200);
      expect((await introspect(instance, app.client_id, app.client_secret, before)).body.active).toBe(true);
      const jwks = (await (await fetch(`${instance.url}/.well-known/jwks.json`)).json()) as { keys: { kid: string; alg: string }[] };
      expect(jwks.keys.filter((k) => k.alg === 'ES256').map((k) => k.kid).sort()).toEqual([oldKid, newKid].sort());
    }
  });

  it.runIf(REDIS)('6. with REDIS_URL the API rate limit is one count for both instances: 429 with Retry-After at the shared limit', async () => {
    const app = await privateApp('Rate limited');
    const token = await accessToken(A, app);
    const remaining: string[] = [];
    for (let i = 0; i < RATE_LIMIT; i++) {
      const res = await apiGet(i % 2 === 0 ? A : B, token);
      expect(res.status, `request ${i + 1} of ${RATE_LIMIT} on ${i % 2 === 0 ? 'A' : 'B'}: ${describeObserved(res)}`).toBe(200);
      remaining.push(res.headers.get('ratelimit-remaining') ?? '');
    }
    // One counter: each request, on whichever instance, took one from the same budget.
    expect(remaining).toEqual(Array.from({ length: RATE_LIMIT }, (_, i) => String(RATE_LIMIT - 1 - i)));
    for (const instance of [A, B]) {
      const limited = await apiGet(instance, token);
      expect(limited.status, `${instance.name} past the shared limit`).toBe(429);
      expect(limited.body).toEqual({ error: 'too_many_requests', error_description: expect.stringMatching(new RegExp(`rate limit of ${RATE_LIMIT} requests per minute`)) });
      const retryAfter = Number(limited.headers.get('retry-after'));
      expect(retryAfter).toBeGreaterThan(0);
      expect(retryAfter).toBeLessThanOrEqual(60);
    }
  });
});
