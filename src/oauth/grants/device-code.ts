import { type RawBuilder, sql } from 'kysely';
import { memberHoldsScopesSql } from '../../accounts/roles.js';
import type { DB } from '../../db/connect.js';
import { type Application, DEVICE_CODE_GRANT, type DeviceAuthorizationStatus } from '../../db/schema.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';
import { DeviceAuthorizationError, InvalidGrantError, InvalidTargetError, UnauthorizedClientError } from '../errors.js';
import { requireParam } from '../helpers/params.js';
import { knownScopesOf } from '../helpers/scopes.js';
import type { TokenResource } from '../models/resources.js';
import { grantWithRefreshTokenSql } from '../models/grants.js';
import { ssoAllowsSql } from '../../sso/required.js';
import { type GrantIdentity, redeemedTokenResponse, type TokenContext } from './token-response.js';
import type { GrantHandler } from './types.js';

/** The scopes the authorization's user may still grant: their role's permissions now (share-locked with the membership). */
const MEMBER_HOLDS = (scopes: RawBuilder<string[]>) => memberHoldsScopesSql(scopes, sql`m.role`, sql`(select r.permissions from roles r where r.id = m.role_id for share)`);
/** RFC 8628 §3.5: slow_down adds 5 seconds to the interval, for this and every later request. */
const SLOW_DOWN_SECONDS = 5;
/** A device code is 43 characters; anything much longer is no code of ours (and not worth hashing). */
const DEVICE_CODE_MAX_LENGTH = 200;

interface Polled {
  id: number;
  status: DeviceAuthorizationStatus;
  expired: boolean;
  too_fast: boolean;
  resource_id: number | null;
}

/**
 * Records a poll of this client's device code and says what it found. A pending authorization
 * polled again sooner than its interval gets its interval 5 seconds longer (slow_down). The row
 * is locked, so concurrent polls are counted one after the other.
 */
async function recordPoll(db: DB, application: Application, deviceCode: string): Promise<Polled | undefined> {
  const { rows } = await sql<Polled>`
    with found as (
      select d.id, d.status, d.expires_at <= now() as expired,
        d.status = 'pending' and d.expires_at > now() and coalesce(d.last_polled_at > now() - make_interval(secs => d.interval_s), false) as too_fast
      from device_authorizations d
      where d.device_code_hash = ${sha256Hex(deviceCode)} and d.application_id = ${application.id}
      for update
    )
    update device_authorizations d
    set last_polled_at = now(), interval_s = d.interval_s + case when found.too_fast then ${SLOW_DOWN_SECONDS}::int else 0 end
    from found
    where d.id = found.id
    returning found.id, found.status, found.expired, found.too_fast, d.resource_id`.execute(db);
  return rows[0];
}

interface Redeemed extends GrantIdentity {
  grant_id: number;
  role_id: number | null;
  organization_id: number;
  organization_name: string;
  user_id: number;
  scopes: string[];
}

/**
 * Consumes the approved authorization and creates its grant and the first refresh token, in one
 * statement (all or nothing, R-5), when it is still approved and unexpired, its client enabled
 * and still allowed what was granted, its user still a member of the organization whose role
 * (as it is now: the membership, and a custom role's row, are share-locked, so a removal or a
 * role change waits for us and then ends (its job revokes) or narrows the new grant) allows every scope of it,
 * and the organization, if it requires two-step sign-in, got a two-factor approval. Returns
 * undefined otherwise, changing nothing. Of concurrent redemptions exactly one updates the row.
 */
async function redeemApproved(
  db: DB,
  application: Application,
  id: number,
  resource: TokenResource,
  refreshToken: string,
  ttlSeconds: number,
  dpopJkt: string | null,
): Promise<Redeemed | undefined> {
  const { rows } = await sql<Redeemed>`
    with found as (
      select d.id, d.organization_id, d.user_id, d.granted_scopes as scopes
      from device_authorizations d
      where d.id = ${id} and d.application_id = ${application.id} and d.status = 'approved' and d.expires_at > now()
        and d.resource_id is not distinct from ${resource.id}::int
        -- The application and the resource as they are now: narrowed since, they give no grant. (A
        -- resource's declared names are not among an application's scopes: the resource bounds them.)
        and exists (select 1 from applications a where a.id = d.application_id and not a.disabled and ${knownScopesOf(sql`d.granted_scopes`)} <@ a.scopes)
        and d.granted_scopes <@ ${[...resource.scopes]}::text[]
        -- An organization that requires two-step sign-in (as it is now) takes only a two-factor approval.
        and ('mfa' = any(d.amr) or not (select o.require_mfa from organizations o where o.id = d.organization_id))
        -- SS-4: one that requires its single sign-on of the user takes only an approval signed in through it.
        and ${ssoAllowsSql(sql`d.organization_id`, sql`d.user_id`, sql`d.sso_connection_id`)}
    ),
    member as (
      select m.organization_id, m.role_id from memberships m join found f on m.organization_id = f.organization_id and m.user_id = f.user_id
      -- The role as it is now: changed since the approval (a role change locks the row; we then see the new one), it must still allow every scope.
      where ${MEMBER_HOLDS(sql`f.scopes`)}
      for share of m
    ),
    consumed as (
      update device_authorizations d set status = 'consumed', grant_id = nextval(pg_get_serial_sequence('grants', 'id'))
      from found, member
      where d.id = found.id and d.status = 'approved'
      -- No browser session on the device: no sid.
      returning d.grant_id, d.organization_id, d.user_id, d.granted_scopes as scopes, d.identity_scopes, d.auth_time, null::text as sid, d.amr, d.resource_id, d.sso_connection_id
    ),
    ${grantWithRefreshTokenSql({ applicationId: sql.val(application.id), refreshTokenHash: sql.val(sha256Hex(refreshToken)), ttlSeconds: sql.val(ttlSeconds), dpopJkt: sql.val(dpopJkt) })}
    select c.grant_id, c.organization_id, o.name as organization_name, c.user_id, c.scopes, (select role_id from member) as role_id,
      c.identity_scopes, c.auth_time, c.sid, c.amr, u.email, u.name, u.email_verified_at is not null as email_verified
    from consumed c join organizations o on o.id = c.organization_id join users u on u.id = c.user_id
    where exists (select 1 from refresh)`.execute(db);
  return rows[0];
}

