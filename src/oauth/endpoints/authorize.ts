/**
 * The authorization endpoint (RFC 6749 §4.1.1) and its consent form.
 *
 * GET /oauth/authorize checks the client and redirect_uri first: if either is wrong nothing is
 * redirected anywhere, the user sees an error page (AZ-2). Then the user must be signed in
 * before anything goes back to the client (AZ-6). Every other problem is reported to the
 * client on its redirect_uri (AZ-3). POST /oauth/authorize (the consent form) repeats every
 * check, verifies the CSRF token and the chosen organization (AZ-8), and answers with a 303.
 *
 * OpenID Connect (Core §3.1.2.1): prompt, max_age and id_token_hint decide whether a signed-in
 * user signs in again first (mustSignInAgain, with the login page's signed mark so it is asked
 * once); a consent given before is not asked again (rememberedConsent) unless prompt says so. The
 * consent form does not look at max_age again: a page left open longer still gives a code, with
 * the ID token's auth_time saying when the user really signed in.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { clientAddress } from '../../lib/client-address.js';
import { deriveKey } from '../../lib/crypto.js';
import { listUserOrganizations, type UserOrganization } from '../../accounts/organizations.js';
import { loginPath } from '../../web/sign-in.js';
import { describeScopes, grantableByRole, organizationChoices, preselectedOrganization } from '../../web/organization-choice.js';
import { csrfToken, csrfTokenMatches, currentUser, sessionSid, type SessionUser, signedInWithTwoFactors } from '../../accounts/sessions.js';
import { sessionShortfall } from '../../accounts/organization-access.js';
import { ssoRequiredMessage } from '../../sso/required.js';
import { factorSummary, hasSecondFactor } from '../../accounts/second-factors.js';
import { stepUpPath } from '../../web/second-step.js';
import { asksForTwoFactors } from '../helpers/acr.js';
import type { Config } from '../../config.js';
import { type DB, inTransaction } from '../../db/connect.js';
import type { Application } from '../../db/schema.js';
import { InvalidRequestError, sanitizeDescription } from '../../errors.js';
import { ForbiddenError, renderError, renderPage, setUpPages } from '../../web/render.js';
import { findApplicationByClientId } from '../models/applications.js';
import type { ClientMetadataDocuments } from '../models/client-metadata.js';
import { createAuthorizationCode } from '../models/authorization-codes.js';
import { consumePushedRequest, type PushedRequest, usePushedRequest } from '../models/pushed-requests.js';
import { codeTtlFor, requiresPar, requiresPkce } from '../helpers/fapi.js';
import { recordAuditEvent } from '../../audit/events.js';
import { InvalidScopeError, InvalidTargetError } from '../errors.js';
import { parseCanonicalId, readParams } from '../helpers/params.js';
import { redirectLocation, redirectUriMatches } from '../helpers/redirect-uris.js';
import { type IdentityScope, splitIdentityScopes } from '../helpers/scopes.js';
import { type ResourceRegistry, resourceScopes, type TokenResource } from '../models/resources.js';
import type { KeyStore } from '../models/key-store.js';
import { type IdTokenHint, verifyIdTokenHint } from '../models/id-tokens.js';

export const STATE_MIN_LENGTH = 16;
/** RFC 7636 §4.2: a code challenge is 43 to 128 unreserved characters. */
const CODE_CHALLENGE = /^[A-Za-z0-9\-._~]{43,128}$/;
/** The OAuth parameters the consent form carries back, in hidden fields. */
const CARRIED_PARAMS = ['client_id', 'redirect_uri', 'response_type', 'scope', 'state', 'code_challenge', 'code_challenge_method', 'nonce', 'acr_values', 'resource', 'dpop_jkt'] as const;
/**
 * Every parameter of an authorization request this endpoint reads (RFC 6749 §3.1: the others are
 * ignored): what /oauth/par keeps of a push. The ones the sign-in settles (prompt, max_age and the
 * hints) are not carried by the consent form, but a pushed request holds them.
 */
