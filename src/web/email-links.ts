/**
 * The pages that links in emails open, and the forgot-password page:
 *
 * - GET/POST /forgot-password: one answer whatever the address (the work happens after it).
 * - GET/POST /reset-password?token=…: the new-password form; the POST uses the link.
 * - GET/POST /verify-email?token=…: a button that confirms the address. Opening a link never
 *   uses it: mail scanners that fetch every link in a message must not spend single-use links.
 * - GET/POST /signup/confirm?token=…: a sign-up's link; the form asks for the password chosen at
 *   sign-up, then creates the account and its organization and signs in (accounts/sign-ups.ts).
 * - GET /invitation?token=…, POST /invitation/accept, POST /invitation/signup.
 *
 * Forms before sign-in carry the pre-session CSRF token (sessions.ts), so no other site can
 * post a stranger's link from a victim's browser to sign them in to the stranger's account.
 * Tokens in URLs are masked in the logs (logger.ts), and pages send no Referer (render.ts).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import { selectOrganization } from '../accounts/current-organization.js';
import type { DB } from '../db/connect.js';
import { ConflictError, ForbiddenError } from '../errors.js';
import type { BackgroundTasks } from '../lib/background.js';
import { FailureThrottle } from '../lib/throttle.js';
import type { MailOutbox } from '../mail/outbox.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { readParams } from '../oauth/helpers/params.js';
import { renderPage } from './render.js';
import { beginSession } from './begin-session.js';
import { findAccountToken } from '../accounts/account-tokens.js';
import { acceptInvitation, findOpenInvitation, InvitationUnavailableError, sameAddress, signUpFromInvitation } from '../accounts/invitations.js';
import { requestPasswordReset, resetPassword } from '../accounts/password-reset.js';
import { findSsoRoute } from '../sso/domains.js';
import { hashPassword, PASSWORD_MAX_LENGTH, PASSWORD_MIN_LENGTH } from '../accounts/passwords.js';
import { CSRF_FAILED, csrfToken, csrfTokenMatches, currentUser, checkPreSessionCsrf, ensurePreSession } from '../accounts/sessions.js';
import { emailSchema, findUserByEmail } from '../accounts/users.js';
import { confirmEmail } from '../accounts/verification.js';
import { completeSignUp, findPendingSignUp, SIGN_UP_TTL_S } from '../accounts/sign-ups.js';

const HOUR_MS = 3600_000;
/** Reset requests per address an hour (whether or not it has an account), and per client IP in 15 minutes. */
export const RESET_REQUESTS_PER_ADDRESS = 5;
export const RESET_REQUESTS_PER_IP = 20;
/** Invalid links per client IP in 15 minutes before the link pages refuse it for a while. */
export const BAD_LINKS_PER_IP = 30;

const BAD_RESET_LINK = 'This password reset link is not valid: it has expired (links work for 30 minutes), has been used, or a newer one was sent. Ask for a new link.';
const BAD_SIGN_UP_LINK = `This link to finish creating an account is not valid: it has expired (links work for ${SIGN_UP_TTL_S / 60} minutes), has been used, or a newer one was sent. Sign up again.`;
const SSO_REQUIRED_SIGN_UP = 'Your organization signs you in through its identity provider, so no password account can be made for this address. On the sign-in page, enter your email and choose Continue.';
const BAD_VERIFY_LINK = 'This confirmation link is not valid: it has expired, has been used, or a newer one was sent. Sign in and ask for a new link on the Account page.';

export interface EmailPagesDeps {
  db: DB;
  config: Config;
  mail: MailOutbox;
  background: BackgroundTasks;
}

function queryToken(req: FastifyRequest): string | undefined {
  const value = (req.query as Record<string, unknown> | undefined)?.token;
  return typeof value === 'string' ? value : undefined;
}

