/**
 * Token exchange (RFC 8693, issue 44): an access token orgauth issued (the subject token) for an
 * access token to another registered resource, for the same user and organization.
 *
 * Who may exchange: the caller authenticates, and is the subject token's audience (a resource
 * calling the next service on the user's behalf) or the client it was issued to; and the target
 * resource allows the caller (`orgauth resource update --allow-exchange-from`, nobody by
 * default). A subject token that is itself delegated (it has `act`) is exchanged only by its
 * current actor (the outermost `act.sub`): the decision rests on the subject token's claims,
 * never on which parameters the request happens to carry.
 *
 * What comes out: `aud` the target; scopes within the subject token's, the target's and what the
 * user's role allows now; a lifetime within the subject token's remaining one and the target's;
 * no refresh token; DPoP-bound when the request has a proof. It keeps the subject token's grant
 * (`grant_id`): revoking the grant, removing the member or disabling the application ends it as
 * it ends the original. With an actor token (one of the caller's own live access tokens) it
 * carries `act: {"sub": <caller's client id>}`, nesting the subject token's `act`; without one,
 * the subject token's `act` is kept as it was. Every exchange is audited in the organization.
 */
import { recordAuditEvent } from '../../audit/events.js';
import { memberScopeTest } from '../../accounts/roles.js';
import { TOKEN_EXCHANGE_GRANT } from '../../db/schema.js';
import { InvalidRequestError } from '../../errors.js';
import { InvalidScopeError, InvalidTargetError, UnauthorizedClientError } from '../errors.js';
import { isIdentityScope } from '../helpers/scopes.js';
import type { Params } from '../helpers/params.js';
import { requireParam } from '../helpers/params.js';
import { type AccessTokenClaims, type ActClaim, actDepth, InvalidTokenError, MAX_ACT_DEPTH, signAccessToken, verifyAccessToken } from '../models/access-tokens.js';
import { isResourceClient } from '../models/resource-clients.js';
import type { TokenResource } from '../models/resources.js';
import { accessTokenStatus } from '../models/token-status.js';
import type { TokenContext } from './token-response.js';
import type { GrantHandler } from './types.js';

/** RFC 8693 §3: the only token type orgauth takes and issues here. */
export const ACCESS_TOKEN_TYPE_URN = 'urn:ietf:params:oauth:token-type:access_token';

/** An access token this server signed (not yet known to be live), or invalid_request naming which parameter (RFC 8693 §2.2.2). */
async function signedToken(ctx: TokenContext, params: Params, name: 'subject_token' | 'actor_token'): Promise<AccessTokenClaims> {
  const token = requireParam(params, name);
  const type = requireParam(params, `${name}_type`);
  if (type !== ACCESS_TOKEN_TYPE_URN) throw new InvalidRequestError(`${name}_type must be ${ACCESS_TOKEN_TYPE_URN}`);
  let claims: AccessTokenClaims;
  try {
    if (token.length > 8192) throw new InvalidTokenError('too long');
    claims = await verifyAccessToken(ctx.keys, ctx.config, token, 'any');
  } catch (err) {
    if (err instanceof InvalidTokenError) throw new InvalidRequestError(`${name} is not a valid access token of this server`);
    throw err;
  }
  return claims;
}

/** The token is live now (asked only once the caller may use it: no oracle for anyone else's tokens). */
async function liveStatus(ctx: TokenContext, claims: AccessTokenClaims, name: 'subject_token' | 'actor_token') {
  const status = await accessTokenStatus(ctx.db, ctx.findApplication, claims);
  if (!status.live) throw new InvalidRequestError(`${name} is not active`);
  return status;
}

/** The target: `resource` (RFC 8707) or `audience` naming a registered resource; both must name the same. */
async function target(ctx: TokenContext, params: Params): Promise<TokenResource> {
  if (params.resource === undefined && params.audience === undefined) throw new InvalidRequestError('name the target with resource (or audience)');
  const byResource = params.resource === undefined ? undefined : await ctx.resources.resolve(params.resource);
  const byAudience = params.audience === undefined ? undefined : await ctx.resources.resolve(params.audience).catch((err: unknown) => {
    throw err instanceof InvalidTargetError ? new InvalidTargetError('audience is not a resource registered at this authorization server') : err;
  });
  if (byResource && byAudience && byResource.uri !== byAudience.uri) throw new InvalidTargetError('resource and audience name different resources');
  const found = (byResource ?? byAudience)!;
  if (found.id === null) throw new InvalidTargetError('tokens for orgauth’s own API are not issued by exchange');
  return found;
}

