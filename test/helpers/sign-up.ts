/**
 * Sign-up as a person does it: the form, the mail, the link, the password again (src/accounts/sign-ups.ts).
 * The mail is read from a TestSmtpServer (test/helpers/smtp.ts) the app sends to.
 */
import type { LightMyRequestResponse } from 'fastify';
import { expect } from 'vitest';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { linkIn, type ReceivedMail, type TestSmtpServer } from './smtp.js';

export const SIGN_UP_SUBJECT = 'Finish creating your account';
export const SIGN_UP_TAKEN_SUBJECT = 'Someone tried to sign up with your email address';

export interface SignUpFields {
  email: string;
  password: string;
  name?: string;
  organization_name: string;
  return_to?: string;
}

/** Posts the sign-up form (fetching its CSRF token first). */
export async function postSignUp(browser: Browser, fields: SignUpFields): Promise<LightMyRequestResponse> {
  const csrf_token = await browser.csrf(fields.return_to === undefined ? '/signup' : `/signup?${new URLSearchParams({ return_to: fields.return_to })}`);
  return browser.post('/signup', { csrf_token, ...fields });
}

/** The next message to `to` with `subject`, after the `seen` such messages already there. */
export async function nextMail(smtp: TestSmtpServer, to: string, subject: string, seen: number): Promise<ReceivedMail> {
  await expect.poll(() => smtp.to(to).filter((m) => m.subject === subject).length, { timeout: 15_000 }).toBeGreaterThan(seen);
  return smtp.to(to).filter((m) => m.subject === subject)[seen]!;
}

/** The path and query of the sign-up link in `mail`. */
export function signUpPath(mail: ReceivedMail): string {
  const link = new URL(linkIn(mail, `${new URL(mail.links[0]!).origin}/signup/confirm?token=`));
  return `${link.pathname}${link.search}`;
}

/** Opens a sign-up link and submits its form with `password`. */
export async function confirmSignUp(browser: Browser, path: string, password: string): Promise<LightMyRequestResponse> {
  const page = await browser.get(path);
  expect(page.statusCode, page.body).toBe(200);
  const token = /name="token" value="([^"]+)"/.exec(page.body)![1]!;
  return browser.post('/signup/confirm', { csrf_token: csrfTokenIn(page.body), token, password });
}

/**
 * Signs up and follows the mailed link in the same browser: the answer of the link's form (a
 * 303 to `return_to`, signed in, when it worked).
 */
export async function signUpThroughMail(browser: Browser, smtp: TestSmtpServer, fields: SignUpFields): Promise<LightMyRequestResponse> {
  const seen = smtp.to(fields.email).filter((m) => m.subject === SIGN_UP_SUBJECT).length;
  const asked = await postSignUp(browser, fields);
  expect(asked.statusCode, asked.body).toBe(200);
  const mail = await nextMail(smtp, fields.email, SIGN_UP_SUBJECT, seen);
  return confirmSignUp(browser, signUpPath(mail), fields.password);
}