export const AUTHORIZATION_PARAMS: readonly string[] = [...CARRIED_PARAMS, 'prompt', 'max_age', 'login_hint', 'id_token_hint'];
/** A DPoP key thumbprint (RFC 7638, SHA-256, base64url). */
const JKT = /^[A-Za-z0-9_-]{43}$/;
/** What a form or the sign-in adds beside a pushed request's request_uri: never an authorization parameter. */
const BESIDE_PUSHED = ['csrf_token', 'decision', 'organization_id'] as const;
/** A user's newest live grants of one application looked at for a remembered consent (one per authorization they approved). */
const MAX_REMEMBERED_GRANTS = 100;
const PROMPT_VALUES: ReadonlySet<string> = new Set(['none', 'login', 'consent', 'select_account']);
const NONCE_MAX_LENGTH = 512;
const MAX_AGE = /^(0|[1-9][0-9]{0,9})$/;
/**
 * Set on the authorization request when the user is sent to sign in: `<time>.<mac>`. A sign-in
 * (a session created) at or after that second satisfies prompt=login, max_age and
 * id_token_hint, so the request, brought back by the login page, goes on instead of asking
 * again. The MAC (under SECRET_KEY) binds the time to this client and state, so whoever holds the
 * browser cannot write an old time in to skip the sign-in; a mark older than SIGN_IN_MARK_TTL_S
 * (a login page left open) counts for nothing, and prompt=none never honours one.
 */
const SIGNED_IN_AFTER = 'signed_in_after';
const SIGN_IN_MARK_TTL_S = 15 * 60;

function signInMarkMac(config: Pick<Config, 'secretKey'>, time: number, clientId: string, state: string): string {
  return createHmac('sha256', deriveKey(config.secretKey, 'signed-in-after')).update(`${time}|${clientId}|${state}`, 'utf8').digest('base64url').slice(0, 32);
}

/** The time of a valid mark for this client and state, or undefined. */
function readSignInMark(config: Pick<Config, 'secretKey'>, value: string | undefined, clientId: string, state: string): number | undefined {
  const match = value === undefined ? null : /^([0-9]{1,12})\.([A-Za-z0-9_-]{32})$/.exec(value);
  if (!match) return undefined;
  const time = Number(match[1]);
  const now = Math.floor(Date.now() / 1000);
  if (time > now + 60 || now - time > SIGN_IN_MARK_TTL_S) return undefined;
  const expected = Buffer.from(signInMarkMac(config, time, clientId, state));
  const actual = Buffer.from(match[2]!);
  return actual.length === expected.length && timingSafeEqual(actual, expected) ? time : undefined;
}

type Raw = Record<string, unknown>;

interface ClientTarget {
  application: Application;
  redirectUri: string;
}

interface AuthorizationRequest extends ClientTarget {
  /** What the token will be for (RFC 8707 `resource`; orgauth's API when none is named). */
  resource: TokenResource;
  /** What the user delegates: bounded by the resource, the application's scopes and the user's role. */
  scopes: string[];
  /** The OpenID scopes asked for (openid, profile, email): not bounded by roles. */
  identityScopes: IdentityScope[];
  nonce: string | null;
  /** OIDC Core §3.1.2.1 max_age in seconds, when sent. */
  maxAge: number | null;
  loginHint: string | undefined;
  idTokenHint: string | undefined;
  /** The sign-in this request was sent to (SIGNED_IN_AFTER), in seconds since the epoch. */
  signedInAfter: number | undefined;
  /** Required of a developer's application (AZ-4); optional for a client that registered itself, whose PKCE binds the response to it. */
  state: string | undefined;
  codeChallenge: string | null;
  /** OpenID Connect Core §3.1.2.1 `prompt`, as a set: none, login, consent, select_account. */
  prompt: ReadonlySet<string>;
  /** acr_values asks for two factors (helpers/acr.ts): a session with a password alone takes its second step first. */
  twoFactors: boolean;
  /** The carried parameters as sent, for the consent form's hidden fields (client_id and request_uri alone for a pushed request). */
  carried: { name: string; value: string }[];
  /** The pushed request (RFC 9126) this one came from: its code uses it up. */
  pushed: PushedRequest | undefined;
  /** RFC 9449 §10: the DPoP key the code will be bound to (dpop_jkt, or the pushed request's proof). */
  dpopJkt: string | null;
}

/** An error for the client, delivered on its redirect_uri (RFC 6749 §4.1.2.1). */
interface RedirectError {
  error:
    | 'invalid_request'
    | 'unsupported_response_type'
    | 'invalid_scope'
    | 'unauthorized_client'
    | 'access_denied'
    | 'login_required'
    | 'consent_required'
    | 'interaction_required'
    | 'request_not_supported'
    | 'request_uri_not_supported'
    | 'invalid_target';
  description: string;
  /** The state as sent, echoed even when it is what was wrong. */
  state: string | undefined;
}

/** Thrown for the errors that must not redirect (AZ-2): the error handler shows a 400 page. */
class UntrustedRedirectError extends InvalidRequestError {}

function asRaw(source: unknown): Raw {
  return typeof source === 'object' && source !== null ? (source as Raw) : {};
}

