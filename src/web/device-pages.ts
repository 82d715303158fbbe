/**
 * /device (RFC 8628 §3.3): where a person enters the user code a device shows, sees which client
 * asks for what, chooses the organization and decides. The device learns the decision at its
 * next poll of the token endpoint (src/oauth/grants/device-code.ts).
 *
 * - Signed in first (the login page brings the browser back here, the code kept in the query).
 * - Every POST carries the session's CSRF token (AZ-8). A code arriving in the query
 *   (verification_uri_complete) only fills the form: nothing is looked up until the person
 *   submits it, having compared it with the device's (RFC 8628 §5.4).
 * - The organization choice is the consent page's (organization-choice.ts): bounded by the
 *   person's role in each (grantableByRole), an organization whose role allows nothing asked
 *   for, or that requires two-step sign-in this session lacks, cannot be chosen, and the choice
 *   is checked again on the server against the memberships as they are now.
 * - Guessing (RFC 8628 §5.1): codes are looked up by exact match among pending, unexpired ones
 *   only, and wrong codes are throttled per user (however many sessions they sign in) and per
 *   address, an IPv6 address with its /64 (src/lib/client-address.ts): 429 past the limit.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { recordAuditEvent } from '../audit/events.js';
import { listUserOrganizations, type UserOrganization } from '../accounts/organizations.js';
import { factorSummary, hasSecondFactor } from '../accounts/second-factors.js';
import { CSRF_FAILED, csrfToken, csrfTokenMatches, currentUser, type SessionUser } from '../accounts/sessions.js';
import { sessionShortfall } from '../accounts/organization-access.js';
import { ssoRequiredMessage } from '../sso/required.js';
import type { Config } from '../config.js';
import { type DB, inTransaction } from '../db/connect.js';
import { InvalidRequestError } from '../errors.js';
import { addressGroup, clientAddress } from '../lib/client-address.js';
import { FailureThrottle } from '../lib/throttle.js';
import { grantableByRole } from './organization-choice.js';
import { DEVICE_PAGE_PATH } from '../oauth/endpoints/device-authorization.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import { parseCanonicalId } from '../oauth/helpers/params.js';
import {
  approveDeviceAuthorization,
  denyDeviceAuthorization,
  findPendingDeviceAuthorization,
  formatUserCode,
  normalizeUserCode,
  type PendingDeviceAuthorization,
} from '../oauth/models/device-authorizations.js';
import type { ResourceRegistry, TokenResource } from '../oauth/models/resources.js';
import { ForbiddenError, renderPage, setUpPages } from './render.js';
import { describeScopes, organizationChoices, preselectedOrganization } from './organization-choice.js';
import { loginPath } from './sign-in.js';

/** Wrong codes one user may enter in a minute, in all their sessions (RFC 8628 §5.1: 20^8 codes, so guessing one takes years). */
export const WRONG_CODES_PER_USER = 5;
/** Wrong codes one address (an IPv6 /64) may enter in a minute: several people behind one address each mistype a few. */
export const WRONG_CODES_PER_IP = 20;
const GUESS_WINDOW_MS = 60_000;

const NOT_FOUND = 'That code is not valid, or it has expired or been used. Check the code your device shows and try again.';

export interface DevicePagesDeps {
  db: DB;
  config: Config;
  resources: ResourceRegistry;
}

type Raw = Record<string, unknown>;

const userLabel = (user: SessionUser) => (user.name ? `${user.name} (${user.email})` : user.email);

const asRaw = (source: unknown): Raw => (typeof source === 'object' && source !== null ? (source as Raw) : {});
const field = (raw: Raw, name: string): string | undefined => {
  const value = Object.hasOwn(raw, name) ? raw[name] : undefined;
  return typeof value === 'string' ? value : undefined;
};

