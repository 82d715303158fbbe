import { type RawBuilder, sql } from 'kysely';
import { type DB, preparedStatement } from '../../db/connect.js';
import type { Application } from '../../db/schema.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';
import { UnauthorizedClientError, InvalidGrantError, InvalidTargetError } from '../errors.js';
import { knownScopesOf } from '../helpers/scopes.js';
import { isDeclaredScope, type TokenResource } from '../models/resources.js';
import { requireParam } from '../helpers/params.js';
import { PKCE_VALUE, s256, verifyPkce } from '../helpers/pkce.js';
import { type GrantIdentity, redeemedTokenResponse, type TokenContext } from './token-response.js';
import type { GrantHandler } from './types.js';
import { memberHoldsScopesSql, roleHoldsScope, roleOf } from '../../accounts/roles.js';
import { grantWithRefreshTokenSql, liveSuccessor } from '../models/grants.js';
import { ssoAllows, ssoAllowsSql } from '../../sso/required.js';

/** The scopes the code's user may still grant: their role's permissions now (share-locked with the membership). */
const MEMBER_HOLDS = (scopes: RawBuilder<string[]>) => memberHoldsScopesSql(scopes, sql`m.role`, sql`(select r.permissions from roles r where r.id = m.role_id for share)`);

interface Redeemed extends GrantIdentity {
  grant_id: number;
  /** The member's custom role, if any: the access token names it (role_id). */
  role_id: number | null;
  resource_id: number | null;
  organization_id: number;
  organization_name: string;
  user_id: number;
  scopes: string[];
  nonce: string | null;
}

interface Presented {
  code: string;
  redirectUri: string;
  verifier: string | undefined;
  /** The resource the token request names (RFC 8707): the one the authorization was for, or invalid_target. */
  resource: TokenResource | undefined;
  /** The key of the request's DPoP proof: the code's dpop_jkt must be it (RFC 9449 §10), and the grant is bound to it. */
  dpopJkt: string | null;
}

/**
 * The challenge the stored one must equal: null for no verifier (a code issued without PKCE),
 * and for a malformed verifier a value no stored challenge can have.
 */
function expectedChallenge(verifier: string | undefined): string | null {
  if (verifier === undefined) return null;
  return PKCE_VALUE.test(verifier) ? s256(verifier) : '!';
}

/**
 * Consumes the code and creates its grant and the first refresh token, in one statement (one
 * round trip; all or nothing, R-5), when the code is this client's,
 * unused, unexpired, for this redirect_uri and PKCE verifier, its user still a member of the
 * organization whose role still allows every scope of it (the membership row, and a custom
 * role's, are share-locked, so a removal or a role change waits for us and then ends (its job
 * revokes) or narrows the new grant) and its scopes still allowed to the application. Returns undefined otherwise,
 * changing nothing. Of concurrent redemptions exactly one updates the code (R-1).
 */
const REDEEM = preparedStatement<
  {
    codeHash: string;
    applicationId: number;
    redirectUri: string;
    challenge: string | null;
    anyResource: boolean;
    resourceId: number | null;
    dpopJkt: string | null;
    refreshTokenHash: string;
    ttlSeconds: number;
  },
  Redeemed
