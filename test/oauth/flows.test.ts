/**
 * Whole flows driven by oauth4webapi, a strict, spec-following OAuth client, against the built
 * server started as `npm start` starts it (defaults, a fresh embedded database, the demo data
 * it prints): discovery, authorization code with and without PKCE through the real login and
 * consent pages, both client authentication methods, refresh rotation, introspection,
 * revocation, client_credentials.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as oauth from 'oauth4webapi';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort, type Running, SERVER, start } from '../helpers/process.js';

const dataDir = mkdtempSync(path.join(tmpdir(), 'orgauth-flows-'));
let server: Running;
let issuer: URL;
let as: oauth.AuthorizationServer;
const demo = { email: '', password: '', publicId: '', publicSecret: '', privateId: '', privateSecret: '', orgId: 0 };
const REDIRECT = 'http://localhost:8080/callback';
const insecure = { [oauth.allowInsecureRequests]: true };

beforeAll(async () => {
  const port = await freePort();
  server = start(SERVER, [], { DATA_DIR: dataDir, PORT: String(port) });
  await server.waitForOutput(/curl -s -u[\s\S]*orgauth is ready/);
  const out = server.output.stdout;
  const grab = (re: RegExp) => re.exec(out)?.[1] ?? '';
  demo.email = grab(/email: +(\S+)/);
  demo.password = grab(/password: +(\S+)/);
  demo.publicId = grab(/Public application[\s\S]*?client_id: +(\S+)/);
  demo.publicSecret = grab(/Public application[\s\S]*?client_secret: +(\S+)/);
  demo.privateId = grab(/Private application[\s\S]*?client_id: +(\S+)/);
  demo.privateSecret = grab(/Private application[\s\S]*?client_secret: +(\S+)/);
  demo.orgId = Number(grab(/organization_id (\d+)/));
  issuer = new URL(`http://localhost:${port}`);
  as = await oauth.processDiscoveryResponse(issuer, await oauth.discoveryRequest(issuer, { algorithm: 'oauth2', ...insecure }));
}, 60_000);

afterAll(async () => {
  server.child.kill('SIGTERM');
  await server.exited;
  rmSync(dataDir, { recursive: true, force: true });
});

/** A user agent with a cookie jar, following nothing by itself. */
class UserAgent {
  private jar = new Map<string, string>();
  async fetch(url: string | URL, init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    if (this.jar.size > 0) headers.set('cookie', [...this.jar].map(([k, v]) => `${k}=${v}`).join('; '));
    const res = await fetch(new URL(url, issuer), { ...init, headers, redirect: 'manual' });
    for (const cookie of res.headers.getSetCookie()) {
      const [pair] = cookie.split(';');
      const eq = pair!.indexOf('=');
      const name = pair!.slice(0, eq);
      const value = pair!.slice(eq + 1);
      if (value === '' || /max-age=0/i.test(cookie)) this.jar.delete(name);
      else this.jar.set(name, value);
    }
    return res;
  }
  async postForm(url: string, fields: Record<string, string>): Promise<Response> {
    return this.fetch(url, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: new URLSearchParams(fields) });
  }
}

