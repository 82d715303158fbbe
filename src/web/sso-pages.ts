/**
 * The browser's side of single sign-on through an organization's identity provider: leaving for
 * it (a form POST with the pre-session CSRF token, so no other site can sign a browser in through
 * an IdP of its choosing), coming back (the OIDC callback, the SAML ACS), the account step, and
 * linking an existing account once its owner proved it.
 *
 * Every sign-in is bound to the browser that started it (its pre-session cookie, hashed in
 * sso_sign_ins; a link waiting for the account's proof, to a cookie of its own, since the proof
 * is a sign-in and ends the pre-session cookie); a mismatch, an unknown or used state or handle,
 * or any protocol check that fails is an error page, never a session. The SAML ACS receives a cross-site POST, which carries no
 * SameSite=Lax cookie: it verifies and records the response, then sends the browser to
 * /sso/finish, a top-level GET that does carry it, and the binding is checked there.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { recordAuditEvent } from '../audit/events.js';
import { createOutboundFetch } from '../lib/outbound.js';
import { readParams } from '../oauth/helpers/params.js';
import { checkPreSessionCsrf, cookieSecurity, csrfToken, CSRF_FAILED, csrfTokenMatches, currentUser, ensurePreSession, preSessionBinding, safeReturnTo, type SessionUser } from '../accounts/sessions.js';
import { generateSecret } from '../lib/crypto.js';
import { type ConnectionRow, findConnectionRow } from '../sso/connections.js';
import { federatedAmr, linkAfterProof, REFUSAL_MESSAGES, type Resolution, resolveUpstreamIdentity, type UpstreamIdentity } from '../sso/identities.js';
import { ssoRelyingParty, UpstreamOidc, UpstreamOidcError } from '../sso/oidc-upstream.js';
import { MAX_SAML_RESPONSE_BYTES, SamlResponseError, SamlServiceProvider } from '../sso/saml-sp.js';
import { FailureThrottle } from '../lib/throttle.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { browserHash, SIGN_IN_TTL_SECONDS, parkForProof, peekParkedSignIn, PROOF_TTL_SECONDS, recordSamlResponse, startOidcSignIn, startSamlSignIn, takeOidcSignIn, takeParkedSignIn } from '../sso/sign-ins.js';
import { beginSession } from './begin-session.js';
import { ForbiddenError, renderPage } from './render.js';

export const START_AGAIN = { href: '/login', label: 'Sign in again' };
/** Unknown, used, expired, or another browser's: one answer, since a page must not tell them apart for someone else's link. */
export const EXPIRED = 'This sign-in has expired, was finished already, or was started in another browser. Start again here.';
/**
 * Sign-ins an address may start in SIGN_IN_TTL_SECONDS: each is a row written for an anonymous
 * request. Generous: a whole company may sign in from behind one address on a Monday morning.
 */
export const NEW_SIGN_INS_PER_IP = 1000;
/** Refused SAML responses an address may post in SIGN_IN_TTL_SECONDS: each is an audit event of the organization's. */
const REFUSED_RESPONSES_PER_IP = 100;

/** Leaves for connection `id`'s identity provider: what the email-first sign-in and the chooser call. */
export type StartSso = (req: FastifyRequest, reply: FastifyReply, connectionId: number, returnTo: string, options?: SsoStartOptions) => Promise<FastifyReply>;

/** What the sign-in asks of the identity provider. */
export interface SsoStartOptions {
  /** The address typed (OIDC login_hint). */
  loginHint?: string | undefined;
  /**
   * The application asked for a fresh sign-in (OIDC prompt=login, max_age): the provider is asked
   * to authenticate the person again (OIDC prompt=login and max_age=0, SAML ForceAuthn), not to
   * answer from a session it already has.
   */
  again?: boolean;
}

export function connectionIdOf(req: FastifyRequest): number {
  const raw = (req.params as { id?: string }).id ?? '';
  const id = /^[1-9][0-9]{0,9}$/.test(raw) ? Number(raw) : 0;
  // An integer column: a larger number in a query is the database's error (a 500), not "not found".
  return id <= 2 ** 31 - 1 ? id : 0;
}

export function queryString(req: FastifyRequest, name: string): string | undefined {
  const value = (req.query as Record<string, unknown> | undefined)?.[name];
  return typeof value === 'string' ? value : undefined;
}

/** The hash binding a sign-in to this browser, from the cookie it sent (undefined: it sent none). */
export function currentBrowser(req: FastifyRequest, config: Config): string | undefined {
  const binding = preSessionBinding(req, config);
  return binding && 'preSession' in binding ? browserHash(binding.preSession) : undefined;
}