/** Why an approved authorization was not redeemed, as the error to answer with. */
async function refusal(ctx: TokenContext, id: number): Promise<Error> {
  const row = await ctx.db
    .selectFrom('device_authorizations as d')
    .leftJoin('organizations as o', 'o.id', 'd.organization_id')
    .leftJoin('memberships as m', (join) => join.onRef('m.organization_id', '=', 'd.organization_id').onRef('m.user_id', '=', 'd.user_id'))
    .select(['d.status', 'd.amr', 'o.require_mfa', 'm.user_id as member'])
    .select(sql<boolean>`d.expires_at <= now()`.as('expired'))
    .select(ssoAllowsSql(sql`d.organization_id`, sql`d.user_id`, sql`d.sso_connection_id`).as('sso_allows'))
    .where('d.id', '=', id)
    .executeTakeFirst();
  // Gone (its client or resource deleted), or redeemed by a concurrent request: a second redemption.
  if (!row || row.status === 'consumed') return new InvalidGrantError('the device code was already used');
  if (row.expired) return new DeviceAuthorizationError('expired_token', 'the device code expired; start again');
  if (row.member === null) return new InvalidGrantError('the user is no longer a member of the organization; start again');
  if (row.require_mfa && !row.amr.includes('mfa')) return new InvalidGrantError('the organization requires two-step sign-in, and the user approved after one step; start again');
  if (!row.sso_allows) return new InvalidGrantError('the organization requires the user to sign in through its identity provider; start again');
  return new InvalidGrantError("the user's role or the client's registration no longer allows what was granted; start again");
}

/**
 * The device authorization grant (RFC 8628 §3.4, §3.5): the device polls with its device code
 * until the person on /device decides. The approved authorization is consumed atomically, in the
 * statement that creates the grant and its refresh token (R-5), so it yields tokens once.
 */
export const deviceCode: GrantHandler = {
  grantType: DEVICE_CODE_GRANT,
  async handle(ctx, { application }, params, { dpopJkt }) {
    if (application.type !== 'public' || !application.grant_types.includes(DEVICE_CODE_GRANT)) {
      throw new UnauthorizedClientError('this client is not registered for the device authorization grant');
    }
    const presented = requireParam(params, 'device_code');
    // RFC 8707: a resource named here must be the one the device asked for (compared below).
    const named = params.resource === undefined ? undefined : await ctx.resources.resolve(params.resource);
    // Another client's code is as unknown to this one as a made-up one, and is left alone.
    const polled = presented.length > DEVICE_CODE_MAX_LENGTH ? undefined : await recordPoll(ctx.db, application, presented);
    if (!polled) throw new InvalidGrantError('the device code is unknown or was issued to another client');
    if (named !== undefined && named.id !== polled.resource_id) {
      throw new InvalidTargetError('the resource is not the one the device authorization was for');
    }
    if (polled.status === 'consumed') throw new InvalidGrantError('the device code was already used');
    if (polled.status === 'denied') throw new DeviceAuthorizationError('access_denied', 'the user denied the request');
    if (polled.expired) throw new DeviceAuthorizationError('expired_token', 'the device code expired; start again');
    if (polled.status === 'pending') {
      if (polled.too_fast) throw new DeviceAuthorizationError('slow_down', `polled faster than the interval; wait ${SLOW_DOWN_SECONDS} seconds longer between requests from now on`);
      throw new DeviceAuthorizationError('authorization_pending', 'the user has not decided yet');
    }
    const resource = await ctx.resources.byId(polled.resource_id);
    if (!resource) throw new InvalidGrantError('the resource the device asked for no longer exists');
    const signingKey = await ctx.keys.signingKey();
    const refreshToken = generateSecret(32);
    const redeemed = await redeemApproved(ctx.db, application, polled.id, resource, refreshToken, ctx.config.refreshTokenTtl, dpopJkt);
    if (!redeemed) throw await refusal(ctx, polled.id);
    // No nonce: nothing on the device asked for an ID token bound to one.
    return redeemedTokenResponse(ctx, signingKey, { application, redeemed: { ...redeemed, nonce: null }, resource, refreshToken, dpopJkt });
  },
};
