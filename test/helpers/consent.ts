/**
 * A person at orgauth's pages over real HTTP: sent to sign in by an authorization request, signs
 * in (email first, then the password), lands on the consent page, chooses an organization and
 * approves. What a browser does, without one.
 */
import { createHash, randomBytes } from 'node:crypto';
import { expect } from 'vitest';
import { basic, form } from './oauth.js';
import { csrfIn, hiddenIn, UserAgent } from './instances.js';

export interface Signer {
  issuer: string;
  email: string;
  password: string;
}

/** Follows `authorizationUrl` through sign-in; returns the browser (signed in) and the page the request then shows (the consent page, usually). */
export async function signInFor(authorizationUrl: URL | string, who: Signer): Promise<{ browser: UserAgent; page: Response }> {
  const browser = new UserAgent();
  const orgauth = { url: who.issuer };
  let res = await browser.fetch(orgauth, String(authorizationUrl));
  expect(res.status, await res.clone().text()).toBe(303);
  const loginUrl = res.headers.get('location')!;
  expect(loginUrl).toMatch(/^\/login\?return_to=/);
  const returnTo = new URL(loginUrl, who.issuer).searchParams.get('return_to')!;
  const emailStep = await (await browser.fetch(orgauth, loginUrl)).text();
  res = await browser.postForm(orgauth, '/login', { email: who.email, csrf_token: csrfIn(emailStep), return_to: returnTo });
  const passwordStep = await res.text();
  res = await browser.postForm(orgauth, '/login', { email: who.email, password: who.password, csrf_token: csrfIn(passwordStep), return_to: returnTo });
  expect(res.status).toBe(303);
  return { browser, page: await browser.fetch(orgauth, res.headers.get('location')!) };
}

/** Posts the consent form of `consentHtml` with `organizationId` and Allow; returns where orgauth sent the browser (the client's callback). */
export async function approveConsent(browser: UserAgent, issuer: string, consentHtml: string, organizationId: number): Promise<URL> {
  const res = await browser.postForm({ url: issuer }, '/oauth/authorize', { ...hiddenIn(consentHtml), organization_id: String(organizationId), decision: 'approve' });
  expect(res.status).toBe(303);
  return new URL(res.headers.get('location')!);
}

/**
 * A user's tokens by the real flow: an authorization request (PKCE, prompt=consent), sign-in,
 * consent for `organizationId`, the code redeemed with the application's secret (Basic) — for
 * `resource` when one is named (RFC 8707).
 */
export async function userTokens(
  world: { issuer: string },
  application: { client_id: string; client_secret: string; redirect_uri: string },
  who: { email: string; password: string; organizationId: number },
  request: { scope: string; resource?: string | undefined },
): Promise<{ access_token: string; refresh_token: string }> {
  const verifier = randomBytes(32).toString('base64url');
  const url = new URL('/oauth/authorize', world.issuer);
  const params = {
    client_id: application.client_id,
    redirect_uri: application.redirect_uri,
    response_type: 'code',
    scope: request.scope,
    state: randomBytes(8).toString('hex'),
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
    prompt: 'consent',
    ...(request.resource ? { resource: request.resource } : {}),
  };
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  const { browser, page } = await signInFor(url, { issuer: world.issuer, email: who.email, password: who.password });
  const consent = await page.text();
  expect(page.status, consent).toBe(200);
  const code = (await approveConsent(browser, world.issuer, consent, who.organizationId)).searchParams.get('code');
  if (!code) throw new Error('no code');
  const res = await fetch(`${world.issuer}/oauth/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(application.client_id, application.client_secret) },
    body: form({ grant_type: 'authorization_code', code, redirect_uri: application.redirect_uri, code_verifier: verifier, ...(request.resource ? { resource: request.resource } : {}) }),
  });
  const body = (await res.json()) as { access_token: string; refresh_token: string };
  expect(res.status, JSON.stringify(body)).toBe(200);
  return body;
}