/** The first value sent for `name` (strings only), whatever else is wrong with the request. */
function firstValue(raw: Raw, name: string): string | undefined {
  const value = Object.hasOwn(raw, name) ? raw[name] : undefined;
  const first = Array.isArray(value) ? value[0] : value;
  return typeof first === 'string' && first !== '' ? first : undefined;
}

/** A parameter the error page depends on: exactly one non-empty string without NUL. */
function singleValue(raw: Raw, name: string): string | undefined {
  const value = Object.hasOwn(raw, name) ? raw[name] : undefined;
  if (Array.isArray(value)) throw new UntrustedRedirectError(`The ${name} parameter was sent more than once.`);
  if (typeof value !== 'string' || value === '') return undefined;
  if (value.includes('\u0000') || value.length > 2000) throw new UntrustedRedirectError(`The ${name} parameter is malformed.`);
  return value;
}

/**
 * AZ-1, AZ-2: the client must exist and be enabled, and redirect_uri must be one of its
 * registered URIs, byte for byte (RFC 9700 §2.1: no case folding, prefix or normalization).
 */
async function identifyClient(db: DB, clientMetadata: ClientMetadataDocuments, raw: Raw, ip: string): Promise<ClientTarget> {
  const clientId = singleValue(raw, 'client_id');
  if (clientId === undefined) throw new UntrustedRedirectError('The request does not name an application (client_id is missing).');
  // An https client_id is its metadata document's URL: fetched (or cached), checked and stored; a failure is an error page.
  const application = clientId.startsWith('https://') ? await clientMetadata.resolve(clientId, { ip }) : await findApplicationByClientId(db, clientId);
  if (!application || application.disabled) throw new UntrustedRedirectError('The application is unknown or has been disabled.');
  const redirectUri = singleValue(raw, 'redirect_uri');
  if (redirectUri === undefined) throw new UntrustedRedirectError('The request has no redirect_uri.');
  if (!application.redirect_uris.some((registered) => redirectUriMatches(registered, redirectUri))) {
    throw new UntrustedRedirectError('The redirect_uri is not registered for this application.');
  }
  return { application, redirectUri };
}

/**
 * A request by reference to a pushed one (RFC 9126 §4): its parameters as pushed, and only those
 * (any other authorization parameter sent beside request_uri is ignored), with client_id, which
 * must be the pushing client's. Unknown, expired, used or another client's: an error page, as
 * nothing in it can be trusted to redirect to. Without request_uri: the request as sent.
 */
async function expandPushed(db: DB, raw: Raw): Promise<{ raw: Raw; pushed: PushedRequest | undefined }> {
  const requestUri = singleValue(raw, 'request_uri');
  if (requestUri === undefined) return { raw, pushed: undefined };
  const clientId = singleValue(raw, 'client_id');
  if (clientId === undefined) throw new UntrustedRedirectError('The request does not name an application (client_id is missing).');
  const application = await findApplicationByClientId(db, clientId);
  const pushed = application ? await usePushedRequest(db, requestUri, application.id) : undefined;
  if (!pushed) throw new UntrustedRedirectError('This authorization request has expired or was already used (its request_uri is unknown). Go back to the application and start again.');
  const beside = Object.fromEntries([...BESIDE_PUSHED, SIGNED_IN_AFTER].filter((k) => Object.hasOwn(raw, k)).map((k) => [k, raw[k]]));
  return { raw: { ...pushed.params, ...beside, client_id: clientId, request_uri: requestUri }, pushed };
}