>(
  'redeem_code',
  (v) => sql`
    with found as (
      select c.id, c.organization_id, c.user_id, c.scopes, c.identity_scopes, c.nonce, c.auth_time, c.sid, c.amr, c.resource_id
      from authorization_codes c
      where c.code_hash = ${v.codeHash} and c.application_id = ${v.applicationId}
        and c.consumed_at is null and c.expires_at > now() and c.redirect_uri = ${v.redirectUri}
        and c.code_challenge is not distinct from ${v.challenge}::text
        and (${v.anyResource}::boolean or c.resource_id is not distinct from ${v.resourceId}::integer)
        and (c.dpop_jkt is null or c.dpop_jkt = ${v.dpopJkt}::text)
        -- The application as it is now, not as cached: disabled or narrowed since, it gains no grant.
        and exists (select 1 from applications a where a.id = c.application_id and not a.disabled and ${knownScopesOf(sql`c.scopes`)} <@ a.scopes)
        -- An organization that requires two-step sign-in (as it is now) takes only codes of a two-factor sign-in.
        and ('mfa' = any(c.amr) or not (select o.require_mfa from organizations o where o.id = c.organization_id))
        -- SS-4: one that requires its single sign-on of the user (as it is now) takes only codes of a sign-in through it.
        and ${ssoAllowsSql(sql`c.organization_id`, sql`c.user_id`, sql`c.sso_connection_id`)}
    ),
    member as (
      select m.organization_id, m.role_id from memberships m join found f on m.organization_id = f.organization_id and m.user_id = f.user_id
      -- The role as it is now: changed since consent (a role change locks the row; we then see the new one), it must still allow every scope.
      where ${MEMBER_HOLDS(sql`f.scopes`)}
      for share of m
    ),
    consumed as (
      update authorization_codes c set consumed_at = now(), grant_id = nextval(pg_get_serial_sequence('grants', 'id'))
      from found, member
      where c.id = found.id and c.consumed_at is null
      returning c.grant_id, c.organization_id, c.user_id, c.scopes, c.identity_scopes, c.nonce, c.auth_time, c.sid, c.amr, c.resource_id, c.sso_connection_id
    ),
    ${grantWithRefreshTokenSql({ applicationId: v.applicationId, refreshTokenHash: v.refreshTokenHash, ttlSeconds: v.ttlSeconds, dpopJkt: v.dpopJkt })}
    select c.grant_id, c.resource_id, c.organization_id, o.name as organization_name, c.user_id, c.scopes, (select role_id from member) as role_id,
      c.identity_scopes, c.nonce, c.auth_time, c.sid, c.amr, u.email, u.name, u.email_verified_at is not null as email_verified
    from consumed c join organizations o on o.id = c.organization_id join users u on u.id = c.user_id
    where exists (select 1 from refresh)`,
);

/** REDEEM with a token request's values. */
async function redeemCode(db: DB, application: Application, presented: Presented, refreshToken: string, ttlSeconds: number): Promise<Redeemed | undefined> {
  const rows = await REDEEM(db, {
    codeHash: sha256Hex(presented.code),
    applicationId: application.id,
    redirectUri: presented.redirectUri,
    challenge: expectedChallenge(presented.verifier),
    anyResource: presented.resource === undefined,
    resourceId: presented.resource?.id ?? null,
    dpopJkt: presented.dpopJkt,
    refreshTokenHash: sha256Hex(refreshToken),
    ttlSeconds,
  });
  return rows[0];
}

/**
 * Why a code was not redeemed, as the error to answer with. A code presented again revokes the
 * grant its first redemption created (CD-1, RFC 6749 §4.1.2); so does losing a race with a
 * concurrent redemption, which is a second redemption too.
 */
