import { sql } from 'kysely';
import { preparedStatement } from '../../db/connect.js';
import type { Application } from '../../db/schema.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';
import { UnauthorizedClientError, InvalidGrantError, InvalidScopeError, InvalidTargetError } from '../errors.js';
import { ssoAllows, ssoAllowsSql } from '../../sso/required.js';
import type { TokenResource } from '../models/resources.js';
import { findRefreshToken } from '../models/refresh-tokens.js';
import { type Params, requireParam } from '../helpers/params.js';
import { type GrantIdentity, userTokenResponse, type TokenContext } from './token-response.js';
import { isIdentityScope } from '../helpers/scopes.js';
import type { GrantHandler } from './types.js';
import { memberHoldsScopesSql, memberScopeTest, narrowMemberGrants } from '../../accounts/roles.js';

/** The permissions of membership `m` now; the grant's narrowing locks what it changes, so no lock here. */
const CUSTOM_PERMISSIONS = sql<string[] | null>`(select rr.permissions from roles rr where rr.id = m.role_id)`;

interface Rotated extends GrantIdentity {
  grant_id: number;
  role_id: number | null;
  resource_id: number | null;
  organization_id: number;
  organization_name: string;
  user_id: number;
  scopes: string[];
}

/**
 * Retires the presented refresh token and stores its successor, in one statement (one round
 * trip, atomic), when the token is this client's, live, unexpired, unused, its grant unrevoked
 * and `asked` within its scope: its row, or none, changing nothing.
 *
 * Concurrency: the grant row is locked before the token row (`retired` joins `live`), the order
 * revokeGrant locks them in, so a refresh and a revocation queue instead of deadlocking; a grant
 * revoked before us makes `live` empty, and a revocation after us also revokes the successor.
 * Of concurrent refreshes of one token exactly one updates it (R-2): the others re-check
 * `rotated_at is null` on the committed row and find nothing.
 */
const ROTATE = preparedStatement<
  {
    tokenHash: string;
    applicationId: number;
    asked: string[] | null;
    askedIdentity: string[] | null;
    anyResource: boolean;
    resourceId: number | null;
    dpopJkt: string | null;
    dpopSameKey: boolean;
    rotate: boolean;
    successorHash: string;
    ttlSeconds: number;
  },
  Rotated
>(
  'rotate_refresh_token',
  (v) => sql`
    with t as (
      select r.id, r.grant_id, r.organization_id, r.scopes, g.user_id, g.identity_scopes, g.auth_time, g.sid, g.amr, g.resource_id, m.role_id
      from refresh_tokens r
      join grants g on g.id = r.grant_id and g.organization_id = r.organization_id
      -- "+ 0": the membership is found from the grant, never the grant from the membership. With
      -- stale statistics the planner walked the user's live grants (grants_live_member_id_idx) to
      -- find the one the token names: 370 req/s instead of 2,060 on the bench.
      join memberships m on m.organization_id = r.organization_id and m.user_id = g.user_id + 0
      where r.token_hash = ${v.tokenHash}
        -- The user's role allows all of it now (a role that lost a permission is narrowing its
        -- members' grants, and may not have reached this one yet).
        and ${memberHoldsScopesSql(sql`r.scopes`, sql`m.role`, CUSTOM_PERMISSIONS)}
        -- "+ 0": the grant is reached by its key from the token, never by the application's
        -- grants. Planned with its values (unnamed statements, as behind PgBouncer) and stale
        -- statistics (an application whose 200,000 grants came after the last ANALYZE looks
        -- like it has one), the planner scanned all of them on every refresh: 505 req/s
        -- instead of 1,403 on the bench's large database.
        and g.application_id + 0 = ${v.applicationId} and g.user_id is not null
        and r.rotated_at is null and r.revoked_at is null and r.expires_at > now() and g.revoked_at is null
        and (${v.asked}::text[] is null or r.scopes @> ${v.asked}::text[])
        and (${v.askedIdentity}::text[] is null or g.identity_scopes @> ${v.askedIdentity}::text[])
        -- RFC 8707: a refresh names the grant's resource or none; it keeps the audience.
        and (${v.anyResource}::boolean or g.resource_id is not distinct from ${v.resourceId}::integer)
        -- An organization that requires two-step sign-in refreshes only grants of a two-factor sign-in.
        and ('mfa' = any(g.amr) or not (select o.require_mfa from organizations o where o.id = r.organization_id))
        -- SS-4: nor, where it requires its single sign-on of the user, a grant of a sign-in made another way.
        and ${ssoAllowsSql(sql`r.organization_id`, sql`g.user_id`, sql`g.sso_connection_id`)}
        -- Nor a grant from before the user's removal (they were added back since, and the job
        -- revoking what the removal ended has not reached it yet).
        and not exists (select 1 from removed_members rm where rm.organization_id = r.organization_id and rm.user_id = g.user_id and rm.removed_at >= g.created_at)
        -- RFC 9449 section 5: a DPoP grant is refreshed with a proof, and a public client's with the very key its tokens are bound to.
        and (g.dpop_jkt is null or (${v.dpopJkt}::text is not null and (not ${v.dpopSameKey}::boolean or g.dpop_jkt = ${v.dpopJkt}::text)))
    ),
    live as (
      -- The grant is bound to the key of this refresh's proof (a public client's was that key or
      -- none; a confidential client may have moved to a new one), so introspection's cnf and the
      -- next refresh follow it.
      update grants set last_used_at = now(), dpop_jkt = coalesce(${v.dpopJkt}::text, grants.dpop_jkt) from t
      where grants.id = t.grant_id and grants.revoked_at is null
      returning grants.id
    ),
    retired as (
      update refresh_tokens set rotated_at = now() from t, live
      where refresh_tokens.id = t.id and live.id = t.grant_id and ${v.rotate}::boolean
        and refresh_tokens.rotated_at is null and refresh_tokens.revoked_at is null
      returning refresh_tokens.id
    ),
    successor as (
      insert into refresh_tokens (token_hash, organization_id, grant_id, parent_id, scopes, expires_at)
      select ${v.successorHash}, t.organization_id, t.grant_id, t.id, t.scopes, now() + make_interval(secs => ${v.ttlSeconds})
      from t join retired on retired.id = t.id
      returning id
    )
    select t.grant_id, t.resource_id, t.organization_id, o.name as organization_name, t.user_id, t.scopes, t.role_id,
      t.identity_scopes, t.auth_time, t.sid, t.amr, u.email, u.name, u.email_verified_at is not null as email_verified
    from t join organizations o on o.id = t.organization_id join users u on u.id = t.user_id
    where exists (select 1 from successor) or (not ${v.rotate}::boolean and exists (select 1 from live))`,
);