/** Everything else about the request; problems go back to the client (AZ-3). */
async function validateRequest(
  config: Pick<Config, 'secretKey'>,
  resources: ResourceRegistry,
  target: ClientTarget,
  raw: Raw,
  pushed: PushedRequest | undefined,
): Promise<AuthorizationRequest | RedirectError> {
  const sentState = firstValue(raw, 'state');
  const fail = (error: RedirectError['error'], description: string): RedirectError => ({ error, description, state: sentState });
  let params;
  try {
    params = readParams(raw); // AZ-5: repeats refused, empty = absent, unknown ignored
  } catch (err) {
    return fail('invalid_request', err instanceof InvalidRequestError ? err.description : 'the request parameters could not be read');
  }
  const { response_type: responseType, state, scope } = params;
  if (responseType === undefined) return fail('invalid_request', 'response_type is required');
  if (responseType !== 'code') return fail('unsupported_response_type', 'response_type must be code');
  // OIDC Core §6: request objects are not supported, and saying so beats ignoring what they hold.
  if (params.request !== undefined) return fail('request_not_supported', 'request objects are not supported');
  if (params.request_uri !== undefined && pushed === undefined) return fail('request_uri_not_supported', 'request_uri is only for pushed authorization requests');
  // RFC 9126 §6 (and FAPI 2.0): this application's requests come through /oauth/par only.
  if (pushed === undefined && requiresPar(target.application)) return fail('invalid_request', 'this application must push its authorization requests to the pushed_authorization_request_endpoint and send request_uri');
  // The contract's rule for applications (AZ-4). A client that registered itself (MCP clients)
  // must use PKCE, which already ties the response to its request (RFC 9700 §2.1.1; OAuth 2.1
  // makes state optional with it): those that send no state, or a short one, still work.
  const selfRegistered = target.application.registration !== 'developer';
  if (state === undefined && !selfRegistered) return fail('invalid_request', 'state is required');
  if (state !== undefined && state.length < STATE_MIN_LENGTH && !selfRegistered) return fail('invalid_request', `state must be at least ${STATE_MIN_LENGTH} characters`);
  if (target.application.type !== 'public' || !target.application.grant_types.includes('authorization_code')) {
    return fail('unauthorized_client', 'this application may not use the authorization code grant');
  }
  let resource: TokenResource;
  try {
    resource = await resources.resolve(params.resource);
  } catch (err) {
    if (err instanceof InvalidTargetError) return fail('invalid_target', err.description);
    throw err;
  }
  // orgauth's API has no default scope; another resource's default is every scope it lists.
  if (scope === undefined && resource.id === null) return fail('invalid_scope', 'scope is required');
  let scopes: string[];
  let identityScopes: IdentityScope[];
  try {
    const { identity, rest } = splitIdentityScopes(scope ?? '');
    identityScopes = identity;
    // AD-1: a management scope is invalid_scope here: only private applications hold them (the
    // database's applications_management_scopes_check), and private ones stop above. Signing in
    // alone (openid and nothing else) delegates no data.
    // orgauth's API: the scope as sent (a blank one is invalid_scope); another resource: none sent means all it lists.
    scopes = rest === '' && identity.length > 0 ? [] : resourceScopes(rest === '' && (scope === undefined || resource.id !== null) ? undefined : rest, resource, target.application);
  } catch (err) {
    if (err instanceof InvalidScopeError) return fail('invalid_scope', err.description);
    throw err;
  }
  // RFC 7636, RFC 9700 §2.1.1: S256 only (PK-1); required when the application says so (PK-2).
  const challenge = params.code_challenge;
  const method = params.code_challenge_method;
  if (challenge === undefined) {
    if (method !== undefined) return fail('invalid_request', 'code_challenge_method was sent without code_challenge');
    // A client without a secret proves it is the one that asked only by PKCE.
    if (requiresPkce(target.application)) {
      return fail('invalid_request', 'this application requires PKCE: code_challenge is required');
    }
  } else {
    if (method !== 'S256') return fail('invalid_request', 'code_challenge_method must be S256');
    if (!CODE_CHALLENGE.test(challenge)) return fail('invalid_request', 'code_challenge must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~');
  }
  const prompt = new Set((params.prompt ?? '').split(' ').filter((v) => v !== ''));
  if ([...prompt].some((v) => !PROMPT_VALUES.has(v))) return fail('invalid_request', `prompt may hold ${[...PROMPT_VALUES].join(', ')}`);
  if (prompt.has('none') && prompt.size > 1) return fail('invalid_request', 'prompt=none cannot be combined with another value');
  const nonce = params.nonce ?? null;
  if (nonce !== null && nonce.length > NONCE_MAX_LENGTH) return fail('invalid_request', `nonce must be at most ${NONCE_MAX_LENGTH} characters`);
  const maxAge = params.max_age;
  if (maxAge !== undefined && !MAX_AGE.test(maxAge)) return fail('invalid_request', 'max_age must be a non-negative number of seconds');
  // RFC 9449 §10: the key the code is to be bound to; a pushed request's proof decides it when there was one.
  const sentJkt = params.dpop_jkt;
  if (sentJkt !== undefined && !JKT.test(sentJkt)) return fail('invalid_request', 'dpop_jkt must be a base64url SHA-256 JWK thumbprint');
  const dpopJkt = pushed?.dpopJkt ?? sentJkt ?? null;

  const carried = pushed
    ? [
        { name: 'client_id', value: target.application.client_id },
        { name: 'request_uri', value: params.request_uri! },
      ]
    : CARRIED_PARAMS.flatMap((name) => {
        const value = params[name];
        return value === undefined ? [] : [{ name, value }];
      });
  return {
    ...target,
    resource,
    scopes,
    identityScopes,
    nonce,
    maxAge: maxAge === undefined ? null : Number(maxAge),
    loginHint: params.login_hint,
    idTokenHint: params.id_token_hint,
    // prompt=none never comes back from the login page: a mark on it was not made by us for it.
    signedInAfter: prompt.has('none') ? undefined : readSignInMark(config, params[SIGNED_IN_AFTER], target.application.client_id, state ?? ''),
    state,
    codeChallenge: challenge ?? null,
    prompt,
    twoFactors: asksForTwoFactors(params.acr_values),
    carried,
    pushed,
    dpopJkt,
  };
}


