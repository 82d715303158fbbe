/**
 * Invitations: an owner or admin (or an application with members.write) invites an email
 * address into the organization with a role; the link in the email lets that address join.
 *
 * - The link's token is 256 random bits, kept as its SHA-256; a resend makes a new one (the old
 *   link dies), an invitation is used once, and it expires after INVITATION_TTL_S.
 * - At most one invitation is pending per organization and address (a unique partial index):
 *   inviting the address again replaces the pending one, with the new role.
 * - Only the invited address may accept: a signed-in user whose email differs is refused, and
 *   so is one whose email is not verified yet. Signing up from the link verifies the address
 *   (the link came to it).
 * - Who may invite with which role follows mayAssign (an owner only by an owner); a person
 *   must have verified their own address first, so an unverified account cannot make orgauth
 *   send mail to any address it likes.
 * Every change is in the organization's audit log, and the email is queued in the same
 * transaction as the change (src/mail/outbox.ts).
 */
import { sql } from 'kysely';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { BuiltinRole, RoleKind } from '../db/schema.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../errors.js';
import { generateSecret, secretMatches, sha256Hex } from '../lib/crypto.js';
import { parseInput } from '../lib/validate.js';
import { invitationMessage } from '../mail/messages.js';
import type { MailOutbox } from '../mail/outbox.js';
import { LINK_TOKEN_PATTERN } from './account-tokens.js';
import { asRoleRef, forgetRemoval, getOrganization, UnverifiedEmailError } from './organizations.js';
import { lockRole, mayAssign, roleOf, type RoleRef } from './roles.js';
import { emailSchema, type PreparedUser, insertUser } from './users.js';

export const INVITATION_TTL_S = 7 * 24 * 3600;
/** Invitations an organization may send per hour (new and re-sent): enough for onboarding a team, not for spam. */
export const INVITATIONS_PER_HOUR = 200;

export type InvitationStatus = 'pending' | 'expired';

export interface PendingInvitation {
  id: number;
  email: string;
  /** The role's name. */
  role: string;
  invited_by_user_id: number | null;
  invited_by_email: string | null;
  invited_by_client_id: string | null;
  created_at: Date;
  sent_at: Date;
  expires_at: Date;
  status: InvitationStatus;
}

/** Who invites: the audit actor, the role they act with, and how the email names them. */
export interface InvitationActor {
  actor: Actor;
  actingAs: RoleRef | BuiltinRole;
  /** "Ada Lovelace (ada@example.com)" or the application's name. */
  inviterLabel: string;
}

export interface MailDeps {
  mail: MailOutbox;
  issuer: string;
}

export function invitationLink(issuer: string, token: string): string {
  return `${issuer}/invitation?token=${token}`;
}

const PENDING_COLUMNS = [
  'invitations.id',
  'invitations.email',
  'invitations.role',
  'invitations.role_id',
  'roles.name as role_name',
  'invitations.invited_by_user_id',
  'users.email as invited_by_email',
  'invitations.invited_by_client_id',
  'invitations.created_at',
  'invitations.sent_at',
  'invitations.expires_at',
] as const;

function withStatus<T extends { expires_at: Date; role: RoleKind; role_id: number | null; role_name: string | null }>(row: T): PendingInvitation {
  const { role, role_id, role_name, ...rest } = row;
  return { ...rest, role: roleOf({ role, role_id, role_name }).name, status: row.expires_at.getTime() > Date.now() ? 'pending' : 'expired' } as unknown as PendingInvitation;
}

/** The organization's invitations not yet accepted or revoked (expired ones too, to re-send), with who sent them. */
function pending(db: DB, organizationId: number) {
  return db
    .selectFrom('invitations')
    .leftJoin('users', 'users.id', 'invitations.invited_by_user_id')
    .leftJoin('roles', 'roles.id', 'invitations.role_id')
    .select(PENDING_COLUMNS)
    .where('invitations.organization_id', '=', organizationId)
    .where('invitations.accepted_at', 'is', null)
    .where('invitations.revoked_at', 'is', null);
}

