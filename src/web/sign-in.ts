/**
 * Sign-up, sign-in and sign-out: the browser side of accounts (the dashboard is src/web/dashboard/).
 *
 * Every form carries a CSRF token (see sessions.ts); every redirect after a POST is a 303
 * (AZ-9); failed sign-ins are throttled per email and per client IP and never say whether the
 * email exists. Sign-up makes no account: it answers the same for any address and mails either a
 * link that makes the account (accounts/sign-ups.ts, followed in email-links.ts) or, for a taken
 * address, a notice to its owner; it is limited per address and per client before any hashing.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { startPendingSignIn } from '../accounts/pending-sign-ins.js';
import { factorSummary, hasSecondFactor } from '../accounts/second-factors.js';
import { SECOND_STEP_PATH, secondStepPages } from './second-step.js';
import { socialPages } from './social-pages.js';
import { enabledSocialConnections } from '../social/connections.js';
import { beginSession } from './begin-session.js';
import { passkeyPages } from './passkey-pages.js';
import { ssoPages } from './sso-pages.js';
import { findSsoRoute } from '../sso/domains.js';
import { FailureThrottle } from '../lib/throttle.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { readParams } from '../oauth/helpers/params.js';
import { ForbiddenError, renderPage, setUpPages } from './render.js';
import { type EmailPagesDeps, emailLinkPages } from './email-links.js';
import { organizationNameSchema } from '../accounts/organizations.js';
import { PASSWORD_MAX_LENGTH, PASSWORD_MIN_LENGTH, verifyPassword } from '../accounts/passwords.js';
import {
  clearSessionCookie,
  CSRF_FAILED,
  csrfToken,
  csrfTokenMatches,
  currentUser,
  deleteSession,
  ensurePreSession,
  checkPreSessionCsrf,
  safeReturnTo,
} from '../accounts/sessions.js';
import { emailSchema, findUserByEmail } from '../accounts/users.js';
import { admitSignUp, requestSignUp, SIGN_UP_TTL_S } from '../accounts/sign-ups.js';
import { clientAddress } from '../lib/client-address.js';

export const LOGIN_WINDOW_MS = 15 * 60 * 1000;
export const LOGIN_MAX_FAILURES_PER_EMAIL = 5;
export const LOGIN_MAX_FAILURES_PER_IP = 20;

const BAD_CREDENTIALS = 'Incorrect email or password.';
const SSO_REQUIRED = 'Your organization signs you in through its identity provider. Choose Continue to sign in with your company account.';

/** One query-string value; repeated or missing is undefined. */
function queryValue(req: FastifyRequest, name: string): string | undefined {
  const query = req.query as Record<string, unknown> | undefined;
  const value = query?.[name];
  return typeof value === 'string' ? value : undefined;
}

/**
 * The path to the login page that comes back to `returnTo` afterwards. `again`: ask for the
 * password even when signed in (an application asked for a fresh sign-in: OIDC prompt=login,
 * max_age); `loginHint`: the email to pre-fill (OIDC login_hint).
 */
export function loginPath(returnTo: string, options: { again?: boolean; loginHint?: string | undefined } = {}): string {
  const query = new URLSearchParams({ return_to: returnTo });
  if (options.again) query.set('prompt', 'login');
  if (options.loginHint !== undefined) query.set('login_hint', options.loginHint);
  return `/login?${query.toString()}`;
}

/**
 * Signing in again through the identity provider of the address's organization (SS-4): the email
 * step, which routes such an address to its connection, even while signed in another way.
 */
export function ssoSignInPath(email: string, returnTo: string): string {
  return loginPath(returnTo, { again: true, loginHint: email });
}

/** A login_hint worth pre-filling: something shaped like an email address, of a sane length. */
function hintedEmail(value: string | undefined): string | undefined {
  return value !== undefined && value.length <= 254 && emailSchema.safeParse(value).success ? value : undefined;
}

