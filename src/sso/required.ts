/**
 * SS-4, "SSO required" as one rule: an organization that verified a person's email domain, marked
 * it SSO required and has an active connection is reached by that person only through a sign-in
 * made through one of ITS active connections — not a password, not a passkey, not another
 * organization's identity provider. Checked wherever a sign-in is used for an organization: the
 * dashboard, consent (browser and device), code redemption and every refresh; what a sign-in
 * was made through travels with the session, the code and the grant (sso_connection_id).
 *
 * The domain is the account's own address's (its part after the @, lower-cased, as the
 * users_email_domain index and enforceSsoRequired read it). The fragments are spliced into other
 * statements, so their aliases are long names no caller uses. At most one organization verifies a
 * domain, so at most one organization requires SSO of a person.
 */
import { type Expression, sql } from 'kysely';
import type { DB } from '../db/connect.js';
import { ConflictError } from '../errors.js';
import { emailDomain } from './domains.js';

/** SQL: whether `organizationId` requires single sign-on of the person with address `email`. */
export function ssoRequiredSql(organizationId: Expression<number>, email: Expression<string>) {
  return sql<boolean>`exists (
    select 1 from sso_domains required_domain
    where required_domain.organization_id = ${organizationId} and required_domain.domain = split_part(lower(${email}), '@', 2)
      and required_domain.state = 'verified' and required_domain.sso_required
      and exists (select 1 from sso_connections active_connection where active_connection.organization_id = required_domain.organization_id and active_connection.state = 'active'))`;
}

/**
 * SQL: whether a sign-in of `userId` made through `ssoConnectionId` (null: not through SSO) may
 * be used for `organizationId`: the organization does not require SSO of the user, or the
 * connection is one of its active ones.
 */
export function ssoAllowsSql(organizationId: Expression<number>, userId: Expression<number>, ssoConnectionId: Expression<number | null>) {
  return sql<boolean>`(
    exists (select 1 from sso_connections signed_in_through where signed_in_through.id = ${ssoConnectionId} and signed_in_through.organization_id = ${organizationId} and signed_in_through.state = 'active')
    or not exists (select 1 from users required_user where required_user.id = ${userId} and ${ssoRequiredSql(organizationId, sql.ref('required_user.email'))}))`;
}

/** Whether a sign-in of `userId` through `ssoConnectionId` may be used for `organizationId` (see ssoAllowsSql). */
export async function ssoAllows(db: DB, input: { organizationId: number; userId: number; ssoConnectionId: number | null }): Promise<boolean> {
  const { rows } = await sql<{ allowed: boolean }>`select ${ssoAllowsSql(sql.val(input.organizationId), sql.val(input.userId), sql.val(input.ssoConnectionId))} as allowed`.execute(db);
  return rows[0]?.allowed === true;
}

/** What a person is told where an organization requires SSO of them and the sign-in was not through it. */
export function ssoRequiredMessage(organizationName: string): string {
  return `${organizationName} requires you to sign in through its identity provider.`;
}

/**
 * SS-4, the second way out: a member of an organization that requires SSO of their address may
 * not move their account to an address outside that domain while a member (a password would then
 * sign them in, and they would still be a member). Another address at the same domain is fine.
 * Checked when the change is asked for and again when its link is followed. Throws ConflictError.
 */
export async function checkEmailMayLeaveDomain(db: DB, user: { id: number; email: string }, newEmail: string): Promise<void> {
  if (emailDomain(newEmail) === emailDomain(user.email)) return;
  const holder = await db
    .selectFrom('memberships')
    .innerJoin('organizations', 'organizations.id', 'memberships.organization_id')
    .select('organizations.name')
    .where('memberships.user_id', '=', user.id)
    .where(ssoRequiredSql(sql.ref('organizations.id'), sql.val(user.email)))
    .limit(1)
    .executeTakeFirst();
  if (holder) {
    throw new ConflictError(`${holder.name} signs in your address through its identity provider, so it cannot be changed to one outside its domain while you are a member. Ask an administrator of ${holder.name}.`);
  }
}