/**
 * What binds a link waiting for its account's proof (/sso/link) to this browser: a cookie of its
 * own, not the pre-session cookie, since the proof is a sign-in and a sign-in replaces the
 * pre-session cookie with the session's (setSessionCookie), which would leave the browser that
 * proved the account unable to confirm the link.
 */
function linkCookieName(config: Config): string {
  return `${cookieSecurity(config).secure ? '__Host-' : ''}orgauth_sso_link`;
}

/** The browser's link binding, made (or kept, with its lifetime renewed) for a link about to wait. */
export function ensureLinkBinding(req: FastifyRequest, reply: FastifyReply, config: Config): string {
  const name = linkCookieName(config);
  const existing = req.cookies[name];
  const value = existing !== undefined && /^[A-Za-z0-9_-]{43}$/.test(existing) ? existing : generateSecret(32);
  reply.setCookie(name, value, { httpOnly: true, sameSite: 'lax', path: '/', secure: cookieSecurity(config).secure, maxAge: PROOF_TTL_SECONDS });
  return value;
}

/** The hash binding a waiting link to this browser, from the cookie it sent (undefined: it sent none). */
export function currentLinkBrowser(req: FastifyRequest, config: Config): string | undefined {
  const value = req.cookies[linkCookieName(config)];
  return value !== undefined && value !== '' ? browserHash(value) : undefined;
}

/**
 * Whether the session was signed in after the link was parked: the proof is a sign-in the person
 * makes for it, not a session the browser happened to hold (someone else could have brought the
 * browser to the link page).
 */
export function provedSince(session: { authTime: Date }, parkedAt: Date): boolean {
  return session.authTime.getTime() >= parkedAt.getTime() - 1000;
}

/**
 * The page of a link waiting for its account's proof (sso-link.eta, /sso/link and /social/link):
 * "sign in to the account" until the session is the account's and was signed in after the link
 * was parked, then the form that confirms it.
 */
export function renderLinkPage(
  reply: FastifyReply,
  config: Config,
  view: { path: '/sso/link' | '/social/link'; handle: string; userId: number; parkedAt: Date; email: string; connectionName: string; title: string; session: SessionUser | undefined },
) {
  const { session } = view;
  const common = { title: view.title, social: view.path === '/social/link', connectionName: view.connectionName, email: view.email };
  if (!session || session.userId !== view.userId || !provedSince(session, view.parkedAt)) {
    const here = `${view.path}?${new URLSearchParams({ handle: view.handle }).toString()}`;
    return renderPage(reply, 200, 'sso-link', {
      ...common,
      signedInAsOther: session !== undefined,
      signInHref: `/login?${new URLSearchParams({ return_to: here, login_hint: view.email, method: 'password', ...(session ? { prompt: 'login' } : {}) }).toString()}`,
      signedInAlready: session !== undefined && session.userId === view.userId,
    });
  }
  return renderPage(reply, 200, 'sso-link', { ...common, confirm: true, handle: view.handle, csrfToken: csrfToken(config, { session: session.sessionId }) });
}

function failure(reply: FastifyReply, status: number, message: string) {
  return renderPage(reply, status, 'message', { title: 'Company sign-in failed', message, link: START_AGAIN });
}