/**
 * Why a refresh token was not rotated, as the error to answer with. A retired token presented
 * after the grace period is taken as stolen and its whole grant is revoked (RFC 9700 §4.14.2).
 * 'retry' when the token is live and unused now: a role change moved it to a narrower grant
 * while we were rotating it (narrowBatch), and rotating again succeeds. 'narrow' when it holds
 * scopes the user's role no longer allows and no narrowing has reached its grant yet (a role's
 * members are narrowed in batches, or the narrowing was interrupted): `narrow` names whose
 * grants to narrow first (narrowMemberGrants).
 */
async function refusal(
  ctx: TokenContext,
  application: Application,
  presented: string,
  asked: Asked | null,
  resource: TokenResource | undefined,
  dpop: { jkt: string | null; sameKey: boolean },
): Promise<Error | 'retry' | { narrow: { organizationId: number; userId: number } }> {
  const token = await findRefreshToken(ctx.db, presented);
  // RT-1: another client's refresh token is as good as unknown to this one.
  if (!token || token.application_id !== application.id || token.user_id === null) return new InvalidGrantError();
  if (resource !== undefined) {
    const grant = await ctx.db.selectFrom('grants').select('resource_id').where('id', '=', token.grant_id).executeTakeFirst();
    if (grant && grant.resource_id !== resource.id) return new InvalidTargetError('resource is not the one the refresh token was issued for');
  }
  if (token.revoked_at !== null || token.grant_revoked_at !== null || token.ended_by_removal) return new InvalidGrantError('the refresh token was revoked');
  if (token.expired) return new InvalidGrantError('the refresh token expired');
  if (token.dpop_jkt !== null && token.rotated_at === null) {
    if (dpop.jkt === null) return new InvalidGrantError('the refresh token is bound to a DPoP key: send a DPoP proof');
    if (dpop.sameKey && dpop.jkt !== token.dpop_jkt) return new InvalidGrantError('the refresh token is bound to another DPoP key');
  }
  if (token.rotated_at !== null) {
    if ((token.seconds_since_rotation ?? 0) > ctx.config.refreshReuseGrace) {
      await ctx.revocations.revoke(token.grant_id, 'refresh_token_reuse', { actorClientId: application.client_id });
      ctx.metrics.refreshReuse.inc({ outcome: 'grant_revoked' });
    } else {
      ctx.metrics.refreshReuse.inc({ outcome: 'refused' });
    }
    return new InvalidGrantError('the refresh token was already used');
  }
  if (!token.amr.includes('mfa')) {
    const organization = await ctx.db.selectFrom('organizations').select('require_mfa').where('id', '=', token.organization_id).executeTakeFirst();
    // A grant made before the organization required two factors is not refreshed: its user signs in again, with both.
    if (organization?.require_mfa) return new InvalidGrantError('the organization requires two-step sign-in; sign in again');
  }
  if (!(await ssoAllows(ctx.db, { organizationId: token.organization_id, userId: token.user_id, ssoConnectionId: token.sso_connection_id }))) {
    return new InvalidGrantError('the organization requires the user to sign in through its identity provider; sign in again');
  }
  if (asked !== null && !(asked.scopes.every((s) => token.scopes.includes(s)) && asked.identity.every((s) => token.identity_scopes.includes(s)))) {
    return new InvalidScopeError('scope may only narrow the scope of the refresh token');
  }
  const holds = await memberScopeTest(ctx.db, token.organization_id, token.user_id);
  // No longer a member: the removal is revoking the grant.
  if (!holds) return new InvalidGrantError('the refresh token was revoked');
  return token.scopes.every(holds) ? 'retry' : { narrow: { organizationId: token.organization_id, userId: token.user_id } };
}

