import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { revokeGrantsInTransaction, type RevokedGrantsMemory } from '../oauth/grant-store.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { Organization, Role } from '../db/schema.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../errors.js';
import { parseInput } from '../lib/validate.js';

export const ROLES = ['owner', 'admin', 'member'] as const satisfies readonly Role[];

export const organizationNameSchema = z
  .string()
  .trim()
  .min(1, 'must not be empty')
  .max(200, 'must be at most 200 characters');

/** Organization ids in paths and arguments: canonical positive integers, so one id has one spelling. */
export const organizationIdSchema = z
  .union([z.number(), z.string()])
  .transform(String)
  .pipe(z.string().regex(/^[1-9][0-9]{0,15}$/, 'must be a positive integer'))
  .transform(Number)
  .pipe(z.number().max(Number.MAX_SAFE_INTEGER, 'must be a positive integer'));

/** Creates an organization and makes `ownerUserId` its owner, in one transaction. */
export async function createOrganization(
  db: DB,
  input: { name: string; ownerUserId: number },
): Promise<Pick<Organization, 'id' | 'name'>> {
  const name = parseInput(organizationNameSchema, input.name);
  return inTransaction(db, async (trx) => {
    const org = await trx.insertInto('organizations').values({ name }).returning(['id', 'name']).executeTakeFirstOrThrow();
    await trx.insertInto('memberships').values({ organization_id: org.id, user_id: input.ownerUserId, role: 'owner' }).execute();
    await recordAuditEvent(trx, {
      organizationId: org.id,
      action: 'organization.created',
      actor: { actorUserId: input.ownerUserId },
      details: { name },
    });
    return org;
  });
}

export async function getOrganization(db: DB, organizationId: number): Promise<Organization> {
  const org = await db.selectFrom('organizations').selectAll().where('id', '=', organizationId).executeTakeFirst();
  if (!org) throw new NotFoundError(`organization ${organizationId} not found`);
  return org;
}

/** Every organization in id order, a page at a time (the operator's `orgauth org list`). */
export async function listOrganizations(db: DB, page: { afterId: number; limit: number }): Promise<Organization[]> {
  return db.selectFrom('organizations').selectAll().where('id', '>', page.afterId).orderBy('id').limit(page.limit).execute();
}

/** The user has not confirmed their email address: others cannot add them, and they cannot accept invitations yet. */
export class UnverifiedEmailError extends ConflictError {
  constructor(description = 'this user has not verified their email address yet; invite them instead, or ask them to confirm it first') {
    super(description);
    this.name = 'UnverifiedEmailError';
  }
}

export interface MembershipResult {
  organization_id: number;
  user_id: number;
  role: Role;
}

/**
 * Only an owner may make an owner, or change or remove one. Whoever acts for the organization
 * acts with a role: a dashboard user with theirs, an application through the management API as
 * an admin (ownership stays a human decision), the operator's CLI as an owner.
 */
export function mayAssign(actingAs: Role, role: Role): boolean {
  return role !== 'owner' || actingAs === 'owner';
}

/** Who changes a membership: the audit log's actor and the role they act with (see mayAssign); an owner by default. */
export interface MemberChangeOptions {
  actor?: Actor | undefined;
  actingAs?: Role | undefined;
  /** This instance's revoked set, told of the grants a removal revokes once it has committed. */
  revocations?: RevokedGrantsMemory | undefined;
}

function refuseUnlessAllowed(options: MemberChangeOptions, ...roles: Role[]): void {
  const actingAs = options.actingAs ?? 'owner';
  if (!roles.every((role) => mayAssign(actingAs, role))) throw new ForbiddenError('only an owner may make an owner, or change or remove one');
}

/**
 * Adds a user to an organization. A user already in it is a ConflictError (roles change
 * elsewhere). Someone acting through the product (`options.actor`: a dashboard user, an
 * application) may add only a user whose email address is verified: an unverified account may
 * belong to someone who merely typed that address. The operator (no actor) vouches for anyone.
 */
export async function addMember(
  db: DB,
  input: { organizationId: number; userId: number; role: Role },
  options: MemberChangeOptions = {},
): Promise<MembershipResult> {
  refuseUnlessAllowed(options, input.role);
  return inTransaction(db, async (trx) => {
    await getOrganization(trx, input.organizationId);
    if (options.actor) {
      const user = await trx.selectFrom('users').select('email_verified_at').where('id', '=', input.userId).executeTakeFirst();
      if (!user) throw new NotFoundError(`user ${input.userId} not found`);
      if (user.email_verified_at === null) throw new UnverifiedEmailError();
    }
    try {
      const membership = await trx
        .insertInto('memberships')
        .values({ organization_id: input.organizationId, user_id: input.userId, role: input.role })
        .returning(['organization_id', 'user_id', 'role'])
        .executeTakeFirstOrThrow();
      await recordAuditEvent(trx, {
        actor: options.actor,
        organizationId: input.organizationId,
        action: 'member.added',
        details: { user_id: input.userId, role: input.role },
      });
      return membership;
    } catch (err) {
      if (isUniqueViolation(err)) throw new ConflictError(`user ${input.userId} is already a member of organization ${input.organizationId}`);
      throw err;
    }
  });
}

