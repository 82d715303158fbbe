/** The GitHub stand-in answers a plain HTTP client the way GitHub's documented web flow and REST API do. */
import { createHash, randomBytes } from 'node:crypto';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { type GitHubServer, type GitHubUser, startGitHubServer } from './github-server.js';

const CLIENT = { clientId: 'Iv1.0123456789abcdef', clientSecret: 'client-secret-0123456789', callbackUrl: 'http://127.0.0.1:4000/sso/social/7/callback' };

const octocat: GitHubUser = {
  id: 583231,
  login: 'octocat',
  name: 'The Octocat',
  publicEmail: 'octocat@github.example',
  emails: [
    { email: 'octocat@github.example', primary: true, verified: true },
    { email: 'octo@unverified.example', primary: false, verified: false },
    { email: 'octo@secondary.example', primary: false, verified: true },
  ],
};

let github: GitHubServer;

beforeAll(async () => {
  github = await startGitHubServer();
  github.register(CLIENT);
  github.signInAs(octocat);
});
afterAll(() => github.close());
afterEach(() => vi.useRealTimers());

function authorizeUrl(params: Record<string, string>): string {
  return `${github.baseUrl}/login/oauth/authorize?${new URLSearchParams({ client_id: CLIENT.clientId, redirect_uri: CLIENT.callbackUrl, ...params })}`;
}

/** The authorize request as a browser makes it; the redirect it answers with, not followed. */
async function authorize(params: Record<string, string> = {}): Promise<{ status: number; location: URL | undefined; body: string }> {
  const response = await fetch(authorizeUrl({ scope: 'read:user user:email', state: 'st-1', ...params }), { redirect: 'manual' });
  const location = response.headers.get('location');
  return { status: response.status, location: location === null ? undefined : new URL(location), body: await response.text() };
}

async function codeFor(params: Record<string, string> = {}): Promise<string> {
  const { status, location } = await authorize(params);
  expect(status).toBe(302);
  return location!.searchParams.get('code')!;
}