async function refusal(ctx: TokenContext, application: Application, presented: Presented): Promise<Error> {
  const row = await ctx.db
    .selectFrom('authorization_codes as c')
    .selectAll('c')
    .select(sql<boolean>`c.expires_at <= now()`.as('expired'))
    .where('c.code_hash', '=', sha256Hex(presented.code))
    .executeTakeFirst();
  // A code of another client is as good as unknown to this one (CD-3), and is left alone.
  if (!row || row.application_id !== application.id) return new InvalidGrantError();
  if (row.consumed_at !== null) {
    if (row.grant_id !== null) {
      // The grant it made, or what a role change narrowed that into.
      const live = (await liveSuccessor(ctx.db, row.grant_id)) ?? row.grant_id;
      await ctx.revocations.revoke(live, 'code_replay', { actorClientId: application.client_id });
    }
    return new InvalidGrantError('the authorization code was already used');
  }
  if (row.expired) return new InvalidGrantError('the authorization code expired');
  if (row.dpop_jkt !== null && row.dpop_jkt !== presented.dpopJkt) {
    return new InvalidGrantError(presented.dpopJkt === null ? 'the authorization code is bound to a DPoP key: send a DPoP proof' : 'the authorization code is bound to another DPoP key');
  }
  if (presented.resource !== undefined && row.resource_id !== presented.resource.id) return new InvalidTargetError('resource is not the one the authorization was for');
  if (row.redirect_uri !== presented.redirectUri) return new InvalidGrantError('redirect_uri does not match the authorization request');
  if (row.code_challenge === null) {
    // PK-3: a verifier for a code issued without a challenge is a downgrade attempt.
    if (presented.verifier !== undefined) return new InvalidGrantError('code_verifier sent for a code issued without code_challenge');
  } else if (!verifyPkce(presented.verifier, row.code_challenge)) {
    return new InvalidGrantError('code_verifier is missing or does not match the code_challenge');
  }
  if (!row.amr.includes('mfa')) {
    const organization = await ctx.db.selectFrom('organizations').select('require_mfa').where('id', '=', row.organization_id).executeTakeFirst();
    if (organization?.require_mfa) return new InvalidGrantError('the organization requires two-step sign-in, and the user signed in with one step; start a new authorization');
  }
  if (!(await ssoAllows(ctx.db, { organizationId: row.organization_id, userId: row.user_id, ssoConnectionId: row.sso_connection_id }))) {
    return new InvalidGrantError('the organization requires the user to sign in through its identity provider; start a new authorization');
  }
  // The user may have left the organization, or the application lost scopes, since consent.
  if (!row.scopes.every((s) => isDeclaredScope(s) || application.scopes.includes(s))) return new InvalidGrantError('the application may no longer use the scope granted');
  const member = await ctx.db
    .selectFrom('memberships')
    .leftJoin('roles', 'roles.id', 'memberships.role_id')
    .select(['memberships.role', 'memberships.role_id', 'roles.permissions as role_permissions'])
    .where('memberships.organization_id', '=', row.organization_id)
    .where('memberships.user_id', '=', row.user_id)
    .executeTakeFirst();
  if (!member) return new InvalidGrantError('the user is no longer a member of the organization');
  const role = roleOf(member);
  if (!row.scopes.every((s) => roleHoldsScope(role, s))) return new InvalidGrantError("the user's role in the organization no longer allows the scope granted; start a new authorization");
  return new InvalidGrantError('the authorization code could not be redeemed; start a new authorization');
}

/**
 * authorization_code (RFC 6749 §4.1.3). The code is consumed atomically, in the same statement
 * that creates the grant and its refresh token (R-5); a second redemption revokes what the
 * first one issued (CD-1, RFC 6749 §4.1.2).
 */
export const authorizationCode: GrantHandler = {
  grantType: 'authorization_code',
  async handle(ctx, { application }, params, { dpopJkt }) {
    // Private applications act for their organization only (client_credentials), never for users.
    if (application.type !== 'public') throw new UnauthorizedClientError('this grant type is for public applications');
    const presented: Presented = {
      code: requireParam(params, 'code'),
      // RFC 6749 §4.1.3: required here because /authorize requires it.
      redirectUri: requireParam(params, 'redirect_uri'),
      verifier: params.code_verifier,
      resource: params.resource === undefined ? undefined : await ctx.resources.resolve(params.resource),
      dpopJkt,
    };
    const signingKey = await ctx.keys.signingKey();
    const refreshToken = generateSecret(32);
    const redeemed = await redeemCode(ctx.db, application, presented, refreshToken, ctx.config.refreshTokenTtl);
    if (!redeemed) throw await refusal(ctx, application, presented);
    // Deleted since the code was issued: its grant went with it (on delete cascade).
    const resource = await ctx.resources.byId(redeemed.resource_id);
    if (!resource) throw new InvalidGrantError('the resource the authorization was for no longer exists');
    return redeemedTokenResponse(ctx, signingKey, { application, redeemed, resource, refreshToken, dpopJkt });
  },
};
