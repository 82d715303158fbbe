/**
 * Who an upstream identity is here (SS-1). An identity provider vouches for a subject; orgauth
 * finds the user by the link (connection, issuer, subject format, subject), never by email alone.
 *
 * The first time a subject arrives:
 * - its email names an existing account: the link is made only when the connection's
 *   organization verified that email's domain and the provider says the address is verified;
 *   otherwise the person proves the account (signs in with its password or passkey once, in the
 *   same browser) before the link is made. An IdP that can assert any address must not become a
 *   key to every account with that address (Keycloak #53041, ory/kratos#3574, nOAuth).
 * - nobody has that email: with just-in-time provisioning on and the domain verified by the
 *   organization, the user and the membership (the connection's default role) are made; an
 *   address outside the organization's verified domains is refused.
 * A linked user who is no longer a member of the organization is refused: removing a member
 * ends their SSO sign-in at once, and JIT never adds back someone an admin removed.
 */
import { sql, type Transaction } from 'kysely';
import type { Database } from '../db/schema.js';
import { recordAccountEvent, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import { endAccountTokens } from '../accounts/account-tokens.js';
import { addMember, wasRemoved } from '../accounts/organizations.js';
import { revokeGrantsInTransaction } from '../oauth/models/grants.js';
import { emailSchema, findUserByEmail, insertUser } from '../accounts/users.js';
import { defaultRoleOf } from './connections.js';
import { emailDomain, hasVerifiedDomain } from './domains.js';

/** What a provider said about the person, after every protocol check passed. */
export interface UpstreamIdentity {
  connectionId: number;
  /** OIDC: the ID token's iss; SAML: the assertion's Issuer (the IdP's entity ID). */
  issuer: string;
  /** SAML: the NameID Format; OIDC: ''. */
  subjectFormat: string;
  subject: string;
  email: string | undefined;
  /** Whether the provider says the address is its user's (OIDC email_verified; a SAML IdP's assertion). */
  emailVerified: boolean;
  name: string | undefined;
  /** RFC 8176 values the provider reported (OIDC amr), kept beside `fed`. */
  amr: string[];
}

export type RefusalReason = 'connection_inactive' | 'not_a_member' | 'email_missing' | 'email_unusable' | 'email_outside_verified_domains' | 'jit_off' | 'linked_to_another_subject';

export type Resolution =
  | { kind: 'signed_in'; userId: number; organizationId: number }
  | { kind: 'needs_proof'; userId: number; email: string; organizationId: number }
  | { kind: 'refused'; reason: RefusalReason; organizationId: number | undefined };

/** What the person is told for each refusal: enough to act on, nothing about other accounts. */
export const REFUSAL_MESSAGES: Record<RefusalReason, string> = {
  connection_inactive: 'This company sign-in is not active. Ask your administrator.',
  not_a_member: 'Your company account is not a member of this organization here. Ask an administrator of the organization to invite you.',
  email_missing: 'Your identity provider did not tell us your email address. Ask your administrator to release the email attribute.',
  email_unusable: 'Your identity provider sent an email address that cannot be matched safely (letters outside ASCII, or an address that differs from the account’s only by them). Ask your administrator.',
  email_outside_verified_domains: 'Your email address is not in a domain this organization has verified. Ask your administrator.',
  jit_off: 'This organization does not add people automatically. Ask an administrator of the organization to invite you.',
  linked_to_another_subject: 'Your account here is already linked to a different identity at this provider. Ask your administrator.',
};

/** The session's amr for a sign-in through a provider (RFC 8176 `fed`, and what the provider reported). */
export function federatedAmr(identity: Pick<UpstreamIdentity, 'amr'>): string[] {
  const known = new Set(['pwd', 'otp', 'hwk', 'swk', 'mfa', 'user', 'pin', 'fpt', 'face', 'sms', 'kba']);
  return ['fed', ...new Set(identity.amr.filter((v) => known.has(v)))].slice(0, 8);
}

/** The connection with its default role, share-locked: disabling it waits for this sign-in, or this sign-in sees it disabled. */
function lockConnection(trx: DB, connectionId: number) {
  return trx
    .selectFrom('sso_connections')
    .leftJoin('roles', 'roles.id', 'sso_connections.default_role_id')
    .select(['sso_connections.organization_id', 'sso_connections.state', 'sso_connections.jit', 'sso_connections.links_existing_accounts', 'sso_connections.default_role', 'sso_connections.default_role_id', 'roles.name as role_name', 'roles.permissions as role_permissions'])
    .where('sso_connections.id', '=', connectionId)
    .forShare('sso_connections')
    .executeTakeFirst();
}

async function refuse(trx: DB, organizationId: number | undefined, identity: UpstreamIdentity, reason: RefusalReason): Promise<Resolution> {
  if (organizationId !== undefined) {
    await recordAuditEvent(trx, {
      organizationId,
      action: 'sso.sign_in_refused',
      details: { connection_id: identity.connectionId, reason, subject: identity.subject.slice(0, 256), ...(identity.email !== undefined ? { email: identity.email.slice(0, 320) } : {}) },
    });
  }
  return { kind: 'refused', reason, organizationId };
}

/**
 * The account step of an SSO sign-in: finds, links or provisions the user for `identity`, under a
 * share lock on the connection (so a connection disabled meanwhile signs nobody in).
 */
export async function resolveUpstreamIdentity(db: DB, identity: UpstreamIdentity): Promise<Resolution> {
  return inTransaction(db, async (trx) => {
    const connection = await lockConnection(trx, identity.connectionId);
    if (!connection || connection.state !== 'active') return refuse(trx, connection?.organization_id, identity, 'connection_inactive');
    const organizationId = connection.organization_id;

    const link = await trx
      .selectFrom('sso_identities')
      .select(['id', 'user_id'])
      .where('connection_id', '=', identity.connectionId)
      .where('issuer', '=', identity.issuer)
      .where('subject_format', '=', identity.subjectFormat)
      .where('subject', '=', identity.subject)
      .executeTakeFirst();
    if (link) {
      if (!(await isMember(trx, organizationId, link.user_id))) return refuse(trx, organizationId, identity, 'not_a_member');
      await trx.updateTable('sso_identities').set({ last_used_at: sql<Date>`now()`, email: identity.email ?? null }).where('id', '=', link.id).execute();
      return { kind: 'signed_in', userId: link.user_id, organizationId };
    }

    if (identity.email === undefined || identity.email === '') return refuse(trx, organizationId, identity, 'email_missing');
    const email = canonicalEmail(identity.email);
    if (email === undefined) return refuse(trx, organizationId, identity, 'email_unusable');
    const domain = emailDomain(email);
    const domainVerified = domain !== undefined && (await hasVerifiedDomain(trx, organizationId, domain));
    const found = await findUserByEmail(trx, email);
    // The account found must have exactly this address: the database's lower() folds some
    // non-ASCII letters (İ to i) that the domain check, in ASCII, does not.
    if (found && found.email.toLowerCase() !== email) return refuse(trx, organizationId, identity, 'email_unusable');

    if (found) {
      const trusted = domainVerified && identity.emailVerified && connection.links_existing_accounts;
      if (!trusted) {
        const reason = !domainVerified ? 'domain_not_verified' : !identity.emailVerified ? 'email_not_verified_by_provider' : 'connection_not_vouched_by_owner';
        await recordAuditEvent(trx, { organizationId, action: 'sso.link_needs_proof', details: { connection_id: identity.connectionId, user_id: found.id, reason } });
        return { kind: 'needs_proof', userId: found.id, email, organizationId };
      }
      // Nobody ever proved this address was theirs (a sign-up that was never confirmed, perhaps
      // by someone waiting for the real person): the organization's IdP, authoritative for its
      // verified domain, now does. What the unproved account had is ended first.
      return linkExisting(trx, identity, organizationId, connection, found.id, 'verified_domain', { reclaim: found.email_verified_at === null });
    }

    if (!domainVerified) return refuse(trx, organizationId, identity, 'email_outside_verified_domains');
    if (!connection.jit) return refuse(trx, organizationId, identity, 'jit_off');
    const user = await insertUser(trx, { email, name: identity.name?.slice(0, 200) ?? '', passwordHash: null, emailVerified: identity.emailVerified });
    await addMember(trx, { organizationId, userId: user.id, role: defaultRoleOf(connection) });
    await insertLink(trx, identity, user.id, email);
    await recordAuditEvent(trx, { organizationId, action: 'sso.user_provisioned', details: { connection_id: identity.connectionId, user_id: user.id, role: defaultRoleOf(connection).name } });
    return { kind: 'signed_in', userId: user.id, organizationId };
  });
}

/**
 * The provider's email in the one form it is compared in: ASCII lower case, the domain in its
 * IDNA (xn--) form; undefined when it is not an address, or has a non-ASCII local part
 * (whose case folding differs between JavaScript and the database's collation).
 */
export function canonicalEmail(value: string | undefined): string | undefined {
  const parsed = value === undefined ? undefined : emailSchema.safeParse(value);
  if (!parsed?.success) return undefined;
  const at = parsed.data.lastIndexOf('@');
  const local = parsed.data.slice(0, at);
  const domain = emailDomain(parsed.data);
  if (domain === undefined || !/^[\x21-\x7e]+$/.test(local)) return undefined;
  return `${local}@${domain}`.toLowerCase();
}

async function isMember(trx: DB, organizationId: number, userId: number): Promise<boolean> {
  const row = await trx.selectFrom('memberships').select('user_id').where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst();
  return row !== undefined;
}

/**
 * Ends what an account whose address nobody proved could be holding: its password, second
 * factors and passkeys, sessions and sign-ins in progress, links sent by email, and the grants
 * it gave; the address is then verified (by the IdP). Audited on the account and in the
 * organization.
 */
export async function reclaimUnverifiedAccount(trx: Transaction<Database>, userId: number, organizationId: number, via: { connection_id: number } | { directory_id: number }): Promise<void> {
  await trx.updateTable('users').set({ password_hash: null, email_verified_at: sql<Date>`now()`, updated_at: new Date() }).where('id', '=', userId).execute();
  // Its links to identity providers too: one made by whoever held the account (through an IdP of
  // their own, proving it with the password) must not outlive the password.
  for (const table of ['totp_factors', 'recovery_codes', 'passkeys', 'sessions', 'pending_sign_ins', 'sso_identities'] as const) await trx.deleteFrom(table).where('user_id', '=', userId).execute();
  await endAccountTokens(trx, userId);
  const memberships = await trx.selectFrom('memberships').select('organization_id').where('user_id', '=', userId).execute();
  for (const m of memberships) await revokeGrantsInTransaction(trx, { organizationId: m.organization_id, userId }, 'account_reclaimed');
  const action = 'connection_id' in via ? 'sso.unverified_account_reclaimed' : 'directory.unverified_account_reclaimed';
  await recordAuditEvent(trx, { organizationId, action, details: { ...via, user_id: userId } });
  await recordAccountEvent(trx, { userId, action, details: { ...via, organization_id: organizationId } });
}

type ConnectionForLink = NonNullable<Awaited<ReturnType<typeof lockConnection>>>;

async function insertLink(trx: DB, identity: UpstreamIdentity, userId: number, email: string): Promise<boolean> {
  try {
    // A savepoint: a unique violation must not abort the caller's transaction.
    await sql`savepoint sso_link`.execute(trx);
    await trx
      .insertInto('sso_identities')
      .values({ connection_id: identity.connectionId, user_id: userId, issuer: identity.issuer, subject_format: identity.subjectFormat, subject: identity.subject, email })
      .execute();
    await sql`release savepoint sso_link`.execute(trx);
    return true;
  } catch (err) {
    if (!isUniqueViolation(err)) throw err;
    await sql`rollback to savepoint sso_link`.execute(trx);
    return false;
  }
}

/** Links an existing account (its ownership shown by `how`) and makes it a member if JIT allows. */
async function linkExisting(
  trx: Transaction<Database>,
  identity: UpstreamIdentity,
  organizationId: number,
  connection: ConnectionForLink,
  userId: number,
  how: 'verified_domain' | 'proof',
  options: { reclaim?: boolean } = {},
): Promise<Resolution> {
  const member = await isMember(trx, organizationId, userId);
  // Automation adds nobody the organization removed; an admin or an invitation may.
  if (!member && (!connection.jit || (await wasRemoved(trx, organizationId, userId)))) return refuse(trx, organizationId, identity, 'not_a_member');
  // Only once the sign-in will go through: a refused one must not have taken the account's password.
  if (options.reclaim) await reclaimUnverifiedAccount(trx, userId, organizationId, { connection_id: identity.connectionId });
  if (!(await insertLink(trx, identity, userId, identity.email ?? ''))) return refuse(trx, organizationId, identity, 'linked_to_another_subject');
  if (!member) await addMember(trx, { organizationId, userId, role: defaultRoleOf(connection) });
  await recordAuditEvent(trx, { organizationId, action: 'sso.identity_linked', details: { connection_id: identity.connectionId, user_id: userId, how, ...(member ? {} : { added_as: defaultRoleOf(connection).name }) } });
  await recordAccountEvent(trx, { userId, action: 'sso.identity_linked', details: { connection_id: identity.connectionId, organization_id: organizationId, how } });
  return { kind: 'signed_in', userId, organizationId };
}

/**
 * Makes the link a person proved by signing in to the account (needs_proof): only to the account
 * the provider's email named, and only while the connection is still active.
 */
export async function linkAfterProof(db: DB, identity: UpstreamIdentity, provenUserId: number): Promise<Resolution> {
  return inTransaction(db, async (trx) => {
    const connection = await lockConnection(trx, identity.connectionId);
    if (!connection || connection.state !== 'active') return refuse(trx, connection?.organization_id, identity, 'connection_inactive');
    return linkExisting(trx, identity, connection.organization_id, connection, provenUserId, 'proof');
  });
}
