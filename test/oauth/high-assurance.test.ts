/**
 * High-assurance OAuth (issue 28), driven by independent, strict clients over real HTTP through
 * the real login and consent pages, on both databases:
 *
 * - oauth4webapi: pushed authorization request (RFC 9126), private_key_jwt (RFC 7523), DPoP
 *   (RFC 9449) at PAR, the token endpoint (code and refresh) and the API; the API refusing the
 *   DPoP-bound token sent as Bearer, and proofs for another method, another URL, with a reused
 *   jti or a wrong ath.
 * - openid-client validating an RS256 ID token from keys it discovered through the JWKS.
 * - an application under the FAPI 2.0 profile refusing a request without PAR, a token request
 *   without DPoP, and a client secret.
 * - a client that registered itself (RFC 7591) with keys, DPoP and PAR, held to them alike.
 */
import type { FastifyInstance } from 'fastify';
import { calculateJwkThumbprint, decodeProtectedHeader, exportJWK, generateKeyPair, type JWK, SignJWT } from 'jose';
import { createHash, randomUUID } from 'node:crypto';
import * as oauth from 'oauth4webapi';
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { DeveloperApplication } from '../../src/db/schema.js';
import { type ApplicationWithSecret, getApplication, updateApplication } from '../../src/oauth/models/applications.js';
import { changeMemberRole } from '../../src/accounts/organizations.js';
import { authorizationRequest, createRelyingParty, hiddenFields, oidcPerson, type OidcWorld, type Person, RP_REDIRECT, startOidcWorld } from '../helpers/oidc-world.js';

const PASSWORD = 'assurance-password-12';
const ASYNC = 60_000;

let world: OidcWorld;
let app: FastifyInstance;
let issuer: string;
let as: oauth.AuthorizationServer;
const insecure = { [oauth.allowInsecureRequests]: true } as const;

beforeAll(async () => {
  world = await startOidcWorld();
  ({ app, issuer } = world);
  as = await oauth.processDiscoveryResponse(new URL(issuer), await oauth.discoveryRequest(new URL(issuer), { algorithm: 'oidc', ...insecure }));
}, ASYNC);

afterAll(async () => {
  await world?.close();
});

const pathOf = (url: URL | string) => {
  const u = new URL(url, issuer);
  return `${u.pathname}${u.search}`;
};

/** The authorization endpoint's URL with `params` in its query. */
const authorizeUrl = (params: Record<string, string>): URL => {
  const url = new URL(as.authorization_endpoint!);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  return url;
};

/** The browser's part: the authorization URL, the login page, the consent page (Allow). Returns the redirect back. */
async function browse(p: Person, url: URL | string): Promise<URL> {
  let res = await p.browser.get(pathOf(url));
  if (res.statusCode === 303 && (res.headers.location as string).startsWith('/login')) {
    const loginPage = await p.browser.get(res.headers.location as string);
    const fields = hiddenFields(loginPage.body);
    const signedIn = await p.browser.post('/login', { email: p.email, password: PASSWORD, csrf_token: fields.csrf_token!, return_to: fields.return_to! });
    expect(signedIn.statusCode, signedIn.body).toBe(303);
    res = await p.browser.get(signedIn.headers.location as string);
  }
  if (res.statusCode === 200) {
    res = await p.browser.post('/oauth/authorize', { ...hiddenFields(res.body), organization_id: String(world.org.organizationId), decision: 'approve' });
  }
  expect(res.statusCode, res.body).toBe(303);
  return new URL(res.headers.location as string);
}

/** A public application of the organization with `changes` (keys, DPoP, PAR, FAPI 2.0) applied as the management API would. */
async function relyingParty(changes: Parameters<typeof updateApplication>[2]): Promise<{ created: ApplicationWithSecret; app: DeveloperApplication }> {
  const created = await createRelyingParty(world, []);
  const row = await getApplication(world.t.handle.db, world.org.organizationId, created.client_id);
  const updated = await updateApplication(world.t.handle.db, row, changes, { allowHttp: true });
  return { created, app: updated };
}

/** A client key pair for private_key_jwt, its public JWK Set. */
async function clientKeys() {
  const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
  const kid = randomUUID();
  const jwk = { ...(await exportJWK(publicKey)), kid, alg: 'ES256', use: 'sig' };
  return { privateKey, kid, jwks: { keys: [jwk] } };
}