export async function devicePages(app: FastifyInstance, { db, config, resources }: DevicePagesDeps): Promise<void> {
  await setUpPages(app, config);
  const perUser = new FailureThrottle(WRONG_CODES_PER_USER, GUESS_WINDOW_MS);
  const perAddress = new FailureThrottle(WRONG_CODES_PER_IP, GUESS_WINDOW_MS);

  const throttleKeys = (req: FastifyRequest, user: SessionUser) => ({ user: String(user.userId), address: addressGroup(clientAddress(req)) });

  /** 429 while this user or this address has entered too many wrong codes. */
  function refuseIfThrottled(req: FastifyRequest, user: SessionUser): void {
    const keys = throttleKeys(req, user);
    const retryAfter = Math.max(perUser.retryAfter(keys.user), perAddress.retryAfter(keys.address));
    if (retryAfter > 0) throw new TooManyAttemptsError(retryAfter, `Too many wrong codes. Wait ${retryAfter} seconds, then enter the code your device shows.`);
  }

  const codeForm = (reply: FastifyReply, status: number, user: SessionUser, userCode: string, error?: string) =>
    renderPage(reply, status, 'device', {
      title: 'Connect a device',
      userLabel: userLabel(user),
      userCode,
      error,
      csrfToken: csrfToken(config, { session: user.sessionId }),
    });

  /** The pending authorization the form names, or the code form again with an error (and the wrong guess counted). */
  async function lookUp(req: FastifyRequest, reply: FastifyReply, user: SessionUser, raw: Raw): Promise<{ found: PendingDeviceAuthorization; resource: TokenResource } | FastifyReply> {
    refuseIfThrottled(req, user);
    const typed = field(raw, 'user_code') ?? '';
    const code = normalizeUserCode(typed);
    const found = code === undefined ? undefined : await findPendingDeviceAuthorization(db, code);
    // Deleted resources take their authorizations with them; one deleted a moment ago is as gone.
    const resource = found === undefined ? undefined : await resources.byId(found.resourceId);
    if (!found || !resource) {
      const keys = throttleKeys(req, user);
      perUser.recordFailure(keys.user);
      perAddress.recordFailure(keys.address);
      req.log.info({ user_id: user.userId }, 'wrong device user code');
      return codeForm(reply, 400, user, typed.slice(0, 20), NOT_FOUND);
    }
    return { found, resource };
  }

  async function renderConsent(reply: FastifyReply, user: SessionUser, found: PendingDeviceAuthorization, resource: TokenResource, memberships: readonly UserOrganization[]) {
    const hasFactor = hasSecondFactor(await factorSummary(db, user.userId));
    const shown = formatUserCode(found.userCode);
    const returnTo = `${DEVICE_PAGE_PATH}?${new URLSearchParams({ user_code: shown }).toString()}`;
    const organizations = organizationChoices({ memberships, user, scopes: found.scopes, identityScopes: found.identityScopes, resource, hasFactor, returnTo });
    return renderPage(reply, 200, 'device-consent', {
      title: `Connect ${found.application.name}`,
      applicationName: found.application.name,
      // Nobody at this server vouched for a client that registered itself.
      unverified: found.application.registration !== 'developer',
      clientId: found.application.clientId,
      userLabel: userLabel(user),
      userCode: shown,
      resource: resource.id === null ? null : { name: resource.name, uri: resource.uri },
      scopes: describeScopes([...found.identityScopes, ...found.scopes], resource),
      organizations,
      anyChoosable: organizations.some((o) => o.choosable),
      preselected: preselectedOrganization(organizations, user),
      csrfToken: csrfToken(config, { session: user.sessionId }),
      hasSecondFactor: hasFactor,
    });
  }

  const done = (reply: FastifyReply, title: string, message: string) => renderPage(reply, 200, 'message', { title, message });

  app.get(DEVICE_PAGE_PATH, async (req, reply) => {
    const user = await currentUser(db, config, req);
    // Signed in first; the login page brings the browser back here, with the code.
    if (!user) return reply.redirect(loginPath(req.url), 303);
    const typed = field(asRaw(req.query), 'user_code');
    const code = typed === undefined ? undefined : normalizeUserCode(typed);
    return codeForm(reply, 200, user, code === undefined ? '' : formatUserCode(code));
  });

  app.post(DEVICE_PAGE_PATH, async (req, reply) => {
    const raw = asRaw(req.body);
    const user = await currentUser(db, config, req);
    if (!user) throw new ForbiddenError('Your session has ended. Sign in and enter the code again.');
    if (!csrfTokenMatches(config, { session: user.sessionId }, raw.csrf_token)) throw new ForbiddenError(CSRF_FAILED);
    const looked = await lookUp(req, reply, user, raw);
    if (!('found' in looked)) return looked;
    const { found, resource } = looked;
    const decision = raw.decision;
    const memberships = await listUserOrganizations(db, user.userId);
    if (decision === undefined) {
      if (memberships.length === 0) {
        return renderPage(reply, 403, 'error', {
          title: 'No organization',
          message: `You are not a member of any organization, so ${found.application.name} cannot be given access. Ask an administrator to add you to one.`,
        });
      }
      return renderConsent(reply, user, found, resource, memberships);
    }

    // AZ-8: the organization comes from the form, so it is checked against the memberships as they are now.
    const organizationId = parseCanonicalId(field(raw, 'organization_id') ?? '');
    const membership = organizationId === undefined ? undefined : memberships.find((o) => o.id === organizationId);
    const details = {
      client_id: found.application.clientId,
      application_id: found.application.id,
      device: true,
      ...(found.identityScopes.length > 0 ? { identity_scopes: found.identityScopes.join(' ') } : {}),
      ...(resource.id !== null ? { resource: resource.uri } : {}),
    };
    if (decision === 'deny') {
      const denied = await inTransaction(db, async (trx) => {
        if (!(await denyDeviceAuthorization(trx, found.id, user.userId))) return false;
        // Audited in the organization the form had selected, when it is one of the user's.
        if (membership) {
          await recordAuditEvent(trx, {
            organizationId: membership.id,
            action: 'authorization.denied',
            actor: { actorUserId: user.userId, actorClientId: found.application.clientId },
            details: { ...details, scopes: found.scopes.join(' ') },
          });
        }
        return true;
      });
      if (denied) req.log.info({ client_id: found.application.clientId }, 'device authorization denied');
      return done(reply, 'Access denied', `${found.application.name} was not given access. You can return to your device.`);
    }
    if (decision !== 'approve') throw new InvalidRequestError('Choose Allow or Deny.');
    if (organizationId === undefined) throw new InvalidRequestError('Choose an organization.');
    if (!membership) throw new ForbiddenError('You are not a member of the organization you chose.');
    const shortfall = sessionShortfall(membership, user);
    if (shortfall === 'sso') throw new ForbiddenError(`${ssoRequiredMessage(membership.name)} Sign in through it and enter the code again.`);
    if (shortfall === 'two_factors') throw new ForbiddenError(`${membership.name} requires two-step sign-in. Sign in with two steps and enter the code again.`);
    // The role as it is now, not as the page showed it.
    const { granted } = grantableByRole(found.scopes, membership.access);
    if (granted.length === 0 && found.scopes.length > 0) {
      throw new ForbiddenError(`Your role in ${membership.name} (${membership.role}) allows none of the access ${found.application.name} asks for.`);
    }
    const approved = await inTransaction(db, async (trx) => {
      const recorded = await approveDeviceAuthorization(trx, found.id, {
        userId: user.userId,
        organizationId: membership.id,
        grantedScopes: granted,
        authTime: user.authTime,
        amr: user.amr,
        ssoConnectionId: user.ssoConnectionId,
      });
      if (!recorded) return false;
      await recordAuditEvent(trx, {
        organizationId: membership.id,
        action: 'authorization.approved',
        actor: { actorUserId: user.userId, actorClientId: found.application.clientId },
        details: { ...details, scopes: granted.join(' '), ...(granted.length < found.scopes.length ? { requested_scopes: found.scopes.join(' ') } : {}) },
      });
      return true;
    });
    // Decided a moment ago in another tab, or expired while the page was open.
    if (!approved) return codeForm(reply, 400, user, '', NOT_FOUND);
    req.log.info({ client_id: found.application.clientId, organization_id: membership.id }, 'device authorization approved');
    req.server.activity.count(membership.id, 'consents');
    return done(reply, 'Device connected', `${found.application.name} now has access to ${membership.name}. You can return to your device.`);
  });
}
