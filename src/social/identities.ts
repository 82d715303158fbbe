/**
 * Who a social identity is here (issue 45). A provider vouches for a subject; orgauth finds the
 * user by the link (connection, subject), never by email alone.
 *
 * The first time a subject arrives:
 * - with no verified address (the provider does not vouch for it), nothing is matched or made;
 * - an address outside the connection's allowed domains, or in a domain whose organization
 *   requires SSO (the company's rule wins), is sent elsewhere or refused;
 * - an address that belongs to an account is linked only after the person proves that account
 *   in the same browser (password, passkey or its own SSO) — never on the provider's word (a
 *   pre-account takeover: whoever registered the address at a provider first would own the
 *   account); the owner is mailed when the link is made;
 * - an address nobody has makes an account, its address verified by the provider, with the
 *   person's own first organization, as sign-up does.
 * A linked identity whose account's address is now in an SSO-required domain is sent to the
 * company's sign-in too.
 */
import { sql } from 'kysely';
import { recordAccountEvent, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import { changeSignInMethods, type FactorDeps } from '../accounts/second-factors.js';
import { createOrganization } from '../accounts/organizations.js';
import { admitSignUp } from '../accounts/sign-ups.js';
import { findUserByEmail, insertUser } from '../accounts/users.js';
import { ConflictError, NotFoundError } from '../errors.js';
import { sha256Hex } from '../lib/crypto.js';
import { emailDomain, findSsoRoute } from '../sso/domains.js';
import { canonicalEmail } from '../sso/identities.js';
import type { SocialIdentity } from './providers.js';

export type SocialRefusal = 'connection_inactive' | 'email_missing' | 'email_not_verified' | 'email_unusable' | 'domain_not_allowed' | 'identity_taken' | 'linked_to_another_subject';

export type SocialResolution =
  | { kind: 'signed_in'; userId: number; created: boolean }
  | { kind: 'needs_proof'; userId: number; email: string }
  /** The address's organization requires its own sign-in: the person is sent there. */
  | { kind: 'sso_required'; email: string }
  /** A new account, but the address or the client made too many lately (DO-1, as sign-up): seconds to wait. */
  | { kind: 'too_many'; wait: number }
  | { kind: 'refused'; reason: SocialRefusal };

/** What the person is told for each refusal: enough to act on, nothing about other accounts. */
export const SOCIAL_REFUSAL_MESSAGES: Record<SocialRefusal, string> = {
  connection_inactive: 'This way of signing in is not available any more. Sign in another way.',
  email_missing: 'The provider did not tell us your email address. Allow access to your email address there, or sign in another way.',
  email_not_verified: 'The provider has not verified your email address, so it cannot be used here. Verify it there (and make it your primary address), or sign in another way.',
  email_unusable: 'The provider sent an email address that cannot be matched safely (letters outside ASCII). Sign in another way.',
  domain_not_allowed: 'Your email address is not in a domain allowed to sign in this way. Sign in another way.',
  identity_taken: 'This account at the provider is already connected to another account here.',
  linked_to_another_subject: 'Your account here is already connected to a different account at this provider.',
};

/** The session's amr for a social sign-in: one factor, federated (RFC 8176). */
export const SOCIAL_AMR: readonly string[] = ['fed'];

/** The connection, share-locked: disabling or deleting it waits for this sign-in, or this sign-in sees it gone. */
function lockConnection(trx: DB, connectionId: number) {
  return trx.selectFrom('social_connections').select(['id', 'state', 'allowed_domains', 'name']).where('id', '=', connectionId).forShare().executeTakeFirst();
}

/**
 * Whether an organization requires its own sign-in of this address (SS-4): if so, the person is
 * sent there, and the organization's audit log says a social sign-in was (its rule at work).
 */
async function sentToSso(db: DB, identity: SocialIdentity, email: string): Promise<SocialResolution | undefined> {
  const route = await findSsoRoute(db, email);
  if (route?.ssoRequired !== true) return undefined;
  await recordAuditEvent(db, { organizationId: route.organizationId, action: 'social.sent_to_sso', details: { social_connection_id: identity.connectionId, email: email.slice(0, 320) } });
  return { kind: 'sso_required', email };
}

/** The account step of a social sign-in: finds the linked user, asks for proof, or makes the account. */
export async function resolveSocialIdentity(db: DB, identity: SocialIdentity, client: { ip: string }): Promise<SocialResolution> {
  return inTransaction(db, async (trx) => {
    const connection = await lockConnection(trx, identity.connectionId);
    if (!connection || connection.state !== 'enabled') return { kind: 'refused', reason: 'connection_inactive' } as const;
    const link = await trx
      .selectFrom('social_identities')
      .innerJoin('users', 'users.id', 'social_identities.user_id')
      .select(['social_identities.id', 'social_identities.user_id', 'users.email'])
      .where('social_identities.connection_id', '=', identity.connectionId)
      .where('social_identities.subject', '=', identity.subject)
      .executeTakeFirst();
    if (link) {
      const routed = await sentToSso(trx, identity, link.email);
      if (routed) return routed;
      await trx.updateTable('social_identities').set({ last_used_at: sql<Date>`now()`, email: identity.email?.slice(0, 320) ?? null }).where('id', '=', link.id).execute();
      return { kind: 'signed_in', userId: link.user_id, created: false } as const;
    }

    if (identity.email === undefined || identity.email === '') return { kind: 'refused', reason: 'email_missing' } as const;
    // An address the provider does not vouch for is never matched, nor made an account of.
    if (!identity.emailVerified) return { kind: 'refused', reason: 'email_not_verified' } as const;
    const email = canonicalEmail(identity.email);
    if (email === undefined) return { kind: 'refused', reason: 'email_unusable' } as const;
    const domain = emailDomain(email);
    if (connection.allowed_domains.length > 0 && (domain === undefined || !connection.allowed_domains.includes(domain))) return { kind: 'refused', reason: 'domain_not_allowed' } as const;
    const routed = await sentToSso(trx, identity, email);
    if (routed) return routed;

    const found = await findUserByEmail(trx, email);
    if (found) {
      if (found.email.toLowerCase() !== email) return { kind: 'refused', reason: 'email_unusable' } as const;
      return { kind: 'needs_proof', userId: found.id, email: found.email } as const;
    }

    // An account is made: the sign-up limits hold here as on the sign-up page (DO-1).
    const wait = await admitSignUp(trx, { email, ip: client.ip });
    if (wait > 0) return { kind: 'too_many', wait } as const;
    const name = identity.name?.trim().slice(0, 200) ?? '';
    const user = await insertUser(trx, { email, name, passwordHash: null, emailVerified: true });
    await createOrganization(trx, { name: organizationNameFor(name, email), ownerUserId: user.id });
    await trx.insertInto('social_identities').values({ connection_id: identity.connectionId, user_id: user.id, subject: identity.subject, email }).execute();
    await recordAccountEvent(trx, { userId: user.id, action: 'social.signed_up', details: { connection_id: identity.connectionId, provider: connection.name } });
    return { kind: 'signed_in', userId: user.id, created: true } as const;
  });
}

/** The first organization of someone who signed up through a provider: named after them, renamed at will. */
function organizationNameFor(name: string, email: string): string {
  const who = name !== '' ? name : email.slice(0, email.lastIndexOf('@'));
  return `${who.slice(0, 80)}’s organization`;
}

/**
 * Makes the link a person proved by signing in to the account (needs_proof), with a notice on the
 * account and a mail to its address, while the connection is still enabled.
 */
export async function linkSocialAfterProof(db: DB, deps: Pick<FactorDeps, 'issuer' | 'mail'>, identity: SocialIdentity, userId: number): Promise<SocialResolution> {
  const user = await db.selectFrom('users').select(['id', 'email', 'name']).where('id', '=', userId).executeTakeFirst();
  if (!user) return { kind: 'refused', reason: 'connection_inactive' };
  return changeSignInMethods(db, deps, user, async (trx, note) => {
    const connection = await lockConnection(trx, identity.connectionId);
    if (!connection || connection.state !== 'enabled') return { kind: 'refused', reason: 'connection_inactive' } as const;
    try {
      await sql`savepoint social_link`.execute(trx);
      await trx.insertInto('social_identities').values({ connection_id: identity.connectionId, user_id: userId, subject: identity.subject, email: identity.email?.slice(0, 320) ?? null }).execute();
      await sql`release savepoint social_link`.execute(trx);
    } catch (err) {
      if (!isUniqueViolation(err)) throw err;
      await sql`rollback to savepoint social_link`.execute(trx);
      const taken = await trx.selectFrom('social_identities').select('user_id').where('connection_id', '=', identity.connectionId).where('subject', '=', identity.subject).executeTakeFirst();
      const reason = taken && taken.user_id !== userId ? 'identity_taken' : 'linked_to_another_subject';
      await recordAccountEvent(trx, { userId, action: 'social.link_refused', details: { connection_id: identity.connectionId, provider: connection.name, reason } });
      return { kind: 'refused', reason } as const;
    }
    await note({
      action: 'social.identity_linked',
      subject: `${connection.name} sign-in connected to your account`,
      what: `A ${connection.name} account (${identity.email ?? identity.subject}) was connected to your account: it can now sign you in. If this was not you, remove it on your Account page and change your password.`,
      details: { connection_id: identity.connectionId, provider: connection.name },
    });
    return { kind: 'signed_in', userId, created: false } as const;
  });
}

/** A user's social identities, for the Account page. */
export async function listSocialIdentities(db: DB, userId: number): Promise<{ id: number; provider: string; name: string; email: string | null; created_at: Date; last_used_at: Date }[]> {
  return db
    .selectFrom('social_identities')
    .innerJoin('social_connections', 'social_connections.id', 'social_identities.connection_id')
    .select(['social_identities.id', 'social_connections.provider', 'social_connections.name', 'social_identities.email', 'social_identities.created_at', 'social_identities.last_used_at'])
    .where('social_identities.user_id', '=', userId)
    .orderBy('social_identities.id')
    .limit(100)
    .execute();
}

/**
 * Removes one of the user's social identities, as long as another way to sign in remains: a
 * password, a passkey, another social identity or an SSO identity; the sessions made through it
 * (but the one asking) end. Mailed and noted on the account.
 */
export async function unlinkSocialIdentity(
  db: DB,
  deps: Pick<FactorDeps, 'issuer' | 'mail'>,
  user: { id: number; email: string; name: string },
  identityId: number,
  /** The session asking, which stays; the user's other sessions made through the identity's connection end. */
  currentSessionId: string,
): Promise<void> {
  await changeSignInMethods(db, deps, user, async (trx, note) => {
    const identity = await trx
      .selectFrom('social_identities')
      .innerJoin('social_connections', 'social_connections.id', 'social_identities.connection_id')
      .select(['social_identities.id', 'social_identities.email', 'social_connections.name', 'social_identities.connection_id'])
      .where('social_identities.id', '=', identityId)
      .where('social_identities.user_id', '=', user.id)
      .executeTakeFirst();
    if (!identity) throw new NotFoundError('no such connected account');
    const { rows } = await sql<{ others: boolean }>`select (
        exists (select 1 from users where id = ${user.id} and password_hash is not null)
        or exists (select 1 from passkeys where user_id = ${user.id})
        or exists (select 1 from social_identities where user_id = ${user.id} and id <> ${identityId})
        or exists (select 1 from sso_identities where user_id = ${user.id})) as others`.execute(trx);
    if (rows[0]?.others !== true) throw new ConflictError('This is your only way to sign in: set a password or add a passkey first.');
    await trx.deleteFrom('social_identities').where('id', '=', identityId).execute();
    // Whoever signed in through it (the mail about a link says: remove it if it was not you) is signed out.
    await trx.deleteFrom('sessions').where('user_id', '=', user.id).where('social_connection_id', '=', identity.connection_id).where('id_hash', '!=', sha256Hex(currentSessionId)).execute();
    await note({
      action: 'social.identity_unlinked',
      subject: `${identity.name} sign-in removed from your account`,
      what: `The ${identity.name} account (${identity.email ?? 'no address'}) can no longer sign you in.`,
      details: { connection_id: identity.connection_id, provider: identity.name },
    });
  });
}
