/**
 * Upstream OpenID providers that release the person's claims at UserInfo only (issue 41 §5), on
 * both databases. With the code flow OIDC Core §5.4 lets a provider leave email, email_verified
 * and name out of the ID token and answer them at its UserInfo endpoint; node-oidc-provider does
 * so by default (conformIdTokenClaims), and test/helpers/upstream-oidc.ts runs it that way.
 *
 * What must hold: such a provider's users sign in, with UserInfo's claims under the same trust
 * rules as an ID token's (SS-1); a UserInfo about another subject than the ID token is refused
 * (§5.3.4); the UserInfo request goes through the guarded outbound client (AG-1), so an endpoint
 * on a refused network is refused; a signed UserInfo (application/jwt) is read; a provider with
 * no UserInfo endpoint and no email in its ID token is refused as before.
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createUser } from '../../src/accounts/users.js';
import { createConnection } from '../../src/sso/connections.js';
import { REFUSAL_MESSAGES } from '../../src/sso/identities.js';
import { Browser } from '../accounts/browser.js';
import { BACKEND } from '../helpers/db.js';
import { auditEvents, pageText, postEmail, signInThroughSso, type SsoOrganization, ssoOrganization, type SsoWorld, startSsoWorld, upstreamCallback } from '../helpers/sso-world.js';
import { startUpstreamOidc, type UpstreamClient, type UpstreamOidc } from '../helpers/upstream-oidc.js';

let world: SsoWorld;
/** An organization whose one connection is the world's default-configured upstream. */
let corp: SsoOrganization;
const others: UpstreamOidc[] = [];
let n = 0;

beforeAll(async () => {
  world = await startSsoWorld();
  corp = await ssoOrganization(world, { domain: 'userinfo.example', name: 'UserInfo Inc' });
}, 60_000);
afterAll(async () => {
  await Promise.all(others.map((o) => o.close()));
  await world?.close();
});

const db = () => world.db;
const newBrowser = () => new Browser(world.app, `10.41.${Math.floor(++n / 250)}.${(n % 250) + 1}`);
const userByEmail = (email: string) => db().selectFrom('users').selectAll().where('email', '=', email).executeTakeFirst();
const linksWithSubject = (subject: string) => db().selectFrom('sso_identities').select(['user_id', 'connection_id', 'subject', 'email']).where('subject', '=', subject).execute();
const mainText = (res: LightMyRequestResponse) => pageText(/<main>([\s\S]*)<\/main>/.exec(res.body)?.[1] ?? res.body);

const COULD_NOT_COMPLETE = 'Company sign-in failed Your company sign-in could not be completed. Start again, or ask your administrator. Sign in again';

function expectNoSession(res: LightMyRequestResponse, browser: Browser) {
  expect(res.cookies.find((c) => c.name === 'orgauth_session' && c.value !== '')).toBeUndefined();
  expect(browser.cookies.has('orgauth_session')).toBe(false);
}

/**
 * An organization with `domain` verified and one OIDC connection to `upstream` (its own client
 * there, with `client` metadata added: e.g. userinfo_signed_response_alg).
 */
async function organizationAt(upstream: UpstreamOidc, domain: string, client: Partial<UpstreamClient> = {}) {
  const org = await ssoOrganization(world, { domain, connections: 0 });
  const clientId = `orgauth-${domain}`;
  const clientSecret = `secret-${domain}-0123456789abcdef`;
  const view = await createConnection(db(), world.settings, org.organizationId, { protocol: 'oidc', name: 'Corp IdP', issuer: upstream.issuer, client_id: clientId, client_secret: clientSecret, jit: true, default_role: 'member' });
  upstream.registerClient({ ...client, client_id: clientId, client_secret: clientSecret, redirect_uris: [view.redirect_uri!] });
  return { ...org, connectionId: view.id };
}

async function otherUpstream(options: Parameters<typeof startUpstreamOidc>[0]) {
  const upstream = await startUpstreamOidc(options);
  others.push(upstream);
  return upstream;
}

/** The sign-in of `login` (an account at `upstream`) as `email`, through the email step: the callback's response. */
async function signInAt(upstream: UpstreamOidc, browser: Browser, email: string, login: string) {
  const leaving = await postEmail(browser, email);
  expect(leaving.statusCode, leaving.body).toBe(303);
  expect(new URL(leaving.headers.location as string).origin).toBe(upstream.issuer);
  return browser.get(await upstreamCallback({ ...world, upstream }, leaving, login));
}