/** The pending invitations in id order, a page at a time (the partial index of pending ones). */
export async function listPendingInvitations(db: DB, organizationId: number, page: { afterId: number; limit: number }): Promise<PendingInvitation[]> {
  const rows = await pending(db, organizationId).where('invitations.id', '>', page.afterId).orderBy('invitations.id').limit(page.limit).execute();
  return rows.map(withStatus);
}

export async function getPendingInvitation(db: DB, organizationId: number, id: number): Promise<PendingInvitation> {
  const row = await pending(db, organizationId).where('invitations.id', '=', id).executeTakeFirst();
  if (!row) throw new NotFoundError('no such pending invitation in this organization');
  return withStatus(row);
}

async function refuseUnverifiedInviter(trx: DB, actor: Actor): Promise<void> {
  if (actor.actorUserId == null) return;
  const user = await trx.selectFrom('users').select('email_verified_at').where('id', '=', actor.actorUserId).executeTakeFirst();
  if (!user || user.email_verified_at === null) {
    throw new ForbiddenError('confirm your own email address before inviting others (see the Account page)');
  }
}

async function refuseFlood(trx: DB, organizationId: number): Promise<void> {
  const { n } = await trx
    .selectFrom('invitations')
    .select(sql<string>`count(*)`.as('n'))
    .where('organization_id', '=', organizationId)
    .where('sent_at', '>', sql<Date>`now() - interval '1 hour'`)
    .executeTakeFirstOrThrow();
  if (Number(n) >= INVITATIONS_PER_HOUR) throw new ConflictError(`this organization has sent ${INVITATIONS_PER_HOUR} invitations in the last hour; try again later`);
}

async function queueInvitationEmail(trx: DB, deps: MailDeps, input: { organizationId: number; email: string; role: string; token: string; expiresAt: Date; inviter: string }) {
  const org = await getOrganization(trx, input.organizationId);
  await deps.mail.queue(
    trx,
    invitationMessage({
      issuer: deps.issuer,
      to: input.email,
      inviter: input.inviter,
      organizationName: org.name,
      role: input.role,
      link: invitationLink(deps.issuer, input.token),
      expiresAt: input.expiresAt,
    }),
  );
}

/**
 * Invites `email` with `role`, replacing a pending invitation to the same address. Refused:
 * an address that already belongs to a member (409), a role the inviter may not give (403), an
 * inviter whose own address is unverified (403).
 */
