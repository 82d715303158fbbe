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

  it('signs a user in and issues an ID token with sub, email, email_verified, name, amr and nonce', async () => {
    const { url, verifier, state, nonce } = await authorizationRequest();
    const callback = new URL(await upstream.signIn(url, 'alice'));
    expect(callback.origin + callback.pathname).toBe(CLIENT.redirect_uris[0]);
    expect(callback.searchParams.get('state')).toBe(state);
    expect(callback.searchParams.get('iss')).toBe(upstream.issuer);
    expect(callback.searchParams.get('code')).toBeTruthy();

    const tokens = await client.authorizationCodeGrant(config, callback, { pkceCodeVerifier: verifier, expectedState: state, expectedNonce: nonce, idTokenExpected: true });
    const claims = tokens.claims();
    expect(claims).toMatchObject({
      iss: upstream.issuer,
      aud: CLIENT.client_id,
      sub: 'alice-sub',
      email: 'alice@corp.example',
      email_verified: true,
      name: 'Alice',
      amr: ['pwd', 'mfa'],
      nonce,
    });
  });

  it('takes an amr per sign-in and accounts added after start', async () => {
    upstream.setAccount('bob', { sub: 'bob-sub', email: 'bob@corp.example', email_verified: false });
    const { url, verifier, state, nonce } = await authorizationRequest();
    const callback = new URL(await upstream.signIn(url, 'bob', { amr: ['pwd'] }));
    const tokens = await client.authorizationCodeGrant(config, callback, { pkceCodeVerifier: verifier, expectedState: state, expectedNonce: nonce });
    expect(tokens.claims()).toMatchObject({ sub: 'bob-sub', email: 'bob@corp.example', email_verified: false, amr: ['pwd'] });
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
    expect(tokens.claims()).toMatchObject({ aud: 'second', sub: 'alice-sub', email: 'alice@corp.example' });
    expect(tokens.claims()).not.toHaveProperty('name');
  });

  it('requires PKCE, also of a confidential client', async () => {
    const url = client.buildAuthorizationUrl(config, { redirect_uri: CLIENT.redirect_uris[0]!, scope: 'openid', state: 'pkce-less' });
    const callback = new URL(await upstream.signIn(url, 'alice'));
    expect(callback.searchParams.get('error')).toBe('invalid_request');
    expect(callback.searchParams.get('error_description')).toMatch(/PKCE/);
  });

  it('redirects with access_denied when the user cancels', async () => {
    const { url, state } = await authorizationRequest();
    const callback = new URL(await upstream.denySignIn(url));
    expect(callback.searchParams.get('error')).toBe('access_denied');
    expect(callback.searchParams.get('state')).toBe(state);
  });
});
