/** The upstream OpenID provider fixture, driven by openid-client v6 as orgauth's relying party will be. */
import * as client from 'openid-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CookieJar, startUpstreamOidc, type UpstreamOidc } from './upstream-oidc.js';

const CLIENT = { client_id: 'orgauth-sso', client_secret: 'upstream-secret-0123456789', redirect_uris: ['http://127.0.0.1:9/sso/callback'] };

let upstream: UpstreamOidc;
let config: client.Configuration;

beforeAll(async () => {
  upstream = await startUpstreamOidc({ accounts: { alice: { sub: 'alice-sub', email: 'alice@corp.example', email_verified: true, name: 'Alice' } } });
  upstream.registerClient(CLIENT);
  config = await client.discovery(new URL(upstream.issuer), CLIENT.client_id, CLIENT.client_secret, undefined, { execute: [client.allowInsecureRequests] });
});
afterAll(() => upstream?.close());

async function authorizationRequest(extra: Record<string, string> = {}) {
  const verifier = client.randomPKCECodeVerifier();
  const state = client.randomState();
  const nonce = client.randomNonce();
  const url = client.buildAuthorizationUrl(config, {
    redirect_uri: CLIENT.redirect_uris[0]!,
    scope: 'openid email profile',
    code_challenge: await client.calculatePKCECodeChallenge(verifier),
    code_challenge_method: 'S256',
    state,
    nonce,
    ...extra,
  });
  return { url, verifier, state, nonce };
}