export async function emailLinkPages(app: FastifyInstance, { db, config, mail, background }: EmailPagesDeps): Promise<void> {
  const mailDeps = { mail, issuer: config.issuer };
  const addressThrottle = new FailureThrottle(RESET_REQUESTS_PER_ADDRESS, HOUR_MS);
  const ipThrottle = new FailureThrottle(RESET_REQUESTS_PER_IP, 15 * 60_000);
  const badLinks = new FailureThrottle(BAD_LINKS_PER_IP, 15 * 60_000);

  const preCsrf = (req: FastifyRequest, reply: FastifyReply) => csrfToken(config, { preSession: ensurePreSession(req, reply, config) });
  /** A link that did not work: counted per IP, so guessing (hopeless at 256 bits) is also slow. */
  function badLink(req: FastifyRequest, reply: FastifyReply, message: string, status = 404) {
    badLinks.recordFailure(req.ip);
    return renderPage(reply, status, 'error', { title: 'This link does not work', message });
  }
  function refuseLinkGuessing(req: FastifyRequest): void {
    const wait = badLinks.retryAfter(req.ip);
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many links that do not work were tried from here. Please wait and try again later.');
  }

  /** A form posted from a link's page before sign-in: the bad-link throttle, the pre-session CSRF token, then its fields. */
  function readLinkForm(req: FastifyRequest): { token: string; password: string; form: ReturnType<typeof readParams> } {
    refuseLinkGuessing(req);
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    return { token: form.token ?? '', password: form.password ?? '', form };
  }
  /** The same, posted by a signed-in user: their session's CSRF token instead. */
  async function readSignedInLinkForm(req: FastifyRequest) {
    refuseLinkGuessing(req);
    const form = readParams(req.body);
    const session = await currentUser(db, config, req);
    if (!session || !csrfTokenMatches(config, { session: session.sessionId }, form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    return { form, session };
  }
  const PASSWORD_LENGTH = `The password must be ${PASSWORD_MIN_LENGTH} to ${PASSWORD_MAX_LENGTH} characters long.`;
  const passwordFits = (password: string) => password.length >= PASSWORD_MIN_LENGTH && password.length <= PASSWORD_MAX_LENGTH;

  // ---- forgot password ----
  const forgotPage = (req: FastifyRequest, reply: FastifyReply, status: number, view: { email?: string; sent?: boolean; error?: string }) =>
    renderPage(reply, status, 'forgot-password', { title: 'Reset your password', csrfToken: preCsrf(req, reply), email: view.email ?? '', sent: view.sent ?? false, error: view.error ?? '' });

  app.get('/forgot-password', async (req, reply) => forgotPage(req, reply, 200, {}));

  app.post('/forgot-password', async (req, reply) => {
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    const email = (form.email ?? '').trim();
    if (!emailSchema.safeParse(email).success) return forgotPage(req, reply, 400, { email, error: 'Enter a valid email address.' });
    const key = email.toLowerCase();
    const wait = Math.max(addressThrottle.retryAfter(key), ipThrottle.retryAfter(req.ip));
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many reset requests. Please wait and try again later.');
    addressThrottle.recordFailure(key);
    ipThrottle.recordFailure(req.ip);
    // After the answer: whether the address has an account changes nothing in it, not even its timing.
    background.run('password reset request', async () => {
      const outcome = await requestPasswordReset(db, mailDeps, email);
      req.log.info({ outcome }, 'password reset requested');
    });
    return forgotPage(req, reply, 200, { sent: true });
  });

  // ---- reset password ----
  const resetPage = (req: FastifyRequest, reply: FastifyReply, status: number, view: { token: string; email: string; errors?: string[] }) =>
    renderPage(reply, status, 'reset-password', {
      title: 'Choose a new password',
      csrfToken: preCsrf(req, reply),
      token: view.token,
      email: view.email,
      errors: view.errors ?? [],
      passwordMinLength: PASSWORD_MIN_LENGTH,
    });

  app.get('/reset-password', async (req, reply) => {
    refuseLinkGuessing(req);
    const token = queryToken(req);
    const found = await findAccountToken(db, 'reset_password', token);
    if (!found || token === undefined) return badLink(req, reply, BAD_RESET_LINK);
    return resetPage(req, reply, 200, { token, email: found.email });
  });

  app.post('/reset-password', async (req, reply) => {
    const { token, password } = readLinkForm(req);
    const found = await findAccountToken(db, 'reset_password', token);
    if (!found) return badLink(req, reply, BAD_RESET_LINK);
    // The link is not used up by a password the form refuses.
    if (!passwordFits(password)) return resetPage(req, reply, 400, { token, email: found.email, errors: [PASSWORD_LENGTH] });
    const userId = await resetPassword(db, token, await hashPassword(password));
    if (userId === undefined) return badLink(req, reply, BAD_RESET_LINK);
    req.log.info({ user_id: userId }, 'password reset');
    return renderPage(reply, 200, 'message', {
      title: 'Password changed',
      message: 'Your password was changed, and every browser that was signed in to your account was signed out. Sign in with the new password.',
      link: { href: '/login', label: 'Sign in' },
    });
  });

  // ---- verify email ----
  // Confirming needs the link (the mailbox) and a session of the account it was sent for (its
  // password): otherwise whoever signed up with someone else's address would only need them to
  // click "Confirm" to hold an account with that address, confirmed.
  app.get('/verify-email', async (req, reply) => {
    refuseLinkGuessing(req);
    const token = queryToken(req);
    const found = await findAccountToken(db, 'verify_email', token);
    if (!found || token === undefined) return badLink(req, reply, BAD_VERIFY_LINK);
    const session = await currentUser(db, config, req);
    const user = await db.selectFrom('users').select('email').where('id', '=', found.user_id).executeTakeFirstOrThrow();
    return renderPage(reply, 200, 'verify-email', {
      title: 'Confirm your email address',
      csrfToken: session ? csrfToken(config, { session: session.sessionId }) : '',
      token,
      email: found.email,
      currentEmail: user.email,
      change: user.email !== found.email,
      signedIn: session !== undefined,
      otherAccount: session !== undefined && session.userId !== found.user_id ? session.email : '',
      loginHref: `/login?return_to=${encodeURIComponent(`/verify-email?token=${token}`)}`,
    });
  });

  app.post('/verify-email', async (req, reply) => {
    const { form, session } = await readSignedInLinkForm(req);
    let confirmed;
    try {
      confirmed = await confirmEmail(db, mailDeps, form.token, session.userId);
    } catch (err) {
      if (err instanceof ConflictError) return renderPage(reply, 409, 'error', { title: 'Your address was not changed', message: err.description });
      throw err;
    }
    if (!confirmed) return badLink(req, reply, BAD_VERIFY_LINK);
    return renderPage(reply, 200, 'message', {
      title: 'Email address confirmed',
      message: confirmed.previousEmail !== undefined ? `Your account's email address is now ${confirmed.email}.` : `${confirmed.email} is confirmed. Thank you.`,
      link: { href: '/dashboard', label: 'Go to the dashboard' },
    });
  });

  // ---- sign-up ----
  // The account is made here, not at sign-up: this needs the link (the mailbox) and the password
  // chosen at sign-up, so one click by an address's owner on a sign-up someone else made does
  // not give that someone an account on the address (pre-account takeover).
  const signUpPage = (req: FastifyRequest, reply: FastifyReply, status: number, view: { token: string; email: string; organizationName: string; errors?: string[] }) =>
    renderPage(reply, status, 'signup-confirm', {
      title: 'Finish creating your account',
      csrfToken: preCsrf(req, reply),
      token: view.token,
      email: view.email,
      organizationName: view.organizationName,
      errors: view.errors ?? [],
    });

  app.get('/signup/confirm', async (req, reply) => {
    refuseLinkGuessing(req);
    const token = queryToken(req);
    const pending = await findPendingSignUp(db, token);
    if (!pending || token === undefined) return badLink(req, reply, BAD_SIGN_UP_LINK);
    return signUpPage(req, reply, 200, { token, email: pending.email, organizationName: pending.organization_name });
  });

  app.post('/signup/confirm', async (req, reply) => {
    const { token, password } = readLinkForm(req);
    const pending = await findPendingSignUp(db, token);
    if (!pending) return badLink(req, reply, BAD_SIGN_UP_LINK);
    // The domain may have come to require its single sign-on since the sign-up.
    if ((await findSsoRoute(db, pending.email))?.ssoRequired) return renderPage(reply, 403, 'error', { title: 'Sign in with your company account', message: SSO_REQUIRED_SIGN_UP });
    let done;
    try {
      done = password.length <= PASSWORD_MAX_LENGTH ? await completeSignUp(db, token, password) : ({ outcome: 'wrong_password' } as const);
    } catch (err) {
      if (err instanceof ConflictError) return renderPage(reply, 409, 'error', { title: 'This address has an account now', message: 'An account with this email address was created since you signed up. Sign in, or reset its password if you do not know it.' });
      throw err;
    }
    if (done.outcome === 'unknown') return badLink(req, reply, BAD_SIGN_UP_LINK);
    if (done.outcome === 'wrong_password') {
      // Each try costs an argon2 verification: counted with the links that do not work.
      badLinks.recordFailure(req.ip);
      return signUpPage(req, reply, 400, { token, email: pending.email, organizationName: pending.organization_name, errors: ['That is not the password chosen at sign-up.'] });
    }
    req.log.info({ user_id: done.userId, organization_id: done.organizationId }, 'sign-up completed');
    return beginSession(db, config, req, reply, { userId: done.userId, amr: ['pwd'], returnTo: done.returnTo, currentOrganizationId: done.organizationId });
  });

  // ---- invitations ----
  async function invitationPage(req: FastifyRequest, reply: FastifyReply, token: string, status = 200, view: { errors?: string[]; name?: string } = {}) {
    const invitation = await findOpenInvitation(db, token);
    if (!invitation) return badLink(req, reply, new InvitationUnavailableError().description);
    const session = await currentUser(db, config, req);
    const returnTo = `/invitation?token=${token}`;
    return renderPage(reply, status, 'invitation', {
      title: `Join ${invitation.organization_name}`,
      invitation,
      token,
      errors: view.errors ?? [],
      name: view.name ?? '',
      signedInAs: session?.email ?? '',
      matches: session !== undefined && sameAddress(session.email, invitation.email),
      csrfToken: session ? csrfToken(config, { session: session.sessionId }) : preCsrf(req, reply),
      logoutCsrfToken: session ? csrfToken(config, { session: session.sessionId }) : '',
      accountExists: session === undefined && (await findUserByEmail(db, invitation.email)) !== undefined,
      loginHref: `/login?return_to=${encodeURIComponent(returnTo)}`,
      passwordMinLength: PASSWORD_MIN_LENGTH,
    });
  }

  app.get('/invitation', async (req, reply) => {
    refuseLinkGuessing(req);
    return invitationPage(req, reply, queryToken(req) ?? '');
  });

  app.post('/invitation/accept', async (req, reply) => {
    const { form, session } = await readSignedInLinkForm(req);
    let invitation;
    try {
      invitation = await acceptInvitation(db, form.token, session.userId);
    } catch (err) {
      if (err instanceof InvitationUnavailableError) return badLink(req, reply, err.description);
      if (err instanceof ConflictError) return invitationPage(req, reply, form.token ?? '', 409, { errors: [err.description] });
      throw err;
    }
    // The dashboard opens on the organization just joined.
    await selectOrganization(db, { sessionId: session.sessionId, userId: session.userId, organizationId: invitation.organization_id });
    return reply.redirect('/dashboard', 303);
  });

  app.post('/invitation/signup', async (req, reply) => {
    const { token, password, form } = readLinkForm(req);
    const name = (form.name ?? '').trim();
    const errors: string[] = [];
    if (!passwordFits(password)) errors.push(PASSWORD_LENGTH);
    if (name.length > 200) errors.push('The name must be at most 200 characters long.');
    if (errors.length > 0) return invitationPage(req, reply, token, 400, { errors, name });
    // A dead link costs no password hash.
    const open = await findOpenInvitation(db, token);
    if (!open) return badLink(req, reply, new InvitationUnavailableError().description);
    // No password account for an address whose organization requires its single sign-on: that
    // person signs in through their company, then accepts the invitation signed in.
    if ((await findSsoRoute(db, open.email))?.ssoRequired) {
      return invitationPage(req, reply, token, 403, { errors: ['Your organization signs you in through its identity provider: sign in with your company account first (enter your email on the sign-in page and choose Continue), then open this invitation again.'], name });
    }
    let joined;
    try {
      joined = await signUpFromInvitation(db, token, { name, passwordHash: await hashPassword(password) });
    } catch (err) {
      if (err instanceof InvitationUnavailableError) return badLink(req, reply, err.description);
      if (err instanceof ConflictError) return invitationPage(req, reply, token, 409, { errors: ['An account with this email address already exists. Sign in to accept the invitation.'], name });
      throw err;
    }
    // Signed in, in the organization that invited them.
    return beginSession(db, config, req, reply, { userId: joined.userId, amr: ['pwd'], returnTo: '/dashboard', currentOrganizationId: joined.invitation.organization_id });
  });
}