export async function createInvitation(
  db: DB,
  input: { organizationId: number; email: string; role: RoleRef | BuiltinRole },
  by: InvitationActor,
  deps: MailDeps,
): Promise<PendingInvitation> {
  const email = parseInput(emailSchema, input.email);
  const actingAs = asRoleRef(by.actingAs);
  const created = await inTransaction(db, async (trx) => {
    await getOrganization(trx, input.organizationId);
    const role = await lockRole(trx, input.organizationId, asRoleRef(input.role));
    if (!mayAssign(actingAs, role)) throw new ForbiddenError(role.kind === 'owner' ? 'only an owner may invite an owner' : `your role may not give the role ${role.name}: it holds permissions yours does not`);
    await refuseUnverifiedInviter(trx, by.actor);
    // The address's account (through the lower(email) index), then its membership by key: the
    // same two lookups however many members the organization has.
    const member = await trx
      .selectFrom('users')
      .innerJoin('memberships', 'memberships.user_id', 'users.id')
      .select('memberships.user_id')
      .where(sql<string>`lower(users.email)`, '=', sql<string>`lower(${email})`)
      .where('memberships.organization_id', '=', input.organizationId)
      .executeTakeFirst();
    if (member) throw new ConflictError('this address already belongs to a member of the organization');
    await refuseFlood(trx, input.organizationId);
    // Replacing a pending invitation is revoking it: an owner's only by an owner.
    const pendingRoles = await trx
      .selectFrom('invitations')
      .leftJoin('roles', 'roles.id', 'invitations.role_id')
      .select(['invitations.role', 'invitations.role_id', 'roles.name as role_name', 'roles.permissions as role_permissions'])
      .where('invitations.organization_id', '=', input.organizationId)
      .where(sql<string>`lower(invitations.email)`, '=', sql<string>`lower(${email})`)
      .where('invitations.accepted_at', 'is', null)
      .where('invitations.revoked_at', 'is', null)
      .forUpdate('invitations')
      .execute();
    if (!pendingRoles.every((p) => mayAssign(actingAs, roleOf(p)))) throw new ForbiddenError('only an owner may replace an invitation to become an owner, and only someone who may give its role any other');
    const replaced = await trx
      .updateTable('invitations')
      .set({ revoked_at: sql`now()` })
      .where('organization_id', '=', input.organizationId)
      .where(sql<string>`lower(email)`, '=', sql<string>`lower(${email})`)
      .where('accepted_at', 'is', null)
      .where('revoked_at', 'is', null)
      .returning('id')
      .execute();
    const token = generateSecret(32);
    const row = await trx
      .insertInto('invitations')
      .values({
        organization_id: input.organizationId,
        email,
        role: role.kind,
        role_id: role.id,
        token_hash: sha256Hex(token),
        invited_by_user_id: by.actor.actorUserId ?? null,
        invited_by_client_id: by.actor.actorClientId ?? null,
        expires_at: sql<Date>`now() + make_interval(secs => ${INVITATION_TTL_S})`,
      })
      .returning(['id', 'expires_at'])
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, {
      organizationId: input.organizationId,
      action: 'invitation.created',
      actor: by.actor,
      details: { invitation_id: row.id, email, role: role.name, ...(replaced.length > 0 ? { replaced_invitation_id: replaced[0]!.id } : {}) },
    });
    await queueInvitationEmail(trx, deps, { organizationId: input.organizationId, email, role: role.name, token, expiresAt: row.expires_at, inviter: by.inviterLabel });
    return getPendingInvitation(trx, input.organizationId, row.id);
  }).catch((err: unknown) => {
    // Two invitations to one address at the same moment: the unique index lets one through.
    if (isUniqueViolation(err)) throw new ConflictError('an invitation to this address is being sent right now; try again');
    throw err;
  });
  deps.mail.wake();
  return created;
}

/** The organization's pending invitation `id`, locked, if the acting role may handle its role (an owner's: only an owner). */
async function lockPending(trx: DB, organizationId: number, id: number, actingAs: RoleRef | BuiltinRole, lock = true): Promise<{ email: string; role: string }> {
  const current = await trx
    .selectFrom('invitations')
    .leftJoin('roles', 'roles.id', 'invitations.role_id')
    .select(['invitations.email', 'invitations.role', 'invitations.role_id', 'roles.name as role_name', 'roles.permissions as role_permissions'])
    .where('invitations.organization_id', '=', organizationId)
    .where('invitations.id', '=', id)
    .where('invitations.accepted_at', 'is', null)
    .where('invitations.revoked_at', 'is', null)
    .$if(lock, (qb) => qb.forUpdate('invitations'))
    .executeTakeFirst();
  if (!current) throw new NotFoundError('no such pending invitation in this organization');
  const role = roleOf(current);
  if (!mayAssign(asRoleRef(actingAs), role)) {
    throw new ForbiddenError(role.kind === 'owner' ? 'only an owner may send or revoke an invitation to become an owner' : `your role may not send or revoke an invitation to the role ${role.name}`);
  }
  return { email: current.email, role: role.name };
}

