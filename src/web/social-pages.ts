/**
 * The browser's side of social sign-in (issue 45): leaving for the provider (a form POST with the
 * pre-session CSRF token, as SSO does), coming back (/social/:id/callback), the account step, and
 * linking an existing account once its owner proved it (/social/link).
 *
 * The same bindings as SSO's (sso-pages.ts): the sign-in in flight is bound to the browser that
 * started it and used once; a link waiting for the account's proof, to a cookie of its own. A
 * social sign-in is one factor (amr `fed`): an account with a second factor takes its second
 * step next, as after a password. Every refusal is a page and a log line, never a session.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { checkPreSessionCsrf, CSRF_FAILED, csrfTokenMatches, currentUser, ensurePreSession, safeReturnTo } from '../accounts/sessions.js';
import { startPendingSignIn } from '../accounts/pending-sign-ins.js';
import { factorSummary, hasSecondFactor } from '../accounts/second-factors.js';
import { createOutboundFetch } from '../lib/outbound.js';
import { clientAddress } from '../lib/client-address.js';
import { FailureThrottle } from '../lib/throttle.js';
import type { MailOutbox } from '../mail/outbox.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { readParams } from '../oauth/helpers/params.js';
import { type SocialConnectionRow, findSocialConnection } from '../social/connections.js';
import { linkSocialAfterProof, resolveSocialIdentity, SOCIAL_AMR, SOCIAL_REFUSAL_MESSAGES, type SocialResolution } from '../social/identities.js';
import { type SocialIdentity, SocialProviders } from '../social/providers.js';
import { UpstreamOidc, UpstreamOidcError } from '../sso/oidc-upstream.js';
import { browserHash, parkForProof, peekParkedSignIn, SIGN_IN_TTL_SECONDS, startOidcSignIn, takeOidcSignIn, takeParkedSignIn } from '../sso/sign-ins.js';
import { beginSession } from './begin-session.js';
import { ForbiddenError, renderPage } from './render.js';
import { SECOND_STEP_PATH } from './second-step.js';
import { connectionIdOf, currentBrowser, currentLinkBrowser, ensureLinkBinding, EXPIRED, NEW_SIGN_INS_PER_IP, provedSince, queryString, renderLinkPage, START_AGAIN } from './sso-pages.js';
import { ssoSignInPath } from './sign-in.js';


function failure(reply: FastifyReply, status: number, message: string) {
  return renderPage(reply, status, 'message', { title: 'Sign-in failed', message, link: START_AGAIN });
}

export async function socialPages(app: FastifyInstance, deps: { db: DB; config: Config; mail: MailOutbox }): Promise<void> {
  const { db, config } = deps;
  const providers = new SocialProviders({ issuer: config.issuer, secretKey: config.secretKey, allowHttp: config.outbound.allowHttp, fetch: createOutboundFetch(config.outbound) });
  const newSignIns = new FailureThrottle(NEW_SIGN_INS_PER_IP, SIGN_IN_TTL_SECONDS * 1000);
  const mailDeps = { issuer: config.issuer, mail: deps.mail };

  async function enabled(id: number): Promise<SocialConnectionRow | undefined> {
    const row = await findSocialConnection(db, id);
    return row && row.state === 'enabled' ? row : undefined;
  }

  /** The account step, once the provider vouched for `identity`. */
  async function finishSignIn(req: FastifyRequest, reply: FastifyReply, identity: SocialIdentity, returnTo: string, resolution?: SocialResolution) {
    const resolved = resolution ?? (await resolveSocialIdentity(db, identity, { ip: clientAddress(req) }));
    switch (resolved.kind) {
      case 'signed_in': {
        req.log.info({ user_id: resolved.userId, social_connection_id: identity.connectionId, created: resolved.created }, 'signed in through a social connection');
        // One factor: an account with a second one takes its second step (MF-2), as after a password.
        if (hasSecondFactor(await factorSummary(db, resolved.userId))) {
          await startPendingSignIn(db, config, reply, { userId: resolved.userId, amr: SOCIAL_AMR, returnTo, socialConnectionId: identity.connectionId });
          return reply.redirect(SECOND_STEP_PATH, 303);
        }
        return beginSession(db, config, req, reply, { userId: resolved.userId, amr: SOCIAL_AMR, returnTo, socialConnectionId: identity.connectionId });
      }
      case 'needs_proof': {
        const handle = await parkForProof(db, { identity, userId: resolved.userId, browser: browserHash(ensureLinkBinding(req, reply, config)), returnTo, source: 'social' });
        return reply.redirect(`/social/link?${new URLSearchParams({ handle }).toString()}`, 303);
      }
      case 'too_many':
        throw new TooManyAttemptsError(resolved.wait, 'Too many accounts made from here or for this address. Please wait and try again later.');
      case 'sso_required':
        req.log.info({ social_connection_id: identity.connectionId }, 'social sign-in sent to its organization’s SSO');
        return reply.redirect(ssoSignInPath(resolved.email, returnTo), 303);
      case 'refused':
        req.log.info({ social_connection_id: identity.connectionId, reason: resolved.reason }, 'social sign-in refused');
        return renderPage(reply, 403, 'message', { title: 'Sign-in refused', message: SOCIAL_REFUSAL_MESSAGES[resolved.reason], link: START_AGAIN });
    }
  }

  app.post('/social/:id/start', async (req, reply) => {
    const form = readParams(req.body);
    checkPreSessionCsrf(req, config, form.csrf_token);
    const returnTo = safeReturnTo(form.return_to);
    const row = await enabled(connectionIdOf(req));
    if (!row) return failure(reply, 404, 'This way of signing in is not available. Sign in another way.');
    const wait = newSignIns.retryAfter(req.ip);
    if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many sign-ins started from this address. Please wait and try again.');
    newSignIns.recordFailure(req.ip);
    const browser = browserHash(ensurePreSession(req, reply, config));
    const checks = UpstreamOidc.newChecks();
    let url: URL;
    try {
      url = await providers.authorizationUrl(row, checks);
    } catch (err) {
      if (!(err instanceof UpstreamOidcError)) throw err;
      req.log.warn({ social_connection_id: row.id, err: err.message }, 'social provider unusable');
      return failure(reply, 502, `${row.name} could not be reached. Try again in a minute, or sign in another way.`);
    }
    await startOidcSignIn(db, config.secretKey, { connectionId: row.id, source: 'social', browser, returnTo, checks });
    return reply.redirect(url.href, 303);
  });

  app.get('/social/:id/callback', async (req, reply) => {
    const state = queryString(req, 'state');
    if (state === undefined || state.length > 200) return failure(reply, 400, 'This sign-in link is not valid. Start again.');
    const id = connectionIdOf(req);
    const taken = await takeOidcSignIn(db, config.secretKey, id, state, currentBrowser(req, config), 'social');
    if (!taken) return failure(reply, 400, EXPIRED);
    const row = await enabled(id);
    if (!row) return failure(reply, 403, SOCIAL_REFUSAL_MESSAGES.connection_inactive);
    let identity: SocialIdentity;
    try {
      identity = await providers.finish(row, new URL(req.url, config.issuer), taken.checks);
    } catch (err) {
      if (!(err instanceof UpstreamOidcError)) throw err;
      req.log.warn({ social_connection_id: row.id, err: err.message }, 'social sign-in refused by a check');
      return failure(reply, 400, `Signing in with ${row.name} could not be completed. Start again, or sign in another way.`);
    }
    return finishSignIn(req, reply, identity, taken.returnTo);
  });

  /** The account exists already and the provider's word is not enough: its owner signs in to it once, then confirms. */
  app.get('/social/link', async (req, reply) => {
    const handle = queryString(req, 'handle') ?? '';
    const parked = await peekParkedSignIn<SocialIdentity>(db, handle, { kind: 'proof', browser: currentLinkBrowser(req, config), source: 'social' });
    if (!parked || parked.userId === undefined) return failure(reply, 400, EXPIRED);
    const row = await findSocialConnection(db, parked.identity.connectionId);
    const account = await db.selectFrom('users').select('email').where('id', '=', parked.userId).executeTakeFirst();
    return renderLinkPage(reply, config, {
      path: '/social/link',
      handle,
      userId: parked.userId,
      parkedAt: parked.createdAt,
      email: account?.email ?? '',
      connectionName: row?.name ?? '',
      title: `Connect your ${row?.name ?? ''} sign-in`,
      session: await currentUser(db, config, req),
    });
  });

  app.post('/social/link', async (req, reply) => {
    const form = readParams(req.body);
    const session = await currentUser(db, config, req);
    if (!session || !csrfTokenMatches(config, { session: session.sessionId }, form.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const expect = { kind: 'proof', browser: currentLinkBrowser(req, config), source: 'social' } as const;
    const parked = await peekParkedSignIn<SocialIdentity>(db, form.handle ?? '', expect);
    if (!parked || parked.userId === undefined) return failure(reply, 400, EXPIRED);
    if (parked.userId !== session.userId) return failure(reply, 403, 'You are signed in to another account than the one the provider’s address names.');
    if (!provedSince(session, parked.createdAt)) return failure(reply, 403, 'Sign in to the account again to connect it: a sign-in from before is not proof.');
    if (!(await takeParkedSignIn(db, form.handle ?? '', expect))) return failure(reply, 400, EXPIRED);
    const resolution = await linkSocialAfterProof(db, mailDeps, parked.identity, session.userId);
    // The person just proved the account (and took its second step, if it has one): the session stands.
    if (resolution.kind === 'signed_in') return reply.redirect(parked.returnTo, 303);
    return finishSignIn(req, reply, parked.identity, parked.returnTo, resolution);
  });
}