const csrfIn = (html: string) => /name="csrf_token" value="([^"]+)"/.exec(html)?.[1] ?? '';
const hiddenIn = (html: string) =>
  Object.fromEntries([...html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)"/g)].map((m) => [m[1]!, decodeHtml(m[2]!)]));
const decodeHtml = (s: string) => s.replace(/&#39;/g, "'").replace(/&quot;/g, '"').replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');

/** Sends the user through /oauth/authorize, sign-in and consent; returns the redirect back to the client. */
async function authorize(params: Record<string, string>): Promise<URL> {
  const ua = new UserAgent();
  const url = new URL(as.authorization_endpoint!);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);

  let res = await ua.fetch(url);
  expect(res.status).toBe(303);
  const loginUrl = res.headers.get('location')!;
  expect(loginUrl).toMatch(/^\/login\?return_to=/);
  const loginPage = await (await ua.fetch(loginUrl)).text();
  res = await ua.postForm('/login', {
    email: demo.email,
    password: demo.password,
    csrf_token: csrfIn(loginPage),
    return_to: new URL(loginUrl, issuer).searchParams.get('return_to')!,
  });
  expect(res.status).toBe(303);
  res = await ua.fetch(res.headers.get('location')!);
  expect(res.status).toBe(200);
  const consent = await res.text();
  expect(consent).toContain('Demo Public App');
  res = await ua.postForm('/oauth/authorize', { ...hiddenIn(consent), organization_id: String(demo.orgId), decision: 'approve' });
  expect(res.status).toBe(303);
  return new URL(res.headers.get('location')!);
}

describe('an oauth4webapi client against `npm start` defaults', () => {
  it('discovers the server (RFC 8414)', () => {
    expect(as.issuer).toBe(issuer.href.replace(/\/$/, ''));
    expect(as.code_challenge_methods_supported).toEqual(['S256']);
    expect(as.authorization_response_iss_parameter_supported).toBe(true);
  });

  it('authorization code with PKCE → refresh → introspect → revoke', async () => {
    const client: oauth.Client = { client_id: demo.publicId };
    const verifier = oauth.generateRandomCodeVerifier();
    const state = oauth.generateRandomState();
    const callback = await authorize({
      client_id: demo.publicId,
      redirect_uri: REDIRECT,
      response_type: 'code',
      scope: 'contacts.read tasks.read',
      state,
      code_challenge: await oauth.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
    });
    expect(callback.origin + callback.pathname).toBe(REDIRECT);
    // validateAuthResponse checks state and, as the metadata promises it, iss (RFC 9207).
    const params = oauth.validateAuthResponse(as, client, callback, state);
    const basic = oauth.ClientSecretBasic(demo.publicSecret);
    const tokens = await oauth.processAuthorizationCodeResponse(
      as, client, await oauth.authorizationCodeGrantRequest(as, client, basic, params, REDIRECT, verifier, insecure),
    );
    expect(tokens).toMatchObject({ token_type: 'bearer', scope: 'contacts.read tasks.read', organization_id: demo.orgId, organization_name: 'Demo Organization' });
    expect(tokens.refresh_token).toBeDefined();

    const post = oauth.ClientSecretPost(demo.publicSecret);
    const refreshed = await oauth.processRefreshTokenResponse(
      as, client, await oauth.refreshTokenGrantRequest(as, client, post, tokens.refresh_token!, insecure),
    );
    expect(refreshed.refresh_token).not.toBe(tokens.refresh_token);
    expect(refreshed).toMatchObject({ organization_id: demo.orgId, organization_name: 'Demo Organization' });

    const introspected = await oauth.processIntrospectionResponse(as, client, await oauth.introspectionRequest(as, client, basic, refreshed.access_token, insecure));
    expect(introspected).toMatchObject({ active: true, client_id: demo.publicId, organization_id: demo.orgId, scope: 'contacts.read tasks.read' });

    await oauth.processRevocationResponse(await oauth.revocationRequest(as, client, basic, refreshed.refresh_token!, insecure));
    const after = await oauth.processIntrospectionResponse(as, client, await oauth.introspectionRequest(as, client, basic, refreshed.access_token, insecure));
    expect(after).toEqual({ active: false });
  });

  it('authorization code without PKCE, client_secret_post', async () => {
    const client: oauth.Client = { client_id: demo.publicId };
    const state = oauth.generateRandomState();
    const callback = await authorize({ client_id: demo.publicId, redirect_uri: REDIRECT, response_type: 'code', scope: 'contacts.read', state });
    const params = oauth.validateAuthResponse(as, client, callback, state);
    const tokens = await oauth.processAuthorizationCodeResponse(
      as, client, await oauth.authorizationCodeGrantRequest(as, client, oauth.ClientSecretPost(demo.publicSecret), params, REDIRECT, oauth.nopkce, insecure),
    );
    expect(tokens).toMatchObject({ scope: 'contacts.read', organization_id: demo.orgId });
  });

  it('client_credentials for the private application', async () => {
    const client: oauth.Client = { client_id: demo.privateId };
    const response = await oauth.processClientCredentialsResponse(
      as,
      client,
      await oauth.clientCredentialsGrantRequest(as, client, oauth.ClientSecretBasic(demo.privateSecret), { scope: 'contacts.read', organization_id: String(demo.orgId) }, insecure),
    );
    expect(response).toMatchObject({ token_type: 'bearer', scope: 'contacts.read', organization_id: demo.orgId, organization_name: 'Demo Organization' });
    expect(response.refresh_token).toBeUndefined();
  });

  it('sees an authorization error with state and iss when the user denies', async () => {
    const ua = new UserAgent();
    const state = oauth.generateRandomState();
    const url = new URL(as.authorization_endpoint!);
    for (const [k, v] of Object.entries({ client_id: demo.publicId, redirect_uri: REDIRECT, response_type: 'code', scope: 'tasks.read', state })) url.searchParams.set(k, v);
    const loginUrl = (await ua.fetch(url)).headers.get('location')!;
    const page = await (await ua.fetch(loginUrl)).text();
    const back = await ua.postForm('/login', { email: demo.email, password: demo.password, csrf_token: csrfIn(page), return_to: new URL(loginUrl, issuer).searchParams.get('return_to')! });
    const consent = await (await ua.fetch(back.headers.get('location')!)).text();
    const denied = await ua.postForm('/oauth/authorize', { ...hiddenIn(consent), organization_id: String(demo.orgId), decision: 'deny' });
    const client: oauth.Client = { client_id: demo.publicId };
    expect(() => oauth.validateAuthResponse(as, client, new URL(denied.headers.get('location')!), state)).toThrow(
      expect.objectContaining({ error: 'access_denied' }),
    );
  });
});