/**
 * What revokeInvitation (or resendInvitation) would refuse, checked without changing anything, for
 * a page that asks first: no such pending invitation (NotFoundError), a role `actingAs` may not
 * give (ForbiddenError). The change checks again, under its lock.
 */
export async function checkInvitationChange(db: DB, organizationId: number, id: number, actingAs: RoleRef | BuiltinRole): Promise<void> {
  await lockPending(db, organizationId, id, actingAs, false);
}

/** Sends a pending (or expired) invitation again with a new link and a new expiry; the old link stops working. */
export async function resendInvitation(db: DB, organizationId: number, id: number, by: InvitationActor, deps: MailDeps): Promise<PendingInvitation> {
  const resent = await inTransaction(db, async (trx) => {
    const current = await lockPending(trx, organizationId, id, by.actingAs);
    await refuseUnverifiedInviter(trx, by.actor);
    await refuseFlood(trx, organizationId);
    const token = generateSecret(32);
    const row = await trx
      .updateTable('invitations')
      .set({ token_hash: sha256Hex(token), sent_at: sql`now()`, expires_at: sql<Date>`now() + make_interval(secs => ${INVITATION_TTL_S})` })
      .where('id', '=', id)
      .returning(['expires_at'])
      .executeTakeFirstOrThrow();
    await recordAuditEvent(trx, { organizationId, action: 'invitation.resent', actor: by.actor, details: { invitation_id: id, email: current.email, role: current.role } });
    await queueInvitationEmail(trx, deps, { organizationId, email: current.email, role: current.role, token, expiresAt: row.expires_at, inviter: by.inviterLabel });
    return getPendingInvitation(trx, organizationId, id);
  });
  deps.mail.wake();
  return resent;
}

export async function revokeInvitation(db: DB, organizationId: number, id: number, by: Pick<InvitationActor, 'actor' | 'actingAs'>): Promise<void> {
  await inTransaction(db, async (trx) => {
    const current = await lockPending(trx, organizationId, id, by.actingAs);
    await trx.updateTable('invitations').set({ revoked_at: sql`now()` }).where('id', '=', id).execute();
    await recordAuditEvent(trx, { organizationId, action: 'invitation.revoked', actor: by.actor, details: { invitation_id: id, email: current.email, role: current.role } });
  });
}

/** What the invitation page shows about a link: the invitation and its organization, while it can still be accepted. */
export interface OpenInvitation {
  id: number;
  organization_id: number;
  organization_name: string;
  email: string;
  /** The role's name, and what joining stores. */
  role: string;
  role_kind: RoleKind;
  role_id: number | null;
  expires_at: Date;
}

async function findOpen(db: DB, token: unknown, lock: boolean): Promise<OpenInvitation | undefined> {
  if (typeof token !== 'string' || !LINK_TOKEN_PATTERN.test(token)) return undefined;
  let query = db
    .selectFrom('invitations')
    .innerJoin('organizations', 'organizations.id', 'invitations.organization_id')
    .leftJoin('roles', 'roles.id', 'invitations.role_id')
    .select([
      'invitations.id',
      'invitations.token_hash',
      'invitations.organization_id',
      'organizations.name as organization_name',
      'invitations.email',
      'invitations.role as role_kind',
      'invitations.role_id',
      'roles.name as role_name',
      'invitations.expires_at',
    ])
    .where('invitations.token_hash', '=', sha256Hex(token))
    .where('invitations.accepted_at', 'is', null)
    .where('invitations.revoked_at', 'is', null)
    .where('invitations.expires_at', '>', sql<Date>`now()`);
  if (lock) query = query.forUpdate('invitations');
  const row = await query.executeTakeFirst();
  if (!row || !secretMatches(token, row.token_hash)) return undefined;
  const { token_hash: _hash, role_name, ...open } = row;
  return { ...open, role: roleOf({ role: row.role_kind, role_id: row.role_id, role_name }).name };
}