/** A DPoP proof made by hand (for the refusals oauth4webapi would never send). */
async function proof(keys: CryptoKeyPair, claims: { htm: string; htu: string; ath?: string; jti?: string; iat?: number }): Promise<string> {
  const jwk = await exportJWK(keys.publicKey);
  return new SignJWT({ jti: claims.jti ?? randomUUID(), htm: claims.htm, htu: claims.htu, ...(claims.ath ? { ath: claims.ath } : {}) })
    .setProtectedHeader({ alg: 'ES256', typ: 'dpop+jwt', jwk: jwk as JWK })
    .setIssuedAt(claims.iat ?? Math.floor(Date.now() / 1000))
    .sign(keys.privateKey);
}

const ath = (token: string) => createHash('sha256').update(token, 'ascii').digest('base64url');

describe('DPoP, PAR and private_key_jwt with oauth4webapi', () => {
  it(
    'push, sign in, consent, code, refresh and the API, every request DPoP-proved and the client authenticated by its key',
    async () => {
      const keys = await clientKeys();
      const { app: rp } = await relyingParty({ tokenEndpointAuthMethod: 'private_key_jwt', jwks: keys.jwks, dpopBoundAccessTokens: true, requirePushedAuthorizationRequests: true });
      expect(rp.client_secret_hash).toBeNull();
      const rpClient: oauth.Client = { client_id: rp.client_id };
      const clientAuth = oauth.PrivateKeyJwt({ key: keys.privateKey, kid: keys.kid });
      const dpopKeys = await oauth.generateKeyPair('ES256');
      const DPoP = oauth.DPoP(rpClient, dpopKeys);
      const jkt = await calculateJwkThumbprint((await exportJWK(dpopKeys.publicKey)) as JWK);

      const verifier = oauth.generateRandomCodeVerifier();
      const state = oauth.generateRandomState();
      const nonce = oauth.generateRandomNonce();
      const pushed = await oauth.pushedAuthorizationRequest(
        as,
        rpClient,
        clientAuth,
        {
          redirect_uri: RP_REDIRECT,
          response_type: 'code',
          scope: 'openid contacts.read',
          state,
          nonce,
          code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
          code_challenge_method: 'S256',
        },
        { DPoP, ...insecure },
      );
      const par = await oauth.processPushedAuthorizationResponse(as, rpClient, pushed);
      expect(par.expires_in).toBe(60);
      expect(par.request_uri).toMatch(/^urn:ietf:params:oauth:request_uri:/);

      // The browser carries client_id and request_uri only; parameters beside them are ignored (RFC 9126 §4).
      const url = authorizeUrl({ client_id: rp.client_id, request_uri: par.request_uri, scope: 'contacts.write' });
      const ada = await oidcPerson(world, PASSWORD);
      const callback = await browse(ada, url);
      const params = oauth.validateAuthResponse(as, rpClient, callback, state);

      // The request_uri gave its code: used again, it is refused (an error page, nothing redirected).
      const again = await ada.browser.get(pathOf(url));
      expect(again.statusCode).toBe(400);

      const response = await oauth.authorizationCodeGrantRequest(as, rpClient, clientAuth, params, RP_REDIRECT, verifier, { DPoP, ...insecure });
      const tokens = await oauth.processAuthorizationCodeResponse(as, rpClient, response, { expectedNonce: nonce, requireIdToken: true });
      expect(tokens.token_type).toBe('dpop');
      expect(tokens.scope).toBe('openid contacts.read');
      const accessToken = tokens.access_token;
      expect(JSON.parse(Buffer.from(accessToken.split('.')[1]!, 'base64url').toString())).toMatchObject({ cnf: { jkt } });

      const contacts = new URL(`${issuer}/api/v1/${world.org.organizationId}/contacts`);
      const ok = await oauth.protectedResourceRequest(accessToken, 'GET', contacts, new Headers({ accept: 'application/json' }), null, { DPoP, ...insecure });
      expect(ok.status, await ok.clone().text()).toBe(200);

      // Introspection shows the binding.
      const introspected = await oauth.introspectionRequest(as, rpClient, clientAuth, accessToken, insecure);
      expect(await introspected.json()).toMatchObject({ active: true, token_type: 'DPoP', cnf: { jkt } });

      // The same token as a bearer token: refused.
      const bearer = await app.inject({ method: 'GET', url: contacts.pathname, headers: { authorization: `Bearer ${accessToken}` } });
      expect(bearer.statusCode).toBe(401);
      expect(bearer.headers['www-authenticate']).toMatch(/^DPoP algs="[^"]*ES256[^"]*", error="invalid_token"/);
      // Without a proof; a proof for another method; for another URL; a wrong ath; a reused jti.
      const dpop = (p: string) => ({ authorization: `DPoP ${accessToken}`, dpop: p });
      const noProof = await app.inject({ method: 'GET', url: contacts.pathname, headers: { authorization: `DPoP ${accessToken}` } });
      expect(noProof.statusCode).toBe(401);
      expect(noProof.headers['www-authenticate']).toContain('error="invalid_dpop_proof"');
      const otherMethod = await app.inject({ method: 'GET', url: contacts.pathname, headers: dpop(await proof(dpopKeys, { htm: 'POST', htu: contacts.href, ath: ath(accessToken) })) });
      expect(otherMethod.statusCode).toBe(401);
      expect(otherMethod.headers['www-authenticate']).toContain('error="invalid_dpop_proof"');
      const otherUrl = await app.inject({ method: 'GET', url: contacts.pathname, headers: dpop(await proof(dpopKeys, { htm: 'GET', htu: `${issuer}/api/v1/${world.org.organizationId}/tasks`, ath: ath(accessToken) })) });
      expect(otherUrl.statusCode).toBe(401);
      const wrongAth = await app.inject({ method: 'GET', url: contacts.pathname, headers: dpop(await proof(dpopKeys, { htm: 'GET', htu: contacts.href, ath: ath('another token') })) });
      expect(wrongAth.statusCode).toBe(401);
      const good = await proof(dpopKeys, { htm: 'GET', htu: contacts.href, ath: ath(accessToken) });
      expect((await app.inject({ method: 'GET', url: contacts.pathname, headers: dpop(good) })).statusCode).toBe(200);
      const replayed = await app.inject({ method: 'GET', url: contacts.pathname, headers: dpop(good) });
      expect(replayed.statusCode).toBe(401);
      expect(replayed.json()).toMatchObject({ error: 'invalid_dpop_proof' });
      // A proof by another key, right in every other way.
      const otherKeys = await oauth.generateKeyPair('ES256');
      const stolen = await app.inject({ method: 'GET', url: contacts.pathname, headers: dpop(await proof(otherKeys, { htm: 'GET', htu: contacts.href, ath: ath(accessToken) })) });
      expect(stolen.statusCode).toBe(401);

      // userinfo is a protected resource too.
      const userinfo = await oauth.userInfoRequest(as, rpClient, accessToken, { DPoP, ...insecure });
      expect(userinfo.status).toBe(200);

      // Refresh with the key: a new DPoP-bound token. Without a proof: refused, the token not used up.
      const withoutProof = await oauth.refreshTokenGrantRequest(as, rpClient, clientAuth, tokens.refresh_token!, insecure);
      expect(withoutProof.status).toBe(400);
      expect(await withoutProof.json()).toMatchObject({ error: 'invalid_dpop_proof' });
      const refreshed = await oauth.processRefreshTokenResponse(as, rpClient, await oauth.refreshTokenGrantRequest(as, rpClient, clientAuth, tokens.refresh_token!, { DPoP, ...insecure }));
      expect(refreshed.token_type).toBe('dpop');
      expect(JSON.parse(Buffer.from(refreshed.access_token.split('.')[1]!, 'base64url').toString())).toMatchObject({ cnf: { jkt } });

      // The client assertion is single use: the same one again is invalid_client.
      const assertion = await new SignJWT({ jti: randomUUID() })
        .setProtectedHeader({ alg: 'ES256', kid: keys.kid })
        .setIssuer(rp.client_id)
        .setSubject(rp.client_id)
        .setAudience(issuer)
        .setIssuedAt()
        .setExpirationTime('1m')
        .sign(keys.privateKey);
      const introspect = () =>
        app.inject({
          method: 'POST',
          url: '/oauth/introspect',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          payload: new URLSearchParams({ token: accessToken, client_assertion_type: 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer', client_assertion: assertion }).toString(),
        });
      expect((await introspect()).statusCode).toBe(200);
      const replay = await introspect();
      expect(replay.statusCode).toBe(401);
      expect(replay.json()).toMatchObject({ error: 'invalid_client' });
    },
    ASYNC,
  );

  it(
    'turning on DPoP for an application refuses its bearer tokens from before at once; a refresh with a proof gets a bound one',
    async () => {
      const { created, app: rp } = await relyingParty({});
      const rpClient: oauth.Client = { client_id: rp.client_id };
      const clientAuth = oauth.ClientSecretBasic(created.client_secret);
      const verifier = oauth.generateRandomCodeVerifier();
      const state = oauth.generateRandomState();
      const url = authorizeUrl({
        client_id: rp.client_id, redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'contacts.read', state,
        code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256',
      });
      const params = oauth.validateAuthResponse(as, rpClient, await browse(await oidcPerson(world, PASSWORD), url), state);
      const bearer = await oauth.processAuthorizationCodeResponse(as, rpClient, await oauth.authorizationCodeGrantRequest(as, rpClient, clientAuth, params, RP_REDIRECT, verifier, insecure));
      expect(bearer.token_type).toBe('bearer');
      const contacts = `/api/v1/${world.org.organizationId}/contacts`;
      expect((await app.inject({ method: 'GET', url: contacts, headers: { authorization: `Bearer ${bearer.access_token}` } })).statusCode).toBe(200);
      await updateApplication(world.t.handle.db, await getApplication(world.t.handle.db, world.org.organizationId, rp.client_id), { dpopBoundAccessTokens: true }, {
        applications: { forget: () => undefined },
      });
      await expect.poll(async () => (await app.inject({ method: 'GET', url: contacts, headers: { authorization: `Bearer ${bearer.access_token}` } })).statusCode, { timeout: 2000 }).toBe(401);
      // Introspection agrees with the API: that bearer token is no longer active.
      const introspect = async () => (await oauth.introspectionRequest(as, rpClient, clientAuth, bearer.access_token, insecure)).json();
      await expect.poll(introspect, { timeout: 2000 }).toEqual({ active: false });
      const DPoP = oauth.DPoP(rpClient, await oauth.generateKeyPair('ES256'));
      const refreshed = await oauth.processRefreshTokenResponse(as, rpClient, await oauth.refreshTokenGrantRequest(as, rpClient, clientAuth, bearer.refresh_token!, { DPoP, ...insecure }));
      expect(refreshed.token_type).toBe('dpop');
      const ok = await oauth.protectedResourceRequest(refreshed.access_token, 'GET', new URL(`${issuer}${contacts}`), new Headers({ accept: 'application/json' }), null, { DPoP, ...insecure });
      expect(ok.status).toBe(200);
    },
    ASYNC,
  );

  it(
    "a public client's refresh token is bound to its key: another key, or none, is invalid_grant",
    async () => {
      const { app: rp } = await relyingParty({});
      // A public client without credentials, as one that registered itself would be.
      await world.t.handle.db.updateTable('applications').set({ token_endpoint_auth_method: 'none', client_secret_hash: null }).where('id', '=', rp.id).execute();
      world.app.log.info('public client ready');
      const rpClient: oauth.Client = { client_id: rp.client_id, token_endpoint_auth_method: 'none' };
      const dpopKeys = await oauth.generateKeyPair('ES256');
      const DPoP = oauth.DPoP(rpClient, dpopKeys);
      const verifier = oauth.generateRandomCodeVerifier();
      const state = oauth.generateRandomState();
      const url = authorizeUrl({
        client_id: rp.client_id, redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'contacts.read contacts.write', state,
        code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256',
        dpop_jkt: await calculateJwkThumbprint((await exportJWK(dpopKeys.publicKey)) as JWK),
      });
      const ada = await oidcPerson(world, PASSWORD);
      const params = oauth.validateAuthResponse(as, rpClient, await browse(ada, url), state);
      // The code is bound to the key named by dpop_jkt: redeemed with another, refused.
      const thief = oauth.DPoP(rpClient, await oauth.generateKeyPair('ES256'));
      const stolen = await oauth.authorizationCodeGrantRequest(as, rpClient, oauth.None(), params, RP_REDIRECT, verifier, { DPoP: thief, ...insecure });
      expect(stolen.status).toBe(400);
      expect(await stolen.json()).toMatchObject({ error: 'invalid_grant' });
      const tokens = await oauth.processAuthorizationCodeResponse(
        as,
        rpClient,
        await oauth.authorizationCodeGrantRequest(as, rpClient, oauth.None(), params, RP_REDIRECT, verifier, { DPoP, ...insecure }),
      );
      expect(tokens.token_type).toBe('dpop');
      const refresh = (options: oauth.TokenEndpointRequestOptions) => oauth.refreshTokenGrantRequest(as, rpClient, oauth.None(), tokens.refresh_token!, { ...options, ...insecure });
      const otherKey = await refresh({ DPoP: oauth.DPoP(rpClient, await oauth.generateKeyPair('ES256')) });
      expect(otherKey.status).toBe(400);
      expect(await otherKey.json()).toMatchObject({ error: 'invalid_grant', error_description: expect.stringContaining('another DPoP key') });
      const none = await refresh({});
      expect(none.status).toBe(400);
      expect(await none.json()).toMatchObject({ error: 'invalid_grant' });
      const refreshed = await oauth.processRefreshTokenResponse(as, rpClient, await refresh({ DPoP }));
      expect(refreshed.token_type).toBe('dpop');

      // A role change narrows the grant into a new one: still bound to the key.
      await changeMemberRole(world.t.handle.db, { organizationId: world.org.organizationId, userId: ada.id, role: 'viewer' });
      const narrowedRefresh = (options: oauth.TokenEndpointRequestOptions) => oauth.refreshTokenGrantRequest(as, rpClient, oauth.None(), refreshed.refresh_token!, { ...options, ...insecure });
      const unproved = await narrowedRefresh({});
      expect(unproved.status).toBe(400);
      expect(await unproved.json()).toMatchObject({ error: 'invalid_grant' });
      const narrowed = await oauth.processRefreshTokenResponse(as, rpClient, await narrowedRefresh({ DPoP }));
      expect(narrowed).toMatchObject({ token_type: 'dpop', scope: 'contacts.read' });
    },
    ASYNC,
  );
});

describe('pushed authorization requests (HA-2)', () => {
  it(
    'a request_uri is refused for another client, after its 60 seconds, and once it gave a code; pushing needs the client’s credentials',
    async () => {
      const { created, app: rp } = await relyingParty({});
      const { app: other } = await relyingParty({});
      const rpClient: oauth.Client = { client_id: rp.client_id };
      const clientAuth = oauth.ClientSecretBasic(created.client_secret);
      const push = async (auth = clientAuth) => {
        const verifier = oauth.generateRandomCodeVerifier();
        const state = oauth.generateRandomState();
        const response = await oauth.pushedAuthorizationRequest(
          as,
          rpClient,
          auth,
          { redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'contacts.read', state, code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256' },
          insecure,
        );
        return { response, state };
      };
      const refusedPush = await push(oauth.ClientSecretBasic(`${created.client_secret}x`));
      expect(refusedPush.response.status).toBe(401);
      expect(await refusedPush.response.json()).toMatchObject({ error: 'invalid_client' });

      const ada = await oidcPerson(world, PASSWORD);
      const first = await push();
      const firstUri = (await oauth.processPushedAuthorizationResponse(as, rpClient, first.response)).request_uri;
      oauth.validateAuthResponse(as, rpClient, await browse(ada, authorizeUrl({ client_id: rp.client_id, request_uri: firstUri })), first.state);
      // Used: an error page, nothing redirected.
      expect((await ada.browser.get(pathOf(authorizeUrl({ client_id: rp.client_id, request_uri: firstUri })))).statusCode).toBe(400);

      // Bound to its client: another client_id with it is an error page, and leaves it usable by its own.
      const second = await push();
      const secondUri = (await oauth.processPushedAuthorizationResponse(as, rpClient, second.response)).request_uri;
      const stolen = await ada.browser.get(pathOf(authorizeUrl({ client_id: other.client_id, request_uri: secondUri })));
      expect(stolen.statusCode).toBe(400);
      expect(stolen.headers.location).toBeUndefined();
      oauth.validateAuthResponse(as, rpClient, await browse(ada, authorizeUrl({ client_id: rp.client_id, request_uri: secondUri })), second.state);

      // 60 seconds: one pushed a minute ago (its expiry moved back) is refused.
      const third = await push();
      const thirdUri = (await oauth.processPushedAuthorizationResponse(as, rpClient, third.response)).request_uri;
      const moved = await world.t.handle.db
        .updateTable('pushed_authorization_requests')
        .set({ expires_at: new Date(Date.now() - 1000) })
        .where('request_uri_hash', '=', createHash('sha256').update(thirdUri).digest('hex'))
        .executeTakeFirstOrThrow();
      expect(moved.numUpdatedRows).toBe(1n);
      expect((await ada.browser.get(pathOf(authorizeUrl({ client_id: rp.client_id, request_uri: thirdUri })))).statusCode).toBe(400);
    },
    ASYNC,
  );
});

describe('a client that registers itself with keys and DPoP (RFC 7591)', () => {
  it(
    'oauth4webapi registers private_key_jwt with its jwks, DPoP and PAR required, then runs PAR, code, refresh and the API as a developer’s application would',
    async () => {
      const keys = await clientKeys();
      const registered = await oauth.processDynamicClientRegistrationResponse(
        await oauth.dynamicClientRegistrationRequest(
          as,
          {
            client_name: 'Keyed agent',
            redirect_uris: [RP_REDIRECT],
            token_endpoint_auth_method: 'private_key_jwt',
            jwks: keys.jwks,
            dpop_bound_access_tokens: true,
            require_pushed_authorization_requests: true,
            id_token_signed_response_alg: 'ES256',
          },
          insecure,
        ),
      );
      // No secret: the keys are its credential. Everything it registered is echoed (RFC 7591 §3.2.1).
      expect(registered).not.toHaveProperty('client_secret');
      expect(registered).toMatchObject({
        token_endpoint_auth_method: 'private_key_jwt',
        jwks: keys.jwks,
        dpop_bound_access_tokens: true,
        require_pushed_authorization_requests: true,
        id_token_signed_response_alg: 'ES256',
      });
      const row = await world.t.handle.db.selectFrom('applications').selectAll().where('client_id', '=', registered.client_id).executeTakeFirstOrThrow();
      expect(row).toMatchObject({ registration: 'dynamic', organization_id: null, client_secret_hash: null, jwks: keys.jwks, fapi2: false });
      const read = await app.inject({ method: 'GET', url: `/oauth/register/${registered.client_id}`, headers: { authorization: `Bearer ${registered.registration_access_token as string}` } });
      expect(read.json()).toMatchObject({ token_endpoint_auth_method: 'private_key_jwt', jwks: keys.jwks, dpop_bound_access_tokens: true });

      const rpClient: oauth.Client = { client_id: registered.client_id };
      const clientAuth = oauth.PrivateKeyJwt({ key: keys.privateKey, kid: keys.kid });
      const DPoP = oauth.DPoP(rpClient, await oauth.generateKeyPair('ES256'));
      const verifier = oauth.generateRandomCodeVerifier();
      const state = oauth.generateRandomState();
      const request = { redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'openid contacts.read', state, code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256' };
      // PAR is required: the same request straight to the authorization endpoint is refused.
      const direct = await browse(await oidcPerson(world, PASSWORD), authorizeUrl({ client_id: registered.client_id, ...request }));
      expect(direct.searchParams.get('error')).toBe('invalid_request');
      const par = await oauth.processPushedAuthorizationResponse(as, rpClient, await oauth.pushedAuthorizationRequest(as, rpClient, clientAuth, request, { DPoP, ...insecure }));
      const params = oauth.validateAuthResponse(as, rpClient, await browse(await oidcPerson(world, PASSWORD), authorizeUrl({ client_id: registered.client_id, request_uri: par.request_uri })), state);
      // DPoP is required: without a proof the code is not redeemed.
      const withoutDpop = await oauth.authorizationCodeGrantRequest(as, rpClient, clientAuth, params, RP_REDIRECT, verifier, insecure);
      expect(withoutDpop.status).toBe(400);
      expect(await withoutDpop.json()).toMatchObject({ error: 'invalid_dpop_proof' });
      const tokens = await oauth.processAuthorizationCodeResponse(
        as,
        { ...rpClient, id_token_signed_response_alg: 'ES256' },
        await oauth.authorizationCodeGrantRequest(as, rpClient, clientAuth, params, RP_REDIRECT, verifier, { DPoP, ...insecure }),
        { requireIdToken: true },
      );
      expect(tokens.token_type).toBe('dpop');
      expect(decodeProtectedHeader(tokens.id_token!)).toMatchObject({ alg: 'ES256' });
      const contacts = new URL(`${issuer}/api/v1/${world.org.organizationId}/contacts`);
      const ok = await oauth.protectedResourceRequest(tokens.access_token, 'GET', contacts, new Headers({ accept: 'application/json' }), null, { DPoP, ...insecure });
      expect(ok.status, await ok.clone().text()).toBe(200);
      const refreshed = await oauth.processRefreshTokenResponse(as, rpClient, await oauth.refreshTokenGrantRequest(as, rpClient, clientAuth, tokens.refresh_token!, { DPoP, ...insecure }));
      expect(refreshed.token_type).toBe('dpop');
      // An assertion signed by another key is not the client.
      const stranger = await clientKeys();
      const refused = await oauth.refreshTokenGrantRequest(as, rpClient, oauth.PrivateKeyJwt({ key: stranger.privateKey, kid: keys.kid }), refreshed.refresh_token!, { DPoP, ...insecure });
      expect(refused.status).toBe(401);
      expect(await refused.json()).toMatchObject({ error: 'invalid_client' });
    },
    ASYNC,
  );
});

describe('ID tokens signed with RS256, validated by openid-client', () => {
  it(
    'an application that asks for RS256 gets RS256 ID tokens, verified with keys discovered through the JWKS',
    async () => {
      const { created, app: rp } = await relyingParty({ idTokenSignedResponseAlg: 'RS256' });
      expect(rp.id_token_signed_response_alg).toBe('RS256');
      const oidc = await client.discovery(new URL(issuer), rp.client_id, { client_secret: created.client_secret, id_token_signed_response_alg: 'RS256' }, client.ClientSecretBasic(created.client_secret), {
        execute: [client.allowInsecureRequests],
      });
      expect(oidc.serverMetadata().id_token_signing_alg_values_supported).toEqual(['RS256', 'ES256']);
      const { url, checks } = await authorizationRequest(oidc, 'openid email');
      const ada = await oidcPerson(world, PASSWORD);
      const callback = await browse(ada, url);
      const tokens = await client.authorizationCodeGrant(oidc, callback, checks);
      const header = decodeProtectedHeader(tokens.id_token!);
      expect(header).toMatchObject({ alg: 'RS256', typ: 'JWT' });
      const jwks = (await app.inject({ method: 'GET', url: '/.well-known/jwks.json' })).json() as { keys: JWK[] };
      expect(jwks.keys.find((k) => k.kid === header.kid)).toMatchObject({ kty: 'RSA', alg: 'RS256', use: 'sig' });
      expect(tokens.claims()).toMatchObject({ sub: String(ada.id), email: ada.email });
      // The access token stays ES256 (SIGNING_ALG).
      expect(decodeProtectedHeader(tokens.access_token)).toMatchObject({ alg: 'ES256', typ: 'at+jwt' });

      // An application on ES256: a client expecting RS256 refuses its ID token.
      const { created: other } = await relyingParty({ idTokenSignedResponseAlg: 'ES256' });
      const strict = await client.discovery(new URL(issuer), other.client_id, { client_secret: other.client_secret, id_token_signed_response_alg: 'RS256' }, client.ClientSecretBasic(other.client_secret), {
        execute: [client.allowInsecureRequests],
      });
      const second = await authorizationRequest(strict, 'openid');
      const grace = await oidcPerson(world, PASSWORD);
      const error = await client.authorizationCodeGrant(strict, await browse(grace, second.url), second.checks).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(Error);
      expect(String((error as Error & { cause?: unknown }).cause ?? (error as Error).message)).toMatch(/alg/i);
    },
    ASYNC,
  );
});

describe('the FAPI 2.0 profile', () => {
  it(
    'refuses an authorization request without PAR, a token request without DPoP, and a client secret',
    async () => {
      // Refused for an application that still authenticates with a secret.
      const { app: secretApp } = await relyingParty({});
      await expect(updateApplication(world.t.handle.db, secretApp, { fapi2: true })).rejects.toMatchObject({ statusCode: 400, description: expect.stringContaining('private_key_jwt') });

      const keys = await clientKeys();
      const { created, app: rp } = await relyingParty({ tokenEndpointAuthMethod: 'private_key_jwt', jwks: keys.jwks, fapi2: true });
      expect(rp.fapi2).toBe(true);
      const rpClient: oauth.Client = { client_id: rp.client_id };
      const clientAuth = oauth.PrivateKeyJwt({ key: keys.privateKey, kid: keys.kid });

      // 1. Without PAR: an error on the redirect URI (it is registered), no code.
      const ada = await oidcPerson(world, PASSWORD);
      const verifier = oauth.generateRandomCodeVerifier();
      const direct = authorizeUrl({
        client_id: rp.client_id, redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'contacts.read', state: oauth.generateRandomState(),
        code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256',
      });
      const refused = await browse(ada, direct);
      expect(refused.searchParams.get('error')).toBe('invalid_request');
      expect(refused.searchParams.get('error_description')).toContain('push');
      expect(refused.searchParams.get('code')).toBeNull();

      // PAR without PKCE: refused at the push.
      const noPkce = await oauth.pushedAuthorizationRequest(as, rpClient, clientAuth, { redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'contacts.read', state: oauth.generateRandomState() }, insecure);
      expect(noPkce.status).toBe(400);
      expect(await noPkce.json()).toMatchObject({ error: 'invalid_request', error_description: expect.stringContaining('PKCE') });

      // 2. With PAR and a code, but the token request without a DPoP proof: refused.
      const state = oauth.generateRandomState();
      const pushed = await oauth.processPushedAuthorizationResponse(
        as,
        rpClient,
        await oauth.pushedAuthorizationRequest(
          as,
          rpClient,
          clientAuth,
          { redirect_uri: RP_REDIRECT, response_type: 'code', scope: 'contacts.read', state, code_challenge: await oauth.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256' },
          insecure,
        ),
      );
      const url = authorizeUrl({ client_id: rp.client_id, request_uri: pushed.request_uri });
      const params = oauth.validateAuthResponse(as, rpClient, await browse(ada, url), state);
      // Its code lives 60 seconds at most.
      const code = await world.t.handle.db
        .selectFrom('authorization_codes')
        .select((eb) => eb.fn<number>('date_part', [eb.val('epoch'), eb.ref('expires_at')]).as('expires'))
        .select((eb) => eb.fn<number>('date_part', [eb.val('epoch'), eb.ref('created_at')]).as('created'))
        .where('application_id', '=', rp.id)
        .executeTakeFirstOrThrow();
      expect(code.expires - code.created).toBeLessThanOrEqual(61);
      const withoutDpop = await oauth.authorizationCodeGrantRequest(as, rpClient, clientAuth, params, RP_REDIRECT, verifier, insecure);
      expect(withoutDpop.status).toBe(400);
      expect(await withoutDpop.json()).toMatchObject({ error: 'invalid_dpop_proof' });

      // 3. A client secret: there is none to use, and one sent is invalid_client.
      const withSecret = await app.inject({
        method: 'POST',
        url: '/oauth/token',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: `Basic ${Buffer.from(`${rp.client_id}:${created.client_secret}`).toString('base64')}` },
        payload: new URLSearchParams({ grant_type: 'authorization_code', code: params.get('code')!, redirect_uri: RP_REDIRECT, code_verifier: verifier }).toString(),
      });
      expect(withSecret.statusCode).toBe(401);
      expect(withSecret.json()).toMatchObject({ error: 'invalid_client' });

      // With everything: tokens, DPoP-bound.
      const DPoP = oauth.DPoP(rpClient, await oauth.generateKeyPair('ES256'));
      const tokens = await oauth.processAuthorizationCodeResponse(as, rpClient, await oauth.authorizationCodeGrantRequest(as, rpClient, clientAuth, params, RP_REDIRECT, verifier, { DPoP, ...insecure }));
      expect(tokens.token_type).toBe('dpop');

      // No rotation (FAPI 2.0 §5.3.2.1): the refresh token stays the same, and works again (a retry
      // after a lost response succeeds); bound to the key and the client's private_key_jwt.
      for (let i = 0; i < 2; i++) {
        const refreshed = await oauth.processRefreshTokenResponse(as, rpClient, await oauth.refreshTokenGrantRequest(as, rpClient, clientAuth, tokens.refresh_token!, { DPoP, ...insecure }));
        expect(refreshed).toMatchObject({ token_type: 'dpop', refresh_token: tokens.refresh_token });
      }
      const thief = await oauth.refreshTokenGrantRequest(as, rpClient, clientAuth, tokens.refresh_token!, insecure);
      expect(thief.status).toBe(400);
    },
    ASYNC,
  );
});