export async function ssoPages(app: FastifyInstance, deps: { db: DB; config: Config }): Promise<StartSso> {
  const { db, config } = deps;
  const oidc = new UpstreamOidc({ secretKey: config.secretKey, allowHttp: config.outbound.allowHttp, fetch: createOutboundFetch(config.outbound) });
  const saml = new SamlServiceProvider(config.issuer);
  const newSignIns = new FailureThrottle(NEW_SIGN_INS_PER_IP, SIGN_IN_TTL_SECONDS * 1000);
  const refusedResponses = new FailureThrottle(REFUSED_RESPONSES_PER_IP, SIGN_IN_TTL_SECONDS * 1000);

  async function auditFailure(row: ConnectionRow, action: string, reason: string) {
    await recordAuditEvent(db, { organizationId: row.organization_id, action, details: { connection_id: row.id, reason: reason.slice(0, 500) } });
  }

  const startSso: StartSso = async (req, reply, connectionId, returnTo, options = {}) => {
    const row = await findConnectionRow(db, connectionId);
    if (!row || row.state !== 'active') return failure(reply, 404, 'This company sign-in is not available. Ask your administrator.');
    const wait = newSignIns.retryAfter(req.ip);
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many sign-ins started from this address. Please wait and try again.');
    newSignIns.recordFailure(req.ip);
    const browser = browserHash(ensurePreSession(req, reply, config));
    if (row.protocol === 'oidc') {
      const checks = UpstreamOidc.newChecks();
      let url: URL;
      try {
        url = await oidc.authorizationUrl(ssoRelyingParty(config.issuer, row), checks, options);
      } catch (err) {
        if (!(err instanceof UpstreamOidcError)) throw err;
        req.log.warn({ connection_id: row.id, err: err.message }, 'upstream OpenID provider unusable');
        await auditFailure(row, 'sso.provider_unreachable', err.auditReason);
        return failure(reply, 502, 'Your company’s identity provider could not be reached. Try again in a minute, or ask your administrator.');
      }
      await startOidcSignIn(db, config.secretKey, { connectionId: row.id, browser, returnTo, checks });
      return reply.redirect(url.href, 303);
    }
    const requestId = await startSamlSignIn(db, { connectionId: row.id, browser, returnTo });
    return reply.redirect(await saml.authorizationUrl(row, requestId, '', options.again === true), 303);
  };

  /** The account step, once a provider vouched for `identity`. */
  async function finishSignIn(req: FastifyRequest, reply: FastifyReply, identity: UpstreamIdentity, returnTo: string, options: { resolution?: Resolution; unsolicited?: boolean } = {}) {
    const resolved = options.resolution ?? (await resolveUpstreamIdentity(db, identity));
    if (resolved.kind === 'signed_in') {
      req.log.info({ user_id: resolved.userId, connection_id: identity.connectionId }, 'signed in through SSO');
      return beginSession(db, config, req, reply, { userId: resolved.userId, amr: federatedAmr(identity), returnTo, currentOrganizationId: resolved.organizationId, ssoConnectionId: identity.connectionId });
    }
    if (resolved.kind === 'needs_proof') {
      // A response nobody asked for must not lead a browser to the page that links an account:
      // anyone could post one into a signed-in victim's browser and ask them to confirm.
      if (options.unsolicited) return renderPage(reply, 403, 'message', { title: 'Company sign-in refused', message: 'To connect your company sign-in to an account here, start from the sign-in page: enter your email address and choose Continue.', link: START_AGAIN });
      const handle = await parkForProof(db, { identity, userId: resolved.userId, browser: browserHash(ensureLinkBinding(req, reply, config)), returnTo });
      return reply.redirect(`/sso/link?${new URLSearchParams({ handle }).toString()}`, 303);
    }
    req.log.info({ connection_id: identity.connectionId, reason: resolved.reason }, 'SSO sign-in refused');
    return renderPage(reply, 403, 'message', { title: 'Company sign-in refused', message: REFUSAL_MESSAGES[resolved.reason], link: START_AGAIN });
  }

  app.post('/sso/:id/start', async (req, reply) => {
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    const hint = form.login_hint !== undefined && form.login_hint.length <= 254 ? form.login_hint : undefined;
    return startSso(req, reply, connectionIdOf(req), safeReturnTo(form.return_to), { loginHint: hint, again: form.prompt === 'login' });
  });

  app.get('/sso/:id/oidc/callback', async (req, reply) => {
    const state = queryString(req, 'state');
    if (state === undefined || state.length > 200) return failure(reply, 400, 'This sign-in link is not valid. Start again.');
    const taken = await takeOidcSignIn(db, config.secretKey, connectionIdOf(req), state, currentBrowser(req, config));
    if (!taken) return failure(reply, 400, EXPIRED);
    const row = await findConnectionRow(db, connectionIdOf(req));
    if (!row || row.state !== 'active' || row.protocol !== 'oidc') return failure(reply, 403, REFUSAL_MESSAGES.connection_inactive);
    let identity: UpstreamIdentity;
    try {
      identity = await oidc.finish(ssoRelyingParty(config.issuer, row), new URL(req.url, config.issuer), taken.checks);
    } catch (err) {
      if (!(err instanceof UpstreamOidcError)) throw err;
      req.log.warn({ connection_id: row.id, err: err.message }, 'upstream OpenID sign-in refused');
      await auditFailure(row, 'sso.sign_in_failed', err.auditReason);
      return failure(reply, 400, 'Your company sign-in could not be completed. Start again, or ask your administrator.');
    }
    return finishSignIn(req, reply, identity, taken.returnTo);
  });

  app.get('/sso/:id/saml/metadata', async (req, reply) => {
    const row = await findConnectionRow(db, connectionIdOf(req));
    if (!row || row.protocol !== 'saml') return reply.code(404).type('text/plain; charset=utf-8').send('not found');
    return reply.type('application/samlmetadata+xml; charset=utf-8').header('cache-control', 'no-cache').send(await saml.metadata(row));
  });

  app.post('/sso/:id/saml/acs', { bodyLimit: MAX_SAML_RESPONSE_BYTES * 2 }, async (req, reply) => {
    const form = readParams(req.body);
    const row = await findConnectionRow(db, connectionIdOf(req));
    if (!row || row.protocol !== 'saml' || row.state !== 'active') return failure(reply, 403, REFUSAL_MESSAGES.connection_inactive);
    // Anyone may post here: an address whose responses keep failing stops being heard (and audited).
    const wait = refusedResponses.retryAfter(req.ip);
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many failed sign-ins from this address. Please wait and try again.');
    let handle: string;
    try {
      const accepted = await saml.accept(row, form.SAMLResponse ?? '');
      handle = await recordSamlResponse(db, { accepted, idpInitiatedAllowed: row.saml_idp_initiated, relayStateReturnTo: safeReturnTo(form.RelayState) });
    } catch (err) {
      if (!(err instanceof SamlResponseError)) throw err;
      req.log.warn({ connection_id: row.id, err: err.message }, 'SAML response refused');
      refusedResponses.recordFailure(req.ip);
      await auditFailure(row, 'sso.saml_response_refused', err.message);
      return failure(reply, 400, 'Your company sign-in could not be completed. Start again, or ask your administrator.');
    }
    return reply.redirect(`/sso/finish?${new URLSearchParams({ handle }).toString()}`, 303);
  });

  app.get('/sso/finish', async (req, reply) => {
    const handle = queryString(req, 'handle') ?? '';
    const parked = await takeParkedSignIn(db, handle, { kind: 'bound', browser: currentBrowser(req, config) });
    if (parked) return finishSignIn(req, reply, parked.identity, parked.returnTo);
    // IdP-initiated: no browser started it, so this one is asked first (a page another site could
    // make a browser post to signs nobody in by itself: login CSRF).
    const unsolicited = await peekParkedSignIn(db, handle, { kind: 'unsolicited' });
    if (!unsolicited) return failure(reply, 400, EXPIRED);
    const row = await findConnectionRow(db, unsolicited.identity.connectionId);
    const organization = row ? await db.selectFrom('organizations').select('name').where('id', '=', row.organization_id).executeTakeFirst() : undefined;
    return renderPage(reply, 200, 'sso-continue', {
      title: 'Continue signing in',
      email: unsolicited.identity.email ?? unsolicited.identity.subject,
      connectionName: row?.name ?? '',
      organizationName: organization?.name ?? '',
      handle,
      csrfToken: csrfToken(config, { preSession: ensurePreSession(req, reply, config) }),
    });
  });

  app.post('/sso/finish', async (req, reply) => {
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    const parked = await takeParkedSignIn(db, form.handle ?? '', { kind: 'unsolicited' });
    if (!parked) return failure(reply, 400, EXPIRED);
    return finishSignIn(req, reply, parked.identity, parked.returnTo, { unsolicited: true });
  });

  /** The account exists already and the provider's word is not enough: its owner signs in to it once, then confirms. */
  app.get('/sso/link', async (req, reply) => {
    const handle = queryString(req, 'handle') ?? '';
    const parked = await peekParkedSignIn(db, handle, { kind: 'proof', browser: currentLinkBrowser(req, config) });
    if (!parked || parked.userId === undefined) return failure(reply, 400, EXPIRED);
    const row = await findConnectionRow(db, parked.identity.connectionId);
    return renderLinkPage(reply, config, {
      path: '/sso/link',
      handle,
      userId: parked.userId,
      parkedAt: parked.createdAt,
      email: parked.identity.email ?? '',
      connectionName: row?.name ?? '',
      title: 'Connect your company sign-in',
      session: await currentUser(db, config, req),
    });
  });

  app.post('/sso/link', async (req, reply) => {
    const form = readParams(req.body);
    const session = await currentUser(db, config, req);
    if (!session || !csrfTokenMatches(config, { session: session.sessionId }, form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const parked = await peekParkedSignIn(db, form.handle ?? '', { kind: 'proof', browser: currentLinkBrowser(req, config) });
    if (!parked || parked.userId === undefined) return failure(reply, 400, EXPIRED);
    if (parked.userId !== session.userId) return failure(reply, 403, 'You are signed in to another account than the one your company sign-in names.');
    if (!provedSince(session, parked.createdAt)) return failure(reply, 403, 'Sign in to the account again to connect it: a sign-in from before is not proof.');
    if (!(await takeParkedSignIn(db, form.handle ?? '', { kind: 'proof', browser: currentLinkBrowser(req, config) }))) return failure(reply, 400, EXPIRED);
    const resolution = await linkAfterProof(db, parked.identity, session.userId);
    return finishSignIn(req, reply, parked.identity, parked.returnTo, { resolution });
  });

  return startSso;
}