/** The invitation a link names, if it can still be accepted (not expired, revoked, used or re-sent). */
export function findOpenInvitation(db: DB, token: unknown): Promise<OpenInvitation | undefined> {
  return findOpen(db, token, false);
}

export class InvitationUnavailableError extends NotFoundError {
  constructor() {
    super('This invitation link is not valid: it has expired, was revoked or replaced by a newer one, or has been used. Ask for a new invitation.');
    this.name = 'InvitationUnavailableError';
  }
}

/** For what a page shows; accepting compares with the database's lower(), as the unique index does. */
export function sameAddress(a: string, b: string): boolean {
  return a.trim().toLowerCase() === b.trim().toLowerCase();
}

async function join(trx: DB, invitation: OpenInvitation, userId: number): Promise<void> {
  const existing = await trx
    .selectFrom('memberships')
    .leftJoin('roles', 'roles.id', 'memberships.role_id')
    .select(['memberships.role', 'memberships.role_id', 'roles.name as role_name'])
    .where('memberships.organization_id', '=', invitation.organization_id)
    .where('memberships.user_id', '=', userId)
    .executeTakeFirst();
  if (!existing) {
    await trx
      .insertInto('memberships')
      .values({ organization_id: invitation.organization_id, user_id: userId, role: invitation.role_kind, role_id: invitation.role_id })
      .execute();
    await forgetRemoval(trx, invitation.organization_id, userId);
    await recordAuditEvent(trx, {
      organizationId: invitation.organization_id,
      action: 'member.added',
      actor: { actorUserId: userId },
      details: { user_id: userId, role: invitation.role, invitation_id: invitation.id },
    });
  }
  await trx.updateTable('invitations').set({ accepted_at: sql`now()`, accepted_by_user_id: userId }).where('id', '=', invitation.id).execute();
  await recordAuditEvent(trx, {
    organizationId: invitation.organization_id,
    action: 'invitation.accepted',
    actor: { actorUserId: userId },
    details: { invitation_id: invitation.id, email: invitation.email, role: invitation.role, ...(existing ? { already_member_as: roleOf(existing).name } : {}) },
  });
}

/**
 * The signed-in user accepts. Refused unless the link is still good (404), the user's address
 * is the invited one (403) and verified (409).
 */
export async function acceptInvitation(db: DB, token: unknown, userId: number): Promise<OpenInvitation> {
  return inTransaction(db, async (trx) => {
    const invitation = await findOpen(trx, token, true);
    if (!invitation) throw new InvitationUnavailableError();
    // lower() as the database has it, as the users' unique index compares addresses.
    const user = await trx
      .selectFrom('users')
      .select(['email', 'email_verified_at', sql<boolean>`lower(email) = lower(${invitation.email})`.as('invited')])
      .where('id', '=', userId)
      .executeTakeFirstOrThrow();
    if (!user.invited) throw new ForbiddenError(`This invitation is for ${invitation.email}; you are signed in as ${user.email}.`);
    if (user.email_verified_at === null) throw new UnverifiedEmailError('Confirm your email address first (we sent you a link; the Account page can send it again), then accept the invitation.');
    await join(trx, invitation, userId);
    return invitation;
  });
}

/**
 * Signs up from the link: a new account for the invited address, verified (the link came to
 * it), that joins the organization. An account that already exists for the address is a
 * ConflictError (sign in and accept instead). `prepared` is hashed before the transaction.
 */
export async function signUpFromInvitation(
  db: DB,
  token: unknown,
  prepared: Omit<PreparedUser, 'email' | 'emailVerified'>,
): Promise<{ invitation: OpenInvitation; userId: number }> {
  return inTransaction(db, async (trx) => {
    const invitation = await findOpen(trx, token, true);
    if (!invitation) throw new InvitationUnavailableError();
    const user = await insertUser(trx, { ...prepared, email: invitation.email, emailVerified: true });
    await join(trx, invitation, user.id);
    return { invitation, userId: user.id };
  });
}