/** A refresh request's `scope`: the scopes of data and the OpenID scopes asked for. */
interface Asked {
  scopes: string[];
  identity: string[];
}

/** RT-2: `scope` may narrow the refresh token's scope, never widen it; null when not sent. */
function askedScopes(params: Params): Asked | null {
  if (params.scope === undefined) return null;
  const asked = [...new Set(params.scope.split(' ').filter((s) => s !== ''))];
  if (asked.length === 0) throw new InvalidScopeError('scope may only narrow the scope of the refresh token');
  const identity = asked.filter((s) => isIdentityScope(s));
  // As in the authorization request: profile and email mean something only beside openid.
  if (identity.length > 0 && !identity.includes('openid')) throw new InvalidScopeError(`scope ${identity.join(' ')} needs openid`);
  return { scopes: asked.filter((s) => !isIdentityScope(s)), identity };
}

/**
 * refresh_token (RFC 6749 §6) with rotation and reuse detection (RFC 9700 §4.14.2): every use
 * retires the token and returns a new one. A retired token presented again within
 * REFRESH_REUSE_GRACE seconds (a client retrying a lost response) is refused; after that it is
 * taken as stolen and the whole grant is revoked.
 */
export const refreshToken: GrantHandler = {
  grantType: 'refresh_token',
  async handle(ctx, { application }, params, { dpopJkt }) {
    // Private applications act for their organization only (client_credentials), never for users.
    if (application.type !== 'public') throw new UnauthorizedClientError('this grant type is for public applications');
    const presented = requireParam(params, 'refresh_token');
    // A client without credentials proves it holds the refresh token's key; one that authenticates
    // proves who it is, and may move its tokens to a new key (RFC 9449 §5).
    const dpop = { jkt: dpopJkt, sameKey: application.token_endpoint_auth_method === 'none' };
    // FAPI 2.0 §5.3.2.1: no rotation; the refresh token stays, bound to the client's key and its private_key_jwt.
    const keepToken = application.fapi2;
    const asked = askedScopes(params);
    const named = params.resource === undefined ? undefined : await ctx.resources.resolve(params.resource);
    const signingKey = await ctx.keys.signingKey();
    const successor = generateSecret(32);
    const values = {
      tokenHash: sha256Hex(presented),
      applicationId: application.id,
      asked: asked === null ? null : asked.scopes,
      askedIdentity: asked === null ? null : asked.identity,
      anyResource: named === undefined,
      resourceId: named?.id ?? null,
      dpopJkt: dpop.jkt,
      dpopSameKey: dpop.sameKey,
      rotate: !keepToken,
      successorHash: sha256Hex(successor),
      ttlSeconds: ctx.config.refreshTokenTtl,
    };
    const rotate = async (): Promise<Rotated | undefined> => (await ROTATE(ctx.db, values))[0];
    let rotated = await rotate();
    if (!rotated) {
      const refused = await refusal(ctx, application, presented, asked, named, dpop);
      if (refused instanceof Error) throw refused;
      if (refused !== 'retry') await narrowMemberGrants(ctx.db, refused.narrow.organizationId, refused.narrow.userId, { revocations: ctx.revocations });
      rotated = await rotate();
      if (!rotated) {
        // Narrowed to nothing (the role allows none of it), or a concurrent refresh or revocation got there first.
        const again = await refusal(ctx, application, presented, asked, named, dpop);
        throw again instanceof Error ? again : new InvalidGrantError('the refresh token was already used');
      }
    }
    // The grant's resource, as it is now: deleted since, the grant went with it; its scopes narrowed
    // since, the access token gets only what it still lists.
    const resource = await ctx.resources.byId(rotated.resource_id);
    if (!resource) throw new InvalidGrantError('the resource the grant was for no longer exists');
    const scopes = (asked === null ? rotated.scopes : rotated.scopes.filter((s) => asked.scopes.includes(s))).filter((s) => resource.id === null || resource.scopes.includes(s));
    return userTokenResponse(ctx, signingKey, {
      grantId: rotated.grant_id,
      organizationId: rotated.organization_id,
      organizationName: rotated.organization_name,
      clientId: application.client_id,
      userId: rotated.user_id,
      roleId: rotated.role_id,
      // The new refresh token keeps the old one's scope (RFC 6749 §6); the access token may be narrower.
      accessScopes: scopes,
      resource,
      refreshToken: keepToken ? presented : successor,
      // OIDC Core §12.2: a new ID token with the same sub and auth_time (and sid), without a nonce.
      identity: { ...rotated, identity_scopes: asked === null ? rotated.identity_scopes : rotated.identity_scopes.filter((s) => asked.identity.includes(s)), nonce: null },
      idTokenAlg: application.id_token_signed_response_alg,
      dpopJkt,
    });
  },
};