export async function accountPages(app: FastifyInstance, deps: EmailPagesDeps): Promise<void> {
  const { db, config, mail } = deps;
  await setUpPages(app, config);
  await emailLinkPages(app, deps);
  await secondStepPages(app, deps);
  await passkeyPages(app, deps);
  const startSso = await ssoPages(app, deps);
  await socialPages(app, deps);
  const emailThrottle = new FailureThrottle(LOGIN_MAX_FAILURES_PER_EMAIL, LOGIN_WINDOW_MS);
  const ipThrottle = new FailureThrottle(LOGIN_MAX_FAILURES_PER_IP, LOGIN_WINDOW_MS);

  /**
   * The sign-in page. Email first (`step: 'email'`): the address decides whether the person signs
   * in through their organization's identity provider or here; then the password step.
   */
  async function renderLogin(
    req: FastifyRequest,
    reply: FastifyReply,
    status: number,
    view: { step: 'email' | 'password'; returnTo: string; email?: string; error?: string; notice?: string; again?: boolean },
  ) {
    const preSession = ensurePreSession(req, reply, config);
    return renderPage(reply, status, 'login', {
      title: 'Sign in',
      socialConnections: await enabledSocialConnections(db),
      csrfToken: csrfToken(config, { preSession }),
      step: view.step,
      // Carried to the identity provider: the application asked for a fresh sign-in.
      again: view.again === true,
      returnTo: view.returnTo,
      email: view.email ?? '',
      error: view.error ?? '',
      notice: view.notice ?? '',
      passwordQuery: new URLSearchParams({ return_to: view.returnTo, method: 'password', ...(view.email ? { login_hint: view.email } : {}) }).toString(),
    });
  }

  /** Where an address signs in when its organization verified its domain and has an active connection: there. */
  async function routeToSso(req: FastifyRequest, reply: FastifyReply, route: NonNullable<Awaited<ReturnType<typeof findSsoRoute>>>, email: string, returnTo: string, again: boolean) {
    const [only] = route.connections;
    if (route.connections.length === 1 && only) return startSso(req, reply, only.id, returnTo, { loginHint: email, again });
    const preSession = ensurePreSession(req, reply, config);
    return renderPage(reply, 200, 'sso-choose', {
      title: 'Choose how to sign in',
      csrfToken: csrfToken(config, { preSession }),
      email,
      returnTo,
      connections: route.connections,
      again,
      backQuery: new URLSearchParams({ return_to: returnTo }).toString(),
    });
  }

  async function renderSignup(
    req: FastifyRequest,
    reply: FastifyReply,
    status: number,
    view: { returnTo: string; email?: string; name?: string; organizationName?: string; errors?: string[] },
  ) {
    const preSession = ensurePreSession(req, reply, config);
    return renderPage(reply, status, 'signup', {
      title: 'Create an account',
      socialConnections: await enabledSocialConnections(db),
      csrfToken: csrfToken(config, { preSession }),
      returnTo: view.returnTo,
      email: view.email ?? '',
      name: view.name ?? '',
      organizationName: view.organizationName ?? '',
      errors: view.errors ?? [],
      passwordMinLength: PASSWORD_MIN_LENGTH,
    });
  }


  const signIn = (req: FastifyRequest, reply: FastifyReply, userId: number, returnTo: string) => beginSession(db, config, req, reply, { userId, amr: ['pwd'], returnTo });

  app.get('/login', async (req, reply) => {
    const returnTo = safeReturnTo(queryValue(req, 'return_to'));
    const signedIn = await currentUser(db, config, req);
    // Signed in already: straight back, unless asked to sign in again (then as whom, by default the same user).
    const again = queryValue(req, 'prompt') === 'login';
    if (signedIn && !again) return reply.redirect(returnTo, 303);
    const email = hintedEmail(queryValue(req, 'login_hint')) ?? signedIn?.email;
    const step = queryValue(req, 'method') === 'password' ? 'password' : 'email';
    return renderLogin(req, reply, 200, { step, returnTo, again, ...(email !== undefined ? { email } : {}), ...(again && signedIn ? { notice: 'The application asks you to sign in again.' } : {}) });
  });

  app.post('/login', async (req, reply) => {
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    const returnTo = safeReturnTo(form.return_to);
    const email = (form.email ?? '').trim();
    const emailKey = email.toLowerCase();
    const ipKey = req.ip;
    const route = email.length <= 254 ? await findSsoRoute(db, email) : undefined;
    // The email step: an address of an organization's verified domain with an active connection
    // leaves for that identity provider; any other goes on to the password.
    if (form.password === undefined) {
      if (!emailSchema.safeParse(email).success) return renderLogin(req, reply, 400, { step: 'email', returnTo, email, error: 'Enter your email address.' });
      if (route) return routeToSso(req, reply, route, email, returnTo, form.prompt === 'login');
      return renderLogin(req, reply, 200, { step: 'password', returnTo, email, again: form.prompt === 'login' });
    }
    const ssoRequired = () => {
      req.log.info({ reason: 'sso required' }, 'sign-in refused');
      return renderLogin(req, reply, 403, { step: 'email', returnTo, email, error: SSO_REQUIRED });
    };
    // SS: the organization signs these addresses in through its identity provider only.
    if (route?.ssoRequired) return ssoRequired();
    const password = form.password;

    const wait = Math.max(emailThrottle.retryAfter(emailKey), ipThrottle.retryAfter(ipKey));
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many failed sign-in attempts. Please wait and try again later.');

    const user = email !== '' && email.length <= 254 ? await findUserByEmail(db, email) : undefined;
    // The account's own address decides, not what was typed: the database's lower() finds
    // alice@biz.example for a typed alice@bİz.example, whose domain routes nowhere.
    if (user && user.email.toLowerCase() !== emailKey && (await findSsoRoute(db, user.email))?.ssoRequired) return ssoRequired();
    let ok = false;
    if (password.length <= PASSWORD_MAX_LENGTH) {
      // The same argon2 work whether or not the email exists, so timing does not tell.
      ok = await verifyPassword(user?.password_hash ?? null, password);
    }
    if (!user || !ok) {
      emailThrottle.recordFailure(emailKey);
      ipThrottle.recordFailure(ipKey);
      req.log.info({ reason: user ? 'wrong password' : 'unknown email' }, 'sign-in refused');
      return renderLogin(req, reply, 400, { step: 'password', returnTo, email, error: BAD_CREDENTIALS });
    }
    // The IP counter is not reset: one good account must not buy an address more guesses.
    emailThrottle.reset(emailKey);
    // MF-2: with a second factor, the password leads only to the second step, not to a session.
    if (hasSecondFactor(await factorSummary(db, user.id))) {
      await startPendingSignIn(db, config, reply, { userId: user.id, amr: ['pwd'], returnTo });
      return reply.redirect(SECOND_STEP_PATH, 303);
    }
    return signIn(req, reply, user.id, returnTo);
  });

  app.get('/signup', async (req, reply) => {
    const returnTo = safeReturnTo(queryValue(req, 'return_to'));
    if (await currentUser(db, config, req)) return reply.redirect(returnTo, 303);
    return renderSignup(req, reply, 200, { returnTo });
  });

  app.post('/signup', async (req, reply) => {
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    const returnTo = safeReturnTo(form.return_to);
    const email = form.email ?? '';
    const password = form.password ?? '';
    const name = form.name ?? '';
    const organizationName = form.organization_name ?? '';
    const again = (errors: string[]) => renderSignup(req, reply, 400, { returnTo, email, name, organizationName, errors });

    const errors: string[] = [];
    if (!emailSchema.safeParse(email).success) errors.push('Enter a valid email address.');
    if (password.length < PASSWORD_MIN_LENGTH) errors.push(`The password must be at least ${PASSWORD_MIN_LENGTH} characters long.`);
    if (password.length > PASSWORD_MAX_LENGTH) errors.push(`The password must be at most ${PASSWORD_MAX_LENGTH} characters long.`);
    if (name.trim().length > 200) errors.push('The name must be at most 200 characters long.');
    const orgName = organizationNameSchema.safeParse(organizationName);
    if (!orgName.success) errors.push(`The organization name ${orgName.error.issues[0]?.message ?? 'is invalid'}.`);
    // No password account for an address whose organization requires its single sign-on.
    if (errors.length === 0 && (await findSsoRoute(db, email))?.ssoRequired) errors.push(`${SSO_REQUIRED.replace('Choose Continue', 'On the sign-in page, enter your email and choose Continue')}`);
    if (errors.length > 0) return again(errors);

    // DO-1: the address and the client may sign up only so often, whichever instance is asked;
    // a refusal comes before the password is hashed (argon2id costs about a second of CPU).
    const wait = await admitSignUp(db, { email, ip: clientAddress(req) });
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many sign-ups from here or for this address. Please wait and try again later.');
    // AC-2: the same answer, after the same argon2 work, whether or not the address has an account;
    // only the mail differs (a link to finish, or "someone tried to sign up" to the owner).
    const outcome = await requestSignUp(db, { mail, issuer: config.issuer }, { email: email.trim(), password, name: name.trim(), organizationName, returnTo });
    req.log.info({ outcome }, 'sign-up requested');
    return renderPage(reply, 200, 'message', {
      title: 'Check your inbox',
      message: `We sent a message to the address you entered. Open the link in it within ${SIGN_UP_TTL_S / 60} minutes to finish creating your account. Nothing is created until then.`,
    });
  });

  app.post('/logout', async (req, reply) => {
    const form = readParams(req.body);
    const session = await currentUser(db, config, req);
    if (session) {
      if (!csrfTokenMatches(config, { session: session.sessionId }, form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
      await deleteSession(db, session.sessionId);
      // Only once a session was found and ended: a cross-site POST (no SameSite=Lax cookie sent)
      // must not clear the cookie of a session it could not see.
      clearSessionCookie(reply, config);
    }
    return reply.redirect('/login', 303);
  });
}