describe('upstream OpenID provider', () => {
  it('publishes its issuer exactly, without a trailing slash', async () => {
    expect(upstream.issuer).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(config.serverMetadata().issuer).toBe(upstream.issuer);
    expect(config.serverMetadata().code_challenge_methods_supported).toEqual(['S256']);
  });

  it('signs a user in; the ID token has sub, amr and nonce, and the email and profile claims are at UserInfo only (conformIdTokenClaims)', async () => {
    const { url, verifier, state, nonce } = await authorizationRequest();
    const callback = new URL(await upstream.signIn(url, 'alice'));
    expect(callback.origin + callback.pathname).toBe(CLIENT.redirect_uris[0]);
    expect(callback.searchParams.get('state')).toBe(state);
    expect(callback.searchParams.get('iss')).toBe(upstream.issuer);
    expect(callback.searchParams.get('code')).toBeTruthy();

    const tokens = await client.authorizationCodeGrant(config, callback, { pkceCodeVerifier: verifier, expectedState: state, expectedNonce: nonce, idTokenExpected: true });
    const claims = tokens.claims()!;
    expect(claims).toMatchObject({ iss: upstream.issuer, aud: CLIENT.client_id, sub: 'alice-sub', amr: ['pwd', 'mfa'], nonce });
    for (const claim of ['email', 'email_verified', 'name']) expect(claims).not.toHaveProperty(claim);
    expect(config.serverMetadata().userinfo_endpoint).toBe(`${upstream.issuer}/me`);
    expect(await client.fetchUserInfo(config, tokens.access_token, 'alice-sub')).toEqual({ sub: 'alice-sub', email: 'alice@corp.example', email_verified: true, name: 'Alice' });
  });

  it('takes an amr per sign-in and accounts added after start', async () => {
    upstream.setAccount('bob', { sub: 'bob-sub', email: 'bob@corp.example', email_verified: false });
    const { url, verifier, state, nonce } = await authorizationRequest();
    const callback = new URL(await upstream.signIn(url, 'bob', { amr: ['pwd'] }));
    const tokens = await client.authorizationCodeGrant(config, callback, { pkceCodeVerifier: verifier, expectedState: state, expectedNonce: nonce });
    expect(tokens.claims()).toMatchObject({ sub: 'bob-sub', amr: ['pwd'] });
    expect(await client.fetchUserInfo(config, tokens.access_token, 'bob-sub')).toEqual({ sub: 'bob-sub', email: 'bob@corp.example', email_verified: false });
  });

  it('finds the upstream session of a browser that signed in before (same jar)', async () => {
    const jar = new CookieJar();
    const first = await authorizationRequest();
    await upstream.signIn(first.url, 'alice', { jar });
    const second = await authorizationRequest();
    // The login is not asked for again: a wrong one would fail if it were.
    const callback = new URL(await upstream.signIn(second.url, 'nobody', { jar }));
    const tokens = await client.authorizationCodeGrant(config, callback, { pkceCodeVerifier: second.verifier, expectedState: second.state, expectedNonce: second.nonce });
    expect(tokens.claims()?.sub).toBe('alice-sub');
  });

  it('shows a form a browser can fill (input[name=login], button[type=submit])', async () => {
    const { url } = await authorizationRequest();
    const res = await fetch(url, { redirect: 'manual' });
    const interaction = new URL(res.headers.get('location')!, upstream.issuer);
    expect(interaction.pathname).toMatch(/^\/interaction\//);
    const cookie = res.headers.getSetCookie().map((c) => c.split(';')[0]).join('; ');
    const page = await fetch(interaction, { headers: { cookie } });
    const html = await page.text();
    expect(page.headers.get('content-type')).toMatch(/^text\/html/);
    expect(html).toMatch(/<input name="login"/);
    expect(html).toMatch(/<button type="submit">/);
  });

  it('refuses an unknown login, and a client on a new registration works at once', async () => {
    const { url } = await authorizationRequest();
    await expect(upstream.signIn(url, 'mallory')).rejects.toThrow(/401 .*Unknown login mallory/);

    upstream.registerClient({ client_id: 'second', client_secret: 'second-secret-0123456789', redirect_uris: ['http://127.0.0.1:9/second'] });
    const second = await client.discovery(new URL(upstream.issuer), 'second', 'second-secret-0123456789', undefined, { execute: [client.allowInsecureRequests] });
    const verifier = client.randomPKCECodeVerifier();
    const authorize = client.buildAuthorizationUrl(second, {
      redirect_uri: 'http://127.0.0.1:9/second',
      scope: 'openid email',
      code_challenge: await client.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
    });
    const tokens = await client.authorizationCodeGrant(second, new URL(await upstream.signIn(authorize, 'alice')), { pkceCodeVerifier: verifier });
    expect(tokens.claims()).toMatchObject({ aud: 'second', sub: 'alice-sub' });
    // Only the claims of the scopes granted: no profile, no name.
    expect(await client.fetchUserInfo(second, tokens.access_token, 'alice-sub')).toEqual({ sub: 'alice-sub', email: 'alice@corp.example', email_verified: true });
  });

  it('requires PKCE, also of a confidential client', async () => {
    const url = client.buildAuthorizationUrl(config, { redirect_uri: CLIENT.redirect_uris[0]!, scope: 'openid', state: 'pkce-less' });
    const callback = new URL(await upstream.signIn(url, 'alice'));
    expect(callback.searchParams.get('error')).toBe('invalid_request');
    expect(callback.searchParams.get('error_description')).toMatch(/PKCE/);
  });

  it('answers UserInfo with userinfo_sub when an account has one (the ID token keeps sub), and openid-client refuses that answer', async () => {
    upstream.setAccount('mixed', { sub: 'mixed-sub', email: 'mixed@corp.example', email_verified: true, userinfo_sub: 'someone-else' });
    const { url, verifier, state, nonce } = await authorizationRequest();
    const tokens = await client.authorizationCodeGrant(config, new URL(await upstream.signIn(url, 'mixed')), { pkceCodeVerifier: verifier, expectedState: state, expectedNonce: nonce });
    expect(tokens.claims()?.sub).toBe('mixed-sub');
    expect(await client.fetchUserInfo(config, tokens.access_token, client.skipSubjectCheck)).toEqual({ sub: 'someone-else', email: 'mixed@corp.example', email_verified: true });
    await expect(client.fetchUserInfo(config, tokens.access_token, 'mixed-sub')).rejects.toMatchObject({ cause: { message: 'unexpected "response" body "sub" property value' } });
  });

  it('answers UserInfo as a signed JWT to a client registered with userinfo_signed_response_alg', async () => {
    const jwtClient = { client_id: 'jwt-userinfo', client_secret: 'jwt-userinfo-secret-0123456789', redirect_uris: ['http://127.0.0.1:9/jwt'], userinfo_signed_response_alg: 'RS256' };
    upstream.registerClient(jwtClient);
    const jwtConfig = await client.discovery(new URL(upstream.issuer), jwtClient.client_id, jwtClient.client_secret, undefined, { execute: [client.allowInsecureRequests] });
    expect(jwtConfig.serverMetadata().userinfo_signing_alg_values_supported).toContain('RS256');
    const verifier = client.randomPKCECodeVerifier();
    const authorize = client.buildAuthorizationUrl(jwtConfig, {
      redirect_uri: jwtClient.redirect_uris[0]!,
      scope: 'openid email',
      code_challenge: await client.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
    });
    const tokens = await client.authorizationCodeGrant(jwtConfig, new URL(await upstream.signIn(authorize, 'alice')), { pkceCodeVerifier: verifier });
    const raw = await fetch(jwtConfig.serverMetadata().userinfo_endpoint!, { headers: { authorization: `Bearer ${tokens.access_token}` } });
    expect(raw.headers.get('content-type')).toBe('application/jwt; charset=utf-8');
    expect((await raw.text()).split('.')).toHaveLength(3);
    expect(await client.fetchUserInfo(jwtConfig, tokens.access_token, 'alice-sub')).toMatchObject({ iss: upstream.issuer, aud: 'jwt-userinfo', sub: 'alice-sub', email: 'alice@corp.example', email_verified: true });
  });

  it('can have no UserInfo endpoint, or advertise one elsewhere', async () => {
    const [none, elsewhere] = await Promise.all([startUpstreamOidc({ userinfoEndpoint: null }), startUpstreamOidc({ userinfoEndpoint: 'http://169.254.169.254/userinfo' })]);
    try {
      const metadata = async (issuer: string) => (await client.discovery(new URL(issuer), 'x', 'y', undefined, { execute: [client.allowInsecureRequests] })).serverMetadata();
      expect(await metadata(none.issuer)).not.toHaveProperty('userinfo_endpoint');
      expect((await metadata(elsewhere.issuer)).userinfo_endpoint).toBe('http://169.254.169.254/userinfo');
    } finally {
      await Promise.all([none.close(), elsewhere.close()]);
    }
  });

  it('redirects with access_denied when the user cancels', async () => {
    const { url, state } = await authorizationRequest();
    const callback = new URL(await upstream.denySignIn(url));
    expect(callback.searchParams.get('error')).toBe('access_denied');
    expect(callback.searchParams.get('state')).toBe(state);
  });
});
