/**
 * GET/POST /oauth/logout: OpenID Connect RP-Initiated Logout 1.0. Ends the browser's session at
 * orgauth and sends it back to the application.
 *
 * - `id_token_hint` (an ID token we issued, expired or not) names the application and the user;
 *   `client_id` names the application without one. `post_logout_redirect_uri` must be one the
 *   application registered, byte for byte, or nothing is redirected anywhere (an error page, as
 *   for a bad redirect_uri); `state` goes back with it.
 * - With a hint issued for the browser's current session (its sub and sid), the session ends at
 *   once (§2). Otherwise (no hint, another user's, an older session's) the user is asked first,
 *   on a page whose form carries a CSRF token: a link on another site must not sign people out
 *   (§3, "MUST ask the End-User").
 * - Nobody signed in: nothing to end; the browser goes on as if it had been.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { clearSessionCookie, csrfToken, csrfTokenMatches, currentUser, deleteSession, sessionSid } from '../../accounts/sessions.js';
import type { Config } from '../../config.js';
import type { DB } from '../../db/connect.js';
import type { Application } from '../../db/schema.js';
import { InvalidRequestError } from '../../errors.js';
import { renderPage, setUpPages } from '../../web/render.js';
import { findApplicationByClientId } from '../models/applications.js';
import { verifyIdTokenHint, type IdTokenHint } from '../models/id-tokens.js';
import type { KeyStore } from '../models/key-store.js';
import { readParams } from '../helpers/params.js';
import { redirectLocation } from '../helpers/redirect-uris.js';

interface LogoutRequest {
  hint: IdTokenHint | undefined;
  application: Application | undefined;
  /** Where to send the browser afterwards, with state: a registered post_logout_redirect_uri. */
  destination: string | undefined;
  /** The parameters the confirmation form carries back. */
  carried: { name: string; value: string }[];
}

export async function endSessionEndpoint(app: FastifyInstance, { db, config, keys }: { db: DB; config: Config; keys: KeyStore }): Promise<void> {
  await setUpPages(app, config);

  /** The request checked: a bad hint, an unknown application or an unregistered URI is an error page (nothing redirected). */
  async function readRequest(source: unknown): Promise<LogoutRequest> {
    const params = readParams(source);
    const hint = params.id_token_hint === undefined ? undefined : await verifyIdTokenHint(keys, config, params.id_token_hint);
    if (hint && params.client_id !== undefined && params.client_id !== hint.clientId) throw new InvalidRequestError('client_id is not the application id_token_hint was issued to.');
    const clientId = hint?.clientId ?? params.client_id;
    const application = clientId === undefined ? undefined : await findApplicationByClientId(db, clientId);
    if (clientId !== undefined && !application) throw new InvalidRequestError('The application is unknown.');
    const uri = params.post_logout_redirect_uri;
    if (uri !== undefined) {
      if (!application) throw new InvalidRequestError('post_logout_redirect_uri needs id_token_hint or client_id to name the application.');
      if (application.disabled || !application.post_logout_redirect_uris.includes(uri)) {
        throw new InvalidRequestError('The post_logout_redirect_uri is not registered for this application.');
      }
    }
    const destination = uri === undefined ? undefined : redirectLocation(uri, { state: params.state });
    const carried = [
      ...(application ? [{ name: 'client_id', value: application.client_id }] : []),
      ...(uri !== undefined ? [{ name: 'post_logout_redirect_uri', value: uri }] : []),
      ...(params.state !== undefined && uri !== undefined ? [{ name: 'state', value: params.state }] : []),
    ];
    return { hint, application, destination, carried };
  }

  /** Signed out: back to the application, or a page saying so. */
  function signedOut(reply: FastifyReply, request: LogoutRequest) {
    if (request.destination !== undefined) return reply.redirect(request.destination, 303);
    return renderPage(reply, 200, 'message', { title: 'Signed out', message: 'You are signed out of orgauth.', link: { href: '/login', label: 'Sign in again' } });
  }

  async function logout(req: FastifyRequest, reply: FastifyReply, source: unknown, confirmation: unknown) {
    const request = await readRequest(source);
    const user = await currentUser(db, config, req);
    if (!user) {
      // A POST from another site arrives without the SameSite=Lax session cookie: the same
      // request again as a GET, a top-level navigation the cookie goes with, so a session there
      // is asked about rather than looking absent (and its cookie cleared behind its back).
      if (req.method === 'POST' && confirmation === undefined) {
        return reply.redirect(`/oauth/logout?${new URLSearchParams(readParams(source) as Record<string, string>).toString()}`, 303);
      }
      return signedOut(reply, request);
    }
    const confirmed = confirmation !== undefined && csrfTokenMatches(config, { session: user.sessionId }, confirmation);
    // At once only for an ID token of this very session (its sid for the application): any
    // other ID token of the user (an older session, a leaked one) is asked about (§3).
    const thisSession = request.hint !== undefined && request.hint.sub === String(user.userId) && request.hint.sid === sessionSid(user, request.hint.clientId);
    if (confirmed || thisSession) {
      await deleteSession(db, user.sessionId);
      clearSessionCookie(reply, config);
      req.log.info({ client_id: request.application?.client_id, confirmed }, 'signed out (RP-initiated logout)');
      return signedOut(reply, request);
    }
    return renderPage(reply, 200, 'logout', {
      title: 'Sign out',
      applicationName: request.application?.name,
      userLabel: user.name ? `${user.name} (${user.email})` : user.email,
      hidden: request.carried,
      csrfToken: csrfToken(config, { session: user.sessionId }),
    });
  }

  app.get('/oauth/logout', (req, reply) => logout(req, reply, req.query, undefined));
  app.post('/oauth/logout', (req, reply) => {
    const body = (typeof req.body === 'object' && req.body !== null ? req.body : {}) as Record<string, unknown>;
    // Our own confirmation form adds `confirm` (its CSRF token); anything else is the application's request.
    const { confirm, ...rest } = body;
    return logout(req, reply, rest, confirm);
  });
}