/**
 * The organization's memberships, locked for the rest of the transaction, and the one of
 * `userId`. Changes that could leave the organization without an owner lock them all first, so
 * two concurrent demotions or removals cannot both pass the last-owner check (RO-3).
 */
async function lockMemberships(trx: DB, organizationId: number, userId: number) {
  const members = await trx.selectFrom('memberships').select(['user_id', 'role']).where('organization_id', '=', organizationId).forUpdate().execute();
  const member = members.find((m) => m.user_id === userId);
  if (!member) throw new NotFoundError('no such member in this organization');
  return { member, isLastOwner: member.role === 'owner' && members.filter((m) => m.role === 'owner').length === 1 };
}

/** Changes a member's role. The last owner cannot be demoted (RO-3). */
export async function changeMemberRole(
  db: DB,
  input: { organizationId: number; userId: number; role: Role },
  options: MemberChangeOptions = {},
): Promise<MembershipResult> {
  return inTransaction(db, async (trx) => {
    const { member, isLastOwner } = await lockMemberships(trx, input.organizationId, input.userId);
    refuseUnlessAllowed(options, member.role, input.role);
    if (member.role === input.role) return { organization_id: input.organizationId, user_id: input.userId, role: member.role };
    if (isLastOwner) throw new ConflictError('the last owner of an organization cannot be demoted; make someone else an owner first');
    await trx.updateTable('memberships').set({ role: input.role }).where('organization_id', '=', input.organizationId).where('user_id', '=', input.userId).execute();
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId: input.organizationId,
      action: 'member.role_changed',
      details: { user_id: input.userId, from: member.role, to: input.role },
    });
    return { organization_id: input.organizationId, user_id: input.userId, role: input.role };
  });
}

/**
 * Removes a user from an organization and, in the same transaction, revokes every grant that
 * user gave there, so their tokens stop working on every instance (the API never has to
 * re-check membership). The last owner cannot be removed (RO-3).
 */
export async function removeMember(db: DB, input: { organizationId: number; userId: number }, options: MemberChangeOptions = {}): Promise<void> {
  const revoked = await inTransaction(db, async (trx) => {
    const { member, isLastOwner } = await lockMemberships(trx, input.organizationId, input.userId);
    refuseUnlessAllowed(options, member.role);
    if (isLastOwner) throw new ConflictError('the last owner of an organization cannot be removed');
    await trx.deleteFrom('memberships').where('organization_id', '=', input.organizationId).where('user_id', '=', input.userId).execute();
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId: input.organizationId,
      action: 'member.removed',
      details: { user_id: input.userId, role: member.role },
    });
    return revokeGrantsInTransaction(trx, { organizationId: input.organizationId, userId: input.userId }, 'member_removed', options.actor);
  });
  options.revocations?.noteRevoked(revoked, 'member_removed');
}

export interface Member {
  user_id: number;
  email: string;
  name: string;
  role: Role;
  created_at: Date;
}

/** An organization's members in user id order, a page at a time (keyset on the memberships primary key). */
export async function listMembers(db: DB, organizationId: number, page: { afterUserId: number; limit: number }): Promise<Member[]> {
  return db
    .selectFrom('memberships')
    .innerJoin('users', 'users.id', 'memberships.user_id')
    .select(['memberships.user_id', 'users.email', 'users.name', 'memberships.role', 'memberships.created_at'])
    .where('memberships.organization_id', '=', organizationId)
    .where('memberships.user_id', '>', page.afterUserId)
    .orderBy('memberships.user_id')
    .limit(page.limit)
    .execute();
}

/** A member of the organization, or NotFoundError (also for another organization's). */
export async function getMember(db: DB, organizationId: number, userId: number): Promise<Member> {
  const member = await db
    .selectFrom('memberships')
    .innerJoin('users', 'users.id', 'memberships.user_id')
    .select(['memberships.user_id', 'users.email', 'users.name', 'memberships.role', 'memberships.created_at'])
    .where('memberships.organization_id', '=', organizationId)
    .where('memberships.user_id', '=', userId)
    .executeTakeFirst();
  if (!member) throw new NotFoundError('no such member in this organization');
  return member;
}