/**
 * What /oauth/par checks of a request before it keeps it (RFC 9126 §2.1): what the authorization
 * endpoint would check (the redirect_uri registered, then everything else), so a client learns
 * of a bad request at once, in the PAR response, instead of on its redirect_uri later.
 */
export async function checkPushedRequest(
  config: Pick<Config, 'secretKey'>,
  resources: ResourceRegistry,
  application: Application,
  params: Record<string, string>,
  dpopJkt: string | null,
): Promise<{ error: string; description: string } | undefined> {
  const redirectUri = params.redirect_uri;
  if (redirectUri === undefined) return { error: 'invalid_request', description: 'redirect_uri is required' };
  if (!application.redirect_uris.some((registered) => redirectUriMatches(registered, redirectUri))) {
    return { error: 'invalid_request', description: 'redirect_uri is not registered for this application' };
  }
  const checked = await validateRequest(config, resources, { application, redirectUri }, params, { id: 0, params, dpopJkt });
  return 'error' in checked ? { error: checked.error, description: checked.description } : undefined;
}

/**
 * Whether an organization where the role lets the user grant `granted` of the request can be
 * chosen: something of the data asked for, or nothing asked for but signing in (OpenID scopes
 * alone), which every member may do.
 */
function canGrant(request: AuthorizationRequest, granted: readonly string[]): boolean {
  return granted.length > 0 || request.scopes.length === 0;
}

/**
 * The organization a user already approved this application in, and what to grant there now: a
 * live grant of theirs for the application whose scopes cover everything their role there lets
 * them grant of this request (requested ∩ application's scopes ∩ role). Exactly one such
 * organization, or none: with covering grants in several, the user chooses again (the consent
 * page), since nothing says which one the application means this time. A grant revoked (from
 * Connected apps, by an admin, by a role change) is forgotten consent.
 */
async function rememberedConsent(db: DB, userId: number, memberships: readonly UserOrganization[], request: AuthorizationRequest): Promise<{ organizationId: number; granted: string[] } | undefined> {
  const grants = await db
    .selectFrom('grants')
    .select(['organization_id', 'scopes', 'identity_scopes'])
    .where('user_id', '=', userId)
    .where('application_id', '=', request.application.id)
    // Consent for one resource is not consent for another.
    .where('resource_id', request.resource.id === null ? 'is' : '=', request.resource.id)
    .where('revoked_at', 'is', null)
    // Nor a grant from before a removal from its organization (its revocation job may not have reached it yet).
    .where(({ not, exists, selectFrom }) =>
      not(
        exists(
          selectFrom('removed_members as rm')
            .select('rm.user_id')
            .whereRef('rm.organization_id', '=', 'grants.organization_id')
            .whereRef('rm.user_id', '=', 'grants.user_id')
            .whereRef('rm.removed_at', '>=', 'grants.created_at'),
        ),
      ),
    )
    .orderBy('id', 'desc')
    .limit(MAX_REMEMBERED_GRANTS)
    .execute();
  if (grants.length === 0) return undefined;
  const covered = memberships.flatMap((o) => {
    const { granted } = grantableByRole(request.scopes, o.access);
    const remembered =
      canGrant(request, granted) &&
      grants.some((g) => g.organization_id === o.id && granted.every((s) => g.scopes.includes(s)) && request.identityScopes.every((s) => g.identity_scopes.includes(s)));
    return remembered ? [{ organizationId: o.id, granted }] : [];
  });
  return covered.length === 1 ? covered[0] : undefined;
}

/**
 * The request's own URL with SIGNED_IN_AFTER set to now, for this client and state when the
 * request is valid: where the login page brings the browser back.
 */