export const tokenExchange: GrantHandler = {
  grantType: TOKEN_EXCHANGE_GRANT,
  // Not a grant a client registers (RFC 7591): the target resource's allow-list decides.
  registered: false,
  async handle(ctx, { application: caller, method }, params, { dpopJkt }) {
    if (method === 'none') throw new UnauthorizedClientError('token exchange needs client authentication');
    if (params.requested_token_type !== undefined && params.requested_token_type !== ACCESS_TOKEN_TYPE_URN) {
      throw new InvalidRequestError(`requested_token_type must be ${ACCESS_TOKEN_TYPE_URN}`);
    }
    if ((params.actor_token === undefined) !== (params.actor_token_type === undefined)) throw new InvalidRequestError('actor_token and actor_token_type go together');
    const subject = await signedToken(ctx, params, 'subject_token');
    const callerResource = isResourceClient(caller) ? await ctx.resources.byId(caller.resource_id) : undefined;

    // Who may exchange this token: its audience or its own client — and, when it is delegated,
    // only its current actor (by its claims, whatever the request carries).
    const audiences = Array.isArray(subject.aud) ? subject.aud : [subject.aud];
    const isAudience = callerResource !== undefined && audiences.includes(callerResource.uri);
    if (!isAudience && subject.client_id !== caller.client_id) throw new InvalidRequestError('subject_token was neither issued to this client nor for its resource');
    if (subject.act !== undefined && subject.act.sub !== caller.client_id) throw new InvalidRequestError('subject_token is delegated: only its current actor may exchange it');

    const resource = await target(ctx, params);
    if (audiences.includes(resource.uri)) throw new InvalidTargetError('the subject token is already for this resource');
    const allowed = resource.exchangeFrom.includes(caller.client_id) || (callerResource !== undefined && resource.exchangeFrom.includes(callerResource.uri));
    if (!allowed) throw new UnauthorizedClientError(`${resource.uri} does not accept tokens exchanged by this client`);
    const { organizationName, userId } = await liveStatus(ctx, subject, 'subject_token');

    let act: ActClaim | undefined = subject.act;
    if (params.actor_token !== undefined) {
      const actor = await signedToken(ctx, params, 'actor_token');
      if (actor.client_id !== caller.client_id) throw new InvalidRequestError('actor_token must be an access token of the client making the request');
      await liveStatus(ctx, actor, 'actor_token');
      act = { sub: caller.client_id, ...(subject.act ? { act: subject.act } : {}) };
      if (actDepth(act) > MAX_ACT_DEPTH) throw new InvalidRequestError(`a delegation chain holds at most ${MAX_ACT_DEPTH} actors`);
    }

    // Scopes: within the subject token's, the target's, and the user's role as it is now.
    const held = subject.scope.split(' ').filter((s) => s !== '' && !isIdentityScope(s));
    // The grant's user, not the token's sub: an application's own token (no user) has none, whoever it was exchanged by.
    const holds = userId === null ? () => true : await memberScopeTest(ctx.db, subject.organization_id, userId);
    if (!holds) throw new InvalidRequestError('subject_token is not active');
    const grantable = held.filter((s) => resource.scopes.includes(s) && holds(s));
    let scopes: string[];
    if (params.scope === undefined) scopes = grantable;
    else {
      const asked = [...new Set(params.scope.split(' ').filter((s) => s !== ''))];
      const refused = asked.filter((s) => !grantable.includes(s));
      if (asked.length === 0 || refused.length > 0) throw new InvalidScopeError(asked.length === 0 ? 'scope is empty' : `scope ${refused.map((s) => s.slice(0, 40)).join(' ')} is beyond the subject token, the target or the user's role`);
      scopes = grantable.filter((s) => asked.includes(s));
    }
    if (scopes.length === 0) throw new InvalidScopeError(`the subject token holds none of the scopes of ${resource.uri}`);

    const signingKey = await ctx.keys.signingKey();
    const { token, claims } = await signAccessToken(signingKey, ctx.config, {
      subject: subject.sub,
      clientId: caller.client_id,
      scopes,
      organizationId: subject.organization_id,
      grantId: subject.grant_id,
      resource,
      roleId: subject.role_id,
      dpopJkt,
      act,
      // Never past the subject token, whenever this is signed.
      notAfter: subject.exp,
    });
    if (claims.exp <= claims.iat) throw new InvalidRequestError('subject_token is not active');
    await recordAuditEvent(ctx.db, {
      organizationId: subject.organization_id,
      action: 'token.exchanged',
      actor: { actorClientId: caller.client_id },
      details: {
        client_id: caller.client_id,
        subject_client_id: subject.client_id,
        subject_aud: subject.aud,
        sub: subject.sub,
        resource: resource.uri,
        scope: scopes.join(' '),
        jti: claims.jti,
        ...(act ? { act } : {}),
      },
    });
    return {
      access_token: token,
      issued_token_type: ACCESS_TOKEN_TYPE_URN,
      token_type: dpopJkt ? 'DPoP' : 'Bearer',
      expires_in: claims.exp - claims.iat,
      scope: scopes.join(' '),
      organization_id: subject.organization_id,
      organization_name: organizationName,
    };
  },
};