async function exchange(fields: Record<string, string>, headers: Record<string, string> = { accept: 'application/json' }): Promise<Response> {
  return fetch(`${github.baseUrl}/login/oauth/access_token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams(fields).toString(),
  });
}

async function tokenFor(scope = 'read:user user:email'): Promise<string> {
  const code = await codeFor({ scope });
  const body = (await (await exchange({ client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code })).json()) as { access_token: string };
  return body.access_token;
}

const api = (path: string, authorization?: string) => fetch(`${github.apiUrl}${path}`, { headers: authorization ? { authorization } : {} });

describe('test GitHub server', () => {
  it('listens on loopback with an ephemeral port and a GHES layout', () => {
    expect(github.baseUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(github.apiUrl).toBe(`${github.baseUrl}/api/v3`);
  });

  describe('web flow', () => {
    it('redirects at once to the redirect_uri with a code and the state, and records the request', async () => {
      const before = github.authorizeRequests.length;
      const { status, location } = await authorize({ state: 'xyz 1/2' });
      expect(status).toBe(302);
      expect(`${location!.origin}${location!.pathname}`).toBe(CLIENT.callbackUrl);
      expect(location!.searchParams.get('code')).toMatch(/^[0-9a-f]{20}$/);
      expect(location!.searchParams.get('state')).toBe('xyz 1/2');
      expect(github.authorizeRequests.slice(before)).toEqual([{ client_id: CLIENT.clientId, redirect_uri: CLIENT.callbackUrl, scope: 'read:user user:email', state: 'xyz 1/2' }]);
    });

    it('exchanges a code for a token, answering JSON with Accept: application/json', async () => {
      const code = await codeFor();
      const response = await exchange({ client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code, redirect_uri: CLIENT.callbackUrl });
      expect(response.status).toBe(200);
      expect(response.headers.get('content-type')).toMatch(/^application\/json/);
      const body = (await response.json()) as Record<string, unknown>;
      expect(body).toEqual({ access_token: expect.stringMatching(/^gho_[A-Za-z0-9]{36}$/), token_type: 'bearer', scope: 'read:user,user:email' });
    });

    it('answers form-encoded without Accept: application/json', async () => {
      const code = await codeFor();
      const response = await exchange({ client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code }, {});
      expect(response.headers.get('content-type')).toMatch(/^application\/x-www-form-urlencoded/);
      const body = new URLSearchParams(await response.text());
      expect(body.get('access_token')).toMatch(/^gho_[A-Za-z0-9]{36}$/);
      expect(body.get('token_type')).toBe('bearer');
      expect(body.get('scope')).toBe('read:user,user:email');
    });

    it('takes the client by HTTP Basic', async () => {
      const code = await codeFor();
      const basic = Buffer.from(`${CLIENT.clientId}:${CLIENT.clientSecret}`).toString('base64');
      const body = (await (await exchange({ code }, { accept: 'application/json', authorization: `Basic ${basic}` })).json()) as Record<string, unknown>;
      expect(body.access_token).toMatch(/^gho_/);
    });

    it('takes a code once only', async () => {
      const code = await codeFor();
      const fields = { client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code };
      expect(((await (await exchange(fields)).json()) as Record<string, unknown>).access_token).toBeTypeOf('string');
      const again = await exchange(fields);
      expect(again.status).toBe(200);
      expect(await again.json()).toEqual({
        error: 'bad_verification_code',
        error_description: 'The code passed is incorrect or expired.',
        error_uri: expect.stringContaining('#bad-verification-code'),
      });
    });

    it('refuses a code after 10 minutes', async () => {
      const code = await codeFor();
      vi.useFakeTimers({ toFake: ['Date'] });
      vi.setSystemTime(Date.now() + 10 * 60 * 1000 + 1);
      const body = (await (await exchange({ client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code })).json()) as Record<string, unknown>;
      expect(body.error).toBe('bad_verification_code');
    });

    it('refuses a wrong secret with GitHub\'s error shape, in both formats', async () => {
      const code = await codeFor();
      const response = await exchange({ client_id: CLIENT.clientId, client_secret: 'wrong', code });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual({
        error: 'incorrect_client_credentials',
        error_description: 'The client_id and/or client_secret passed are incorrect.',
        error_uri: expect.stringContaining('#incorrect-client-credentials'),
      });
      const form = new URLSearchParams(await (await exchange({ client_id: 'unknown', client_secret: CLIENT.clientSecret, code }, {})).text());
      expect(form.get('error')).toBe('incorrect_client_credentials');
      expect(form.get('error_description')).toBe('The client_id and/or client_secret passed are incorrect.');
    });

    it('refuses a redirect_uri at the exchange other than the one the code was issued for', async () => {
      const code = await codeFor();
      const body = (await (await exchange({ client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code, redirect_uri: `${CLIENT.callbackUrl}/other` })).json()) as Record<string, unknown>;
      expect(body).toMatchObject({ error: 'redirect_uri_mismatch', error_description: 'The redirect_uri MUST match the registered callback URL for this application.' });
    });

    it('checks PKCE (S256) when the authorize request had a challenge', async () => {
      const verifier = randomBytes(32).toString('base64url');
      const challenge = createHash('sha256').update(verifier).digest('base64url');
      const fields = { client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret };
      const wrong = await codeFor({ code_challenge: challenge, code_challenge_method: 'S256' });
      expect(((await (await exchange({ ...fields, code: wrong, code_verifier: 'not-it' })).json()) as Record<string, unknown>).error).toBe('bad_verification_code');
      const right = await codeFor({ code_challenge: challenge, code_challenge_method: 'S256' });
      expect(((await (await exchange({ ...fields, code: right, code_verifier: verifier })).json()) as Record<string, unknown>).access_token).toMatch(/^gho_/);
      expect(github.tokenRequests.at(-1)).toMatchObject({ code_verifier: verifier });
    });

    it('redirects with access_denied and the state after denyNext, once', async () => {
      github.denyNext();
      const denied = await authorize({ state: 'st-deny' });
      expect(denied.status).toBe(302);
      expect(`${denied.location!.origin}${denied.location!.pathname}`).toBe(CLIENT.callbackUrl);
      expect(Object.fromEntries(denied.location!.searchParams)).toEqual({
        error: 'access_denied',
        error_description: 'The user has denied your application access.',
        error_uri: expect.stringContaining('#access-denied'),
        state: 'st-deny',
      });
      expect((await authorize()).location!.searchParams.get('code')).toBeTruthy();
    });

    it('refuses a redirect_uri outside the registered callback with a 400 page, and takes one below it', async () => {
      for (const redirectUri of ['http://127.0.0.1:4000/sso/social/8/callback', 'http://127.0.0.1:4001/sso/social/7/callback', 'https://127.0.0.1:4000/sso/social/7/callback', 'http://localhost:4000/sso/social/7/callback', 'http://127.0.0.1:4000/sso/social/7/callbackx']) {
        const { status, location, body } = await authorize({ redirect_uri: redirectUri });
        expect({ redirectUri, status, location }).toEqual({ redirectUri, status: 400, location: undefined });
        expect(body).toContain('redirect_uri mismatch');
      }
      const below = await authorize({ redirect_uri: `${CLIENT.callbackUrl}/more?x=1` });
      expect(below.status).toBe(302);
      expect(below.location!.pathname).toBe('/sso/social/7/callback/more');
      expect(below.location!.searchParams.get('x')).toBe('1');
    });

    it('answers 404 to an unknown client_id', async () => {
      const { status, location } = await authorize({ client_id: 'nobody' });
      expect(status).toBe(404);
      expect(location).toBeUndefined();
    });
  });

  describe('REST API', () => {
    it('GET /user answers the user, for Bearer and token schemes', async () => {
      const token = await tokenFor();
      for (const authorization of [`Bearer ${token}`, `token ${token}`]) {
        const response = await api('/user', authorization);
        expect(response.status).toBe(200);
        expect(response.headers.get('x-oauth-scopes')).toBe('read:user, user:email');
        expect(await response.json()).toMatchObject({
          id: 583231,
          login: 'octocat',
          node_id: expect.any(String),
          name: 'The Octocat',
          email: 'octocat@github.example',
          avatar_url: expect.stringContaining(github.baseUrl),
          html_url: `${github.baseUrl}/octocat`,
          url: `${github.apiUrl}/users/octocat`,
          type: 'User',
          site_admin: false,
        });
      }
      expect(github.requests.at(-1)).toEqual({ method: 'GET', path: '/api/v3/user', authorization: `token ${token}` });
    });

    it('GET /user/emails lists every address, unverified and secondary ones included', async () => {
      const response = await api('/user/emails', `Bearer ${await tokenFor()}`);
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual([
        { email: 'octocat@github.example', primary: true, verified: true, visibility: 'public' },
        { email: 'octo@unverified.example', primary: false, verified: false, visibility: null },
        { email: 'octo@secondary.example', primary: false, verified: true, visibility: null },
      ]);
    });

    it('GET /user/emails needs the user or user:email scope', async () => {
      const without = await api('/user/emails', `Bearer ${await tokenFor('read:user')}`);
      expect(without.status).toBe(404);
      expect(await without.json()).toMatchObject({ message: 'Not Found' });
      expect((await api('/user/emails', `Bearer ${await tokenFor('user')}`)).status).toBe(200);
      // /user itself needs no scope.
      expect((await api('/user', `Bearer ${await tokenFor('')}`)).status).toBe(200);
    });

    it('answers 401 Bad credentials to an unknown token, and Requires authentication without one', async () => {
      for (const path of ['/user', '/user/emails']) {
        const bad = await api(path, 'Bearer gho_000000000000000000000000000000000000');
        expect(bad.status).toBe(401);
        expect(await bad.json()).toMatchObject({ message: 'Bad credentials', documentation_url: expect.stringMatching(/^https:\/\/docs\.github\.com\//) });
        const none = await api(path);
        expect(none.status).toBe(401);
        expect(await none.json()).toMatchObject({ message: 'Requires authentication' });
      }
    });

    it('serves the user as signInAs last described them, for tokens already issued', async () => {
      const token = await tokenFor();
      github.signInAs({ ...octocat, name: null, publicEmail: null });
      try {
        expect(await (await api('/user', `Bearer ${token}`)).json()).toMatchObject({ id: 583231, name: null, email: null });
      } finally {
        github.signInAs(octocat);
      }
    });
  });

  describe('knobs', () => {
    it('slow() holds the next answer back, once', async () => {
      const token = await tokenFor();
      github.slow(400, 'user');
      const started = performance.now();
      await expect(fetch(`${github.apiUrl}/user`, { headers: { authorization: `Bearer ${token}` }, signal: AbortSignal.timeout(100) })).rejects.toMatchObject({ name: 'TimeoutError' });
      expect(performance.now() - started).toBeLessThan(400);
      const next = performance.now();
      expect((await api('/user', `Bearer ${token}`)).status).toBe(200);
      expect(performance.now() - next).toBeLessThan(300);
    });

    it('slow() without an endpoint delays every endpoint\'s next answer', async () => {
      github.slow(250);
      const started = performance.now();
      const { status } = await authorize();
      expect(status).toBe(302);
      expect(performance.now() - started).toBeGreaterThanOrEqual(240);
      // The other endpoints are still held back once each.
      const code = await codeFor();
      const tokenStarted = performance.now();
      await exchange({ client_id: CLIENT.clientId, client_secret: CLIENT.clientSecret, code });
      expect(performance.now() - tokenStarted).toBeGreaterThanOrEqual(240);
      github.slow(0);
    });

    it('huge() pads the next /user answer to the size asked, as valid JSON', async () => {
      const token = await tokenFor();
      github.huge(300_000);
      const text = await (await api('/user', `Bearer ${token}`)).text();
      expect(Buffer.byteLength(text)).toBe(300_000);
      expect(JSON.parse(text)).toMatchObject({ id: 583231, login: 'octocat' });
      expect((await (await api('/user', `Bearer ${token}`)).text()).length).toBeLessThan(5000);
    });
  });
});