function afterSignIn(config: Pick<Config, 'secretKey'>, url: string, request: AuthorizationRequest | undefined): string {
  const question = url.indexOf('?');
  const query = new URLSearchParams(question === -1 ? '' : url.slice(question + 1));
  query.delete(SIGNED_IN_AFTER);
  if (request) {
    const now = Math.floor(Date.now() / 1000);
    query.set(SIGNED_IN_AFTER, `${now}.${signInMarkMac(config, now, request.application.client_id, request.state ?? '')}`);
  }
  return `${question === -1 ? url : url.slice(0, question)}?${query.toString()}`;
}

export async function authorizeEndpoint(app: FastifyInstance, { db, config, keys, resources, clientMetadata }: { db: DB; config: Config; keys: KeyStore; resources: ResourceRegistry; clientMetadata: ClientMetadataDocuments }): Promise<void> {
  await setUpPages(app, config);

  const redirectError = (reply: FastifyReply, redirectUri: string, e: RedirectError) =>
    reply.redirect(
      redirectLocation(redirectUri, { error: e.error, error_description: sanitizeDescription(e.description), state: e.state, iss: config.issuer }),
      303,
    );

  async function renderConsent(reply: FastifyReply, user: SessionUser, memberships: readonly UserOrganization[], request: AuthorizationRequest, returnTo: string) {
    if (memberships.length === 0) {
      return renderPage(reply, 403, 'error', {
        title: 'No organization',
        message: `You are not a member of any organization, so ${request.application.name} cannot be given access. Ask an administrator to add you to one.`,
      });
    }
    // Per organization, what the user's role there lets them grant; an organization where it
    // allows nothing asked for cannot be chosen, and when none can, the request ends here.
    const hasFactor = hasSecondFactor(await factorSummary(db, user.userId));
    const organizations = organizationChoices({ memberships, user, scopes: request.scopes, identityScopes: request.identityScopes, resource: request.resource, hasFactor, returnTo });
    if (!organizations.some((o) => o.choosable || o.needsTwoFactors || o.needsSso)) {
      return redirectError(reply, request.redirectUri, {
        error: 'access_denied',
        description: 'the user’s role allows none of the requested scopes in any of their organizations',
        state: request.state,
      });
    }
    return renderPage(reply, 200, 'consent', {
      title: `Authorize ${request.application.name}`,
      applicationName: request.application.name,
      userLabel: user.name ? `${user.name} (${user.email})` : user.email,
      scopes: describeScopes([...request.identityScopes, ...request.scopes], request.resource),
      organizations,
      preselected: preselectedOrganization(organizations, user),
      hidden: request.carried,
      redirectOrigin: new URL(request.redirectUri).origin,
      redirectHost: new URL(request.redirectUri).host,
      // Nobody at this server vouched for a client that registered itself: say so, and who it really is.
      unverified: request.application.registration !== 'developer',
      clientId: request.application.client_id,
      // Another resource than orgauth's API: the user sees what the access is for.
      resource: request.resource.id === null ? null : { name: request.resource.name, uri: request.resource.uri },
      csrfToken: csrfToken(config, { session: user.sessionId }),
      hasSecondFactor: hasFactor,
    });
  }

  /**
   * Issues the code for the user's approval in `organizationId` (the consent form's Allow, or a
   * consent remembered from before), audited as the user's decision: the grant row itself
   * records the code's redemption, so the token endpoint writes no audit row of its own.
   */
  async function approve(reply: FastifyReply, req: FastifyRequest, user: SessionUser, request: AuthorizationRequest, organizationId: number, granted: readonly string[], remembered: boolean) {
    const code = await inTransaction(db, async (trx) => {
      const issued = await createAuthorizationCode(trx, {
        organizationId,
        applicationId: request.application.id,
        userId: user.userId,
        redirectUri: request.redirectUri,
        scopes: granted,
        codeChallenge: request.codeChallenge,
        ttlSeconds: codeTtlFor(request.application, config.authCodeTtl),
        dpopJkt: request.dpopJkt,
        identityScopes: request.identityScopes,
        nonce: request.nonce,
        authTime: user.authTime,
        amr: user.amr,
        ssoConnectionId: user.ssoConnectionId,
        sid: sessionSid(user, request.application.client_id),
        resourceId: request.resource.id,
      });
      // A pushed request gives one code (RFC 9126 §4): a second tab or a replayed form gets none.
      if (request.pushed && !(await consumePushedRequest(trx, request.pushed.id))) {
        throw new ForbiddenError('This authorization request was already used. Go back to the application and start again.');
      }
      await recordAuditEvent(trx, {
        organizationId,
        action: 'authorization.approved',
        actor: { actorUserId: user.userId, actorClientId: request.application.client_id },
        details: {
          client_id: request.application.client_id,
          application_id: request.application.id,
          scopes: granted.join(' '),
          ...(request.identityScopes.length > 0 ? { identity_scopes: request.identityScopes.join(' ') } : {}),
          ...(granted.length < request.scopes.length ? { requested_scopes: request.scopes.join(' ') } : {}),
          ...(remembered ? { remembered: true } : {}),
          ...(request.resource.id !== null ? { resource: request.resource.uri } : {}),
        },
      });
      return issued;
    });
    req.log.info({ client_id: request.application.client_id, organization_id: organizationId, remembered }, 'authorization code issued');
    req.server.activity.count(organizationId, 'consents');
    return reply.redirect(redirectLocation(request.redirectUri, { code, state: request.state, iss: config.issuer }), 303);
  }

  /**
   * Whether the signed-in user must sign in again first (OIDC Core §3.1.2.1): prompt=login or
   * select_account, a sign-in older than max_age, or an id_token_hint naming someone else. A
   * sign-in made for this very request (SIGNED_IN_AFTER) satisfies all of them.
   */
  function mustSignInAgain(user: SessionUser, request: AuthorizationRequest, hint: IdTokenHint | undefined): boolean {
    const authTimeS = Math.floor(user.authTime.getTime() / 1000);
    if (request.signedInAfter !== undefined && authTimeS >= request.signedInAfter) return false;
    if (request.prompt.has('login') || request.prompt.has('select_account')) return true;
    // In milliseconds: max_age=0 means a sign-in for this very request, however recent the last one.
    if (request.maxAge !== null && Date.now() - user.authTime.getTime() > request.maxAge * 1000) return true;
    return hint !== undefined && hint.sub !== String(user.userId);
  }

  /** The id_token_hint, checked: one this provider issued to this very application. */
  async function readHint(request: AuthorizationRequest): Promise<IdTokenHint | RedirectError | undefined> {
    if (request.idTokenHint === undefined) return undefined;
    try {
      const hint = await verifyIdTokenHint(keys, config, request.idTokenHint);
      if (hint.clientId !== request.application.client_id) return { error: 'invalid_request', description: 'id_token_hint was issued to another application', state: request.state };
      return hint;
    } catch (err) {
      if (err instanceof InvalidRequestError) return { error: 'invalid_request', description: err.description, state: request.state };
      throw err;
    }
  }

  /** To the login page, which brings the browser back to this request, now marked as signed in for. */
  const toLogin = (reply: FastifyReply, req: FastifyRequest, request: AuthorizationRequest | undefined, again: boolean) =>
    reply.redirect(loginPath(afterSignIn(config, req.url, request), { again, loginHint: request?.loginHint }), 303);

  app.get('/oauth/authorize', async (req: FastifyRequest, reply) => {
    const { raw, pushed } = await expandPushed(db, asRaw(req.query));
    const target = await identifyClient(db, clientMetadata, raw, clientAddress(req));
    const user = await currentUser(db, config, req);
    const request = await validateRequest(config, resources, target, raw, pushed);
    if (!user) {
      // prompt=none: no page at all, so a signed-out user is login_required (OIDC Core §3.1.2.6).
      // (An invalid request says so only after sign-in, AZ-6, unless it asks for prompt=none alone.)
      if ('error' in request ? firstValue(raw, 'prompt') === 'none' : request.prompt.has('none')) {
        return redirectError(reply, target.redirectUri, 'error' in request ? request : { error: 'login_required', description: 'the user is not signed in', state: request.state });
      }
      // AZ-6: sign in first; the login page brings the browser back to this very request.
      // A fresh sign-in asked for (prompt=login, max_age) goes on to the page, and from it to a
      // company identity provider, which must not answer from a session of its own.
      const fresh = !('error' in request) && (request.prompt.has('login') || request.maxAge !== null);
      return toLogin(reply, req, 'error' in request ? undefined : request, fresh);
    }
    if ('error' in request) return redirectError(reply, target.redirectUri, request);
    const hint = await readHint(request);
    if (hint !== undefined && 'error' in hint) return redirectError(reply, target.redirectUri, hint);
    if (mustSignInAgain(user, request, hint)) {
      if (request.prompt.has('none')) {
        return redirectError(reply, target.redirectUri, { error: 'login_required', description: 'the user must sign in again', state: request.state });
      }
      return toLogin(reply, req, request, true);
    }
    // Signed in again and still not the user the application named: not who it asked for.
    if (hint !== undefined && hint.sub !== String(user.userId)) {
      return redirectError(reply, target.redirectUri, { error: 'login_required', description: 'the signed-in user is not the one id_token_hint names', state: request.state });
    }
    // OIDC Core §3.1.2.1 acr_values: two factors asked for, and this session has one.
    if (request.twoFactors && !signedInWithTwoFactors(user)) {
      if (request.prompt.has('none')) {
        return redirectError(reply, target.redirectUri, { error: 'interaction_required', description: 'the application asks for two-step sign-in', state: request.state });
      }
      return reply.redirect(stepUpPath(req.url), 303);
    }
    // The user's organizations with their roles, read once for both the remembered consent and the page.
    const memberships = await listUserOrganizations(db, user.userId);
    // Asked before for this application (and not revoked since): not asked again, unless the
    // application wants the page: prompt=consent, or select_account (the user signs in again and
    // chooses the organization again). prompt=login asks only for the sign-in, done above.
    if (!request.prompt.has('consent') && !request.prompt.has('select_account')) {
      // Not an organization this session may not reach (one that requires its SSO or two factors, of a session without).
      const reachable = memberships.filter((o) => sessionShortfall(o, user) === undefined);
      const remembered = await rememberedConsent(db, user.userId, reachable, request);
      if (remembered) return approve(reply, req, user, request, remembered.organizationId, remembered.granted, true);
    }
    if (request.prompt.has('none')) {
      return redirectError(reply, target.redirectUri, { error: 'consent_required', description: 'the user has not approved this request for one organization before', state: request.state });
    }
    return renderConsent(reply, user, memberships, request, req.url);
  });

  app.post('/oauth/authorize', async (req, reply) => {
    const { raw, pushed } = await expandPushed(db, asRaw(req.body));
    const target = await identifyClient(db, clientMetadata, raw, clientAddress(req));
    const user = await currentUser(db, config, req);
    if (!user) throw new ForbiddenError('Your session has ended. Go back to the application and start again.');
    const token = typeof raw.csrf_token === 'string' ? raw.csrf_token : undefined;
    if (!csrfTokenMatches(config, { session: user.sessionId }, token)) {
      throw new ForbiddenError('This form has expired or did not come from this site. Go back to the application and start again.');
    }
    const request = await validateRequest(config, resources, target, raw, pushed);
    if ('error' in request) return redirectError(reply, target.redirectUri, request);

    const decision = raw.decision;
    const denied = (organizationId: number) =>
      recordAuditEvent(db, {
        organizationId,
        action: 'authorization.denied',
        actor: { actorUserId: user.userId, actorClientId: request.application.client_id },
        details: {
          client_id: request.application.client_id,
          application_id: request.application.id,
          scopes: request.scopes.join(' '),
          ...(request.identityScopes.length > 0 ? { identity_scopes: request.identityScopes.join(' ') } : {}),
        },
      });
    // AZ-8: the organization comes from the form, so it is checked against the user's memberships.
    const organizationId = typeof raw.organization_id === 'string' ? parseCanonicalId(raw.organization_id) : undefined;
    const membership = organizationId === undefined ? undefined : (await listUserOrganizations(db, user.userId)).find((o) => o.id === organizationId);
    const isMember = membership !== undefined;
    if (decision === 'deny') {
      // Audited in the organization the form had selected, when it is one of the user's.
      if (organizationId !== undefined && isMember) await denied(organizationId);
      if (request.pushed) await consumePushedRequest(db, request.pushed.id);
      return redirectError(reply, target.redirectUri, { error: 'access_denied', description: 'the user denied the request', state: request.state });
    }
    if (decision !== 'approve') throw new InvalidRequestError('Choose Allow or Deny.');
    if (organizationId === undefined) throw new InvalidRequestError('Choose an organization.');
    if (!membership) throw new ForbiddenError('You are not a member of the organization you chose.');
    // SS-4 and two-step sign-in: checked again here, with the session and the organization as they are now.
    const shortfall = sessionShortfall(membership, user);
    if (shortfall === 'sso') throw new ForbiddenError(`${ssoRequiredMessage(membership.name)} Go back to the application and start again.`);
    if (shortfall === 'two_factors') throw new ForbiddenError(`${membership.name} requires two-step sign-in. Go back to the application and start again.`);
    // acr_values asked for two factors: checked again here, not only when the page was shown.
    if (request.twoFactors && !signedInWithTwoFactors(user)) throw new ForbiddenError('The application asks for two-step sign-in. Go back to the application and start again.');
    // The role as it is now, not as the page showed it.
    const { granted } = grantableByRole(request.scopes, membership.access);
    if (!canGrant(request, granted)) throw new ForbiddenError(`Your role in ${membership.name} (${membership.role}) allows none of the access ${request.application.name} asks for.`);
    return approve(reply, req, user, request, organizationId, granted, false);
  });
}
