/**
 * A person at orgauth's pages over real HTTP: sent to sign in by an authorization request, signs
 * in (email first, then the password), lands on the consent page, chooses an organization and
 * approves. What a browser does, without one.
 */
import { expect } from 'vitest';
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