describe(`an upstream provider that releases the person's claims at UserInfo only, on ${BACKEND}`, () => {
  it('a default-configured oidc-provider: the email, email_verified and name come from UserInfo, and the user is provisioned and signed in', async () => {
    world.upstream.setAccount('uma', { sub: 'uma-sub', email: 'uma@userinfo.example', email_verified: true, name: 'Uma Userinfo' });
    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, 'uma@userinfo.example', 'uma');
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    expect(browser.cookies.has('orgauth_session')).toBe(true);
    const user = (await userByEmail('uma@userinfo.example'))!;
    expect(user).toMatchObject({ email: 'uma@userinfo.example', name: 'Uma Userinfo', password_hash: null });
    expect(user.email_verified_at).toBeInstanceOf(Date);
    expect(await linksWithSubject('uma-sub')).toEqual([{ user_id: user.id, connection_id: corp.connectionId, subject: 'uma-sub', email: 'uma@userinfo.example' }]);
    expect((await auditEvents(world, corp.organizationId, 'sso.user_provisioned')).map((e) => e.details)).toContainEqual({ connection_id: corp.connectionId, user_id: user.id, role: 'member' });
  });

  it("UserInfo's email_verified: false counts as an ID token's would: an existing account is linked only after its owner proves it", async () => {
    const existing = await createUser(db(), { email: 'vera@userinfo.example', password: 'a local password 123' });
    world.upstream.setAccount('vera', { sub: 'vera-sub', email: 'vera@userinfo.example', email_verified: false, name: 'Vera' });
    const browser = newBrowser();
    const res = await signInThroughSso(world, browser, 'vera@userinfo.example', 'vera');
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toMatch(/^\/sso\/link\?handle=/);
    expectNoSession(res, browser);
    expect(await linksWithSubject('vera-sub')).toEqual([]);
    expect((await auditEvents(world, corp.organizationId, 'sso.link_needs_proof')).map((e) => e.details)).toContainEqual({ connection_id: corp.connectionId, user_id: existing.id, reason: 'email_not_verified_by_provider' });
  });

  it("a UserInfo whose sub is not the ID token's: refused, audited, nobody created or linked", async () => {
    // The provider answers UserInfo about someone else (the ID token still says wes-sub).
    world.upstream.setAccount('wes', { sub: 'wes-sub', email: 'wes@userinfo.example', email_verified: true, name: 'Wes', userinfo_sub: 'someone-else-sub' });
    const browser = newBrowser();
    const before = (await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).length;
    const res = await signInThroughSso(world, browser, 'wes@userinfo.example', 'wes');
    expect(res.statusCode, res.body).toBe(400);
    expect(mainText(res)).toBe(COULD_NOT_COMPLETE);
    expectNoSession(res, browser);
    expect(await userByEmail('wes@userinfo.example')).toBeUndefined();
    expect([...(await linksWithSubject('wes-sub')), ...(await linksWithSubject('someone-else-sub'))]).toEqual([]);
    expect((await auditEvents(world, corp.organizationId, 'sso.sign_in_failed')).slice(before).map((e) => e.details)).toEqual([
      { connection_id: corp.connectionId, reason: "userinfo refused: its sub is not the ID token's (OIDC Core §5.3.4), so its claims may be another person's" },
    ]);
  });

  it('a signed UserInfo (application/jwt, OIDC Core §5.3.2) is read like a JSON one', async () => {
    const org = await organizationAt(world.upstream, 'signed-userinfo.example', { userinfo_signed_response_alg: 'RS256' });
    world.upstream.setAccount('xena', { sub: 'xena-sub', email: 'xena@signed-userinfo.example', email_verified: true, name: 'Xena Signed' });
    const browser = newBrowser();
    const res = await signInAt(world.upstream, browser, 'xena@signed-userinfo.example', 'xena');
    expect(res.statusCode, res.body).toBe(303);
    expect(res.headers.location).toBe('/dashboard');
    const user = (await userByEmail('xena@signed-userinfo.example'))!;
    expect(user).toMatchObject({ name: 'Xena Signed' });
    expect(user.email_verified_at).toBeInstanceOf(Date);
    expect(await linksWithSubject('xena-sub')).toEqual([{ user_id: user.id, connection_id: org.connectionId, subject: 'xena-sub', email: 'xena@signed-userinfo.example' }]);
  });

  it('a UserInfo endpoint on a network the guarded outbound client refuses (169.254.169.254): refused, audited without the address', async () => {
    const upstream = await otherUpstream({ userinfoEndpoint: 'http://169.254.169.254/userinfo' });
    const org = await organizationAt(upstream, 'metadata-userinfo.example');
    upstream.setAccount('yuri', { sub: 'yuri-sub', email: 'yuri@metadata-userinfo.example', email_verified: true, name: 'Yuri' });
    const browser = newBrowser();
    const res = await signInAt(upstream, browser, 'yuri@metadata-userinfo.example', 'yuri');
    expect(res.statusCode, res.body).toBe(400);
    expect(mainText(res)).toBe(COULD_NOT_COMPLETE);
    expectNoSession(res, browser);
    expect(await userByEmail('yuri@metadata-userinfo.example')).toBeUndefined();
    expect((await auditEvents(world, org.organizationId, 'sso.sign_in_failed')).map((e) => e.details)).toEqual([
      {
        connection_id: org.connectionId,
        reason: 'userinfo failed: ClientError: something went wrong <- OutboundRefusedError: the provider’s address is not one orgauth may reach (private or special-use, plain http, or too slow or large)',
      },
    ]);
  });

  it('a provider with no UserInfo endpoint whose ID token has no email: refused as email_missing, as before', async () => {
    const upstream = await otherUpstream({ userinfoEndpoint: null });
    const org = await organizationAt(upstream, 'no-userinfo.example');
    upstream.setAccount('zoe', { sub: 'zoe-sub', email: 'zoe@no-userinfo.example', email_verified: true, name: 'Zoe' });
    const browser = newBrowser();
    const res = await signInAt(upstream, browser, 'zoe@no-userinfo.example', 'zoe');
    expect(res.statusCode, res.body).toBe(403);
    expect(mainText(res)).toBe(`Company sign-in refused ${REFUSAL_MESSAGES.email_missing} Sign in again`);
    expectNoSession(res, browser);
    expect(await userByEmail('zoe@no-userinfo.example')).toBeUndefined();
    expect((await auditEvents(world, org.organizationId, 'sso.sign_in_refused')).map((e) => e.details)).toEqual([{ connection_id: org.connectionId, reason: 'email_missing', subject: 'zoe-sub' }]);
  });
});
