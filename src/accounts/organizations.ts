import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { countLiveGrants, memberRemovalPayload, narrowGrantsInTransaction, REVOCATION_CHANNEL, revokeBatch, type RevokedGrantsMemory } from '../oauth/models/grants.js';
import { enqueueJob, type JobHandler } from '../jobs/queue.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { BuiltinRole, Organization } from '../db/schema.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../errors.js';
import { parseInput } from '../lib/validate.js';
import { builtinRole, lockRole, mayAssign, narrowingAllowance, roleOf, type RoleRef } from './roles.js';
import { ssoRequiredSql } from '../sso/required.js';

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

/**
 * Changes an organization's name or its two-step sign-in requirement, audited. Turning the
 * requirement on takes effect at once: members with a one-step session cannot choose it at
 * consent or reach its dashboard, codes issued to them are not redeemed, and grants made from
 * a one-step sign-in are not refreshed (their users sign in again with two factors).
 */
export async function updateOrganization(
  db: DB,
  organizationId: number,
  change: { name?: string | undefined; requireMfa?: boolean | undefined },
  actor?: Actor,
): Promise<Organization> {
  const name = change.name === undefined ? undefined : parseInput(organizationNameSchema, change.name);
  return inTransaction(db, async (trx) => {
    const before = await trx.selectFrom('organizations').selectAll().where('id', '=', organizationId).forUpdate().executeTakeFirst();
    if (!before) throw new NotFoundError(`organization ${organizationId} not found`);
    const set = {
      ...(name !== undefined && name !== before.name ? { name } : {}),
      ...(change.requireMfa !== undefined && change.requireMfa !== before.require_mfa ? { require_mfa: change.requireMfa } : {}),
    };
    if (Object.keys(set).length === 0) return before;
    const after = await trx.updateTable('organizations').set({ ...set, updated_at: new Date() }).where('id', '=', organizationId).returningAll().executeTakeFirstOrThrow();
    await recordAuditEvent(trx, { organizationId, action: 'organization.updated', actor, details: set });
    return after;
  });
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
  /** The role's name: a built-in one, or the organization's own. */
  role: string;
}

/**
 * Who changes a membership: the audit log's actor and the role they act with (see mayAssign); an
 * owner by default. Whoever acts for the organization acts with a role: a dashboard user with
 * theirs, an application through the management API as an admin (ownership stays a human
 * decision), the operator's CLI as an owner.
 */
export interface MemberChangeOptions {
  actor?: Actor | undefined;
  actingAs?: RoleRef | BuiltinRole | undefined;
  /** This instance's revoked set, told of the grants a role change narrows, or of a removal, once it has committed. */
  revocations?: (RevokedGrantsMemory & Partial<RemovedMembersMemory>) | undefined;
}

/** This instance's memory of removed members (RevocationList), told of a removal made here once it has committed. */
export interface RemovedMembersMemory {
  noteMemberRemoved(organizationId: number, userId: number, removedAtS: number): void;
}

/** A role given as a built-in's name, or as found (findRole). */
export const asRoleRef = (role: RoleRef | BuiltinRole): RoleRef => (typeof role === 'string' ? builtinRole(role) : role);

function refuseUnlessAllowed(options: MemberChangeOptions, ...roles: RoleRef[]): void {
  const actingAs = asRoleRef(options.actingAs ?? 'owner');
  for (const role of roles) {
    if (mayAssign(actingAs, role)) continue;
    throw new ForbiddenError(
      role.kind === 'owner' ? 'only an owner may make an owner, or change or remove one' : `your role may not give or take away the role ${role.name}: it holds permissions yours does not`,
    );
  }
}

/**
 * Adds a user to an organization. A user already in it is a ConflictError (roles change
 * elsewhere). Someone acting through the product (`options.actor`: a dashboard user, an
 * application) may add only a user whose email address is verified: an unverified account may
 * belong to someone who merely typed that address. The operator (no actor) vouches for anyone.
 */
export async function addMember(
  db: DB,
  input: { organizationId: number; userId: number; role: RoleRef | BuiltinRole },
  options: MemberChangeOptions = {},
): Promise<MembershipResult> {
  return inTransaction(db, async (trx) => {
    await getOrganization(trx, input.organizationId);
    const role = await lockRole(trx, input.organizationId, asRoleRef(input.role));
    refuseUnlessAllowed(options, role);
    if (options.actor) {
      const user = await trx.selectFrom('users').select('email_verified_at').where('id', '=', input.userId).executeTakeFirst();
      if (!user) throw new NotFoundError(`user ${input.userId} not found`);
      if (user.email_verified_at === null) throw new UnverifiedEmailError();
    }
    try {
      await trx
        .insertInto('memberships')
        .values({ organization_id: input.organizationId, user_id: input.userId, role: role.kind, role_id: role.id })
        .execute();
      await forgetRemoval(trx, input.organizationId, input.userId);
      await recordAuditEvent(trx, {
        actor: options.actor,
        organizationId: input.organizationId,
        action: 'member.added',
        details: { user_id: input.userId, role: role.name },
      });
      return { organization_id: input.organizationId, user_id: input.userId, role: role.name };
    } catch (err) {
      if (isUniqueViolation(err)) throw new ConflictError(`user ${input.userId} is already a member of organization ${input.organizationId}`);
      throw err;
    }
  });
}

/**
 * The member `userId` with their role, locked for the rest of the transaction, and whether they
 * are the organization's last owner. Only a change to an owner can leave the organization without
 * one, so only then is the organization row locked (FOR NO KEY UPDATE: inserts of members, which
 * key-share it, go on) before the owners are counted: two concurrent demotions or removals of
 * owners queue there, and the second counts what the first committed (RO-3). Nobody else is
 * locked: an organization may have a million members, and changing a member's role does not wait
 * for any other member's change.
 */
async function lockMemberships(trx: DB, organizationId: number, userId: number) {
  const row = await membershipsWithRoles(trx, organizationId).where('memberships.user_id', '=', userId).forUpdate('memberships').executeTakeFirst();
  if (!row) throw new NotFoundError('no such member in this organization');
  let isLastOwner = false;
  if (row.role === 'owner') {
    await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().execute();
    // Off the owners' partial index: as many rows as there are owners.
    const owners = await trx.selectFrom('memberships').select('user_id').where('organization_id', '=', organizationId).where('role', '=', 'owner').limit(2).execute();
    isLastOwner = owners.length === 1;
  }
  return { member: roleOf(row), isLastOwner };
}

function membershipsWithRoles(trx: DB, organizationId: number) {
  return trx
    .selectFrom('memberships')
    .leftJoin('roles', 'roles.id', 'memberships.role_id')
    .select(['memberships.user_id', 'memberships.role', 'memberships.role_id', 'roles.name as role_name', 'roles.permissions as role_permissions'])
    .where('memberships.organization_id', '=', organizationId);
}

/**
 * Changes a member's role. The last owner cannot be demoted (RO-3). Permissions the new role
 * lacks are taken from the member's grants in the organization in the same transaction
 * (narrowGrantsInTransaction): their tokens lose them on every instance within a second.
 */
export async function changeMemberRole(
  db: DB,
  input: { organizationId: number; userId: number; role: RoleRef | BuiltinRole },
  options: MemberChangeOptions = {},
): Promise<MembershipResult> {
  const { result, revoked } = await inTransaction(db, async (trx) => {
    const { member, isLastOwner } = await lockMemberships(trx, input.organizationId, input.userId);
    const asked = asRoleRef(input.role);
    // The role they hold already: nothing to lock or change (and no wait on a role being deleted,
    // which locks its members after the role).
    if (member.kind === asked.kind && member.id === asked.id) {
      refuseUnlessAllowed(options, member);
      return { result: { organization_id: input.organizationId, user_id: input.userId, role: member.name }, revoked: [] };
    }
    const role = await lockRole(trx, input.organizationId, asked);
    const result = { organization_id: input.organizationId, user_id: input.userId, role: role.name };
    refuseUnlessAllowed(options, member, role);
    if (isLastOwner) throw new ConflictError('the last owner of an organization cannot be demoted; make someone else an owner first');
    await trx
      .updateTable('memberships')
      .set({ role: role.kind, role_id: role.id })
      .where('organization_id', '=', input.organizationId)
      .where('user_id', '=', input.userId)
      .execute();
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId: input.organizationId,
      action: 'member.role_changed',
      details: { user_id: input.userId, from: member.name, to: role.name },
    });
    return { result, revoked: await narrowGrantsInTransaction(trx, { organizationId: input.organizationId, userId: input.userId }, narrowingAllowance(role), options.actor) };
  });
  options.revocations?.noteRevoked(revoked, 'role_changed');
  return result;
}

/**
 * Removes a user from an organization. The last owner cannot be removed (RO-3). The removal
 * takes effect at once: every instance refuses the access tokens the user had in the
 * organization within a second (the revoked set holds the removal: RevocationList), their
 * refresh tokens stop (a refresh needs the membership, and a grant from before a removal is
 * never refreshed again), and a job queued in the same transaction (memberGrantsJob) revokes
 * their grants there, however many, with an audit entry each. The request does not wait for it.
 */
export async function removeMember(db: DB, input: { organizationId: number; userId: number }, options: MemberChangeOptions = {}): Promise<void> {
  const removedAtS = await inTransaction(db, async (trx) => {
    const { member, isLastOwner } = await lockMemberships(trx, input.organizationId, input.userId);
    refuseUnlessAllowed(options, member);
    if (isLastOwner) throw new ConflictError('the last owner of an organization cannot be removed');
    await trx.deleteFrom('memberships').where('organization_id', '=', input.organizationId).where('user_id', '=', input.userId).execute();
    // Remembered: automation (SSO's just-in-time provisioning) never adds them back, and their
    // tokens and grants from before now are ended. Now is the clock's, not the transaction's
    // start: a code redemption holding the membership's share lock, which we waited for above,
    // made its grant before it.
    const removal = await trx
      .insertInto('removed_members')
      .values({ organization_id: input.organizationId, user_id: input.userId, removed_at: sql<Date>`clock_timestamp()` })
      .onConflict((oc) => oc.columns(['organization_id', 'user_id']).doUpdateSet({ removed_at: sql<Date>`excluded.removed_at`, restored_at: null }))
      .returning([
        sql<number>`extract(epoch from removed_at)::float8`.as('removed_at_s'),
        sql<string>`to_char(removed_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`.as('removed_at'),
      ])
      .executeTakeFirstOrThrow();
    await sql`select pg_notify(${REVOCATION_CHANNEL}, ${memberRemovalPayload(input.organizationId, input.userId, removal.removed_at_s)})`.execute(trx);
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId: input.organizationId,
      action: 'member.removed',
      details: { user_id: input.userId, role: member.name },
    });
    const payload: MemberGrantsPayload = { user_id: input.userId, removed_at: removal.removed_at, actor: options.actor ?? {} };
    await enqueueJob(trx, { kind: MEMBER_GRANTS_JOB, organizationId: input.organizationId, payload: { ...payload } });
    return removal.removed_at_s;
  });
  options.revocations?.noteMemberRemoved?.(input.organizationId, input.userId, removedAtS);
}

/**
 * What removeMember would refuse, checked without changing anything, for a page that asks first:
 * no such member (NotFoundError), a role the remover's may not take away (ForbiddenError), the
 * last owner (ConflictError), with removeMember's messages. removeMember checks again, under its locks.
 */
export async function checkMemberRemoval(db: DB, input: { organizationId: number; userId: number }, options: MemberChangeOptions = {}): Promise<void> {
  const row = await membershipsWithRoles(db, input.organizationId).where('memberships.user_id', '=', input.userId).executeTakeFirst();
  if (!row) throw new NotFoundError('no such member in this organization');
  const member = roleOf(row);
  refuseUnlessAllowed(options, member);
  if (member.kind !== 'owner') return;
  const owners = await db.selectFrom('memberships').select('user_id').where('organization_id', '=', input.organizationId).where('role', '=', 'owner').limit(2).execute();
  if (owners.length === 1) throw new ConflictError('the last owner of an organization cannot be removed');
}

interface MemberGrantsPayload {
  user_id: number;
  /** The removal's time, to the microsecond: the job's bound even if the row has moved on or gone. */
  removed_at: string;
  actor: Actor;
}

export const MEMBER_GRANTS_JOB = 'member.revoke_grants';

/**
 * The job that revokes a removed member's grants in the organization, REVOKE_BATCH (300) a
 * step by keyset on their live grants in id order (grants_live_member_id_idx), each published
 * to every instance as it commits (revokeBatch). Only grants made before their latest removal:
 * if someone added them back meanwhile, what they were granted since is theirs.
 */
export function memberGrantsJob(memory?: RevokedGrantsMemory): JobHandler<MemberGrantsPayload, { after: number }> {
  return {
    kind: MEMBER_GRANTS_JOB,
    async step(trx, job, cursor) {
      const selection = { organizationId: job.organizationId!, userId: job.payload.user_id, removedAt: job.payload.removed_at };
      // Progress: how many there are, counted once off the same index.
      const total = cursor === null ? await countLiveGrants(trx, selection) : undefined;
      const ids = await revokeBatch(trx, selection, 'member_removed', job.payload.actor, cursor?.after ?? 0);
      if (ids.length === 0) return { cursor, processed: 0, finished: true, total };
      return { cursor: { after: Math.max(...ids) }, processed: ids.length, finished: false, total, afterCommit: () => memory?.noteRevoked(ids, 'member_removed') };
    },
  };
}

/**
 * A person added again by hand (an admin, an invitation) is no longer one the organization
 * removed. The row stays, restored: its removed_at still ends their tokens and grants from
 * before the removal (the job revoking those may not have finished).
 */
export async function forgetRemoval(trx: DB, organizationId: number, userId: number): Promise<void> {
  await trx
    .updateTable('removed_members')
    .set({ restored_at: sql<Date>`now()` })
    .where('organization_id', '=', organizationId)
    .where('user_id', '=', userId)
    .where('restored_at', 'is', null)
    .execute();
}

/** Whether the organization removed this person (and nobody added them back by hand since). */
export async function wasRemoved(db: DB, organizationId: number, userId: number): Promise<boolean> {
  const row = await db
    .selectFrom('removed_members')
    .select('user_id')
    .where('organization_id', '=', organizationId)
    .where('user_id', '=', userId)
    .where('restored_at', 'is', null)
    .executeTakeFirst();
  return row !== undefined;
}

export interface Member {
  user_id: number;
  email: string;
  name: string;
  /** The role's name. */
  role: string;
  /** Whether the member has a second factor (an authenticator app or a passkey). */
  two_step: boolean;
  created_at: Date;
}

function members(db: DB, organizationId: number) {
  return db
    .selectFrom('memberships')
    .innerJoin('users', 'users.id', 'memberships.user_id')
    .leftJoin('roles', 'roles.id', 'memberships.role_id')
    .select(['memberships.user_id', 'users.email', 'users.name', 'memberships.role', 'memberships.role_id', 'roles.name as role_name', 'memberships.created_at'])
    .select((eb) =>
      eb
        .or([
          eb.exists(eb.selectFrom('totp_factors').select('totp_factors.user_id').whereRef('totp_factors.user_id', '=', 'memberships.user_id').where('totp_factors.confirmed_at', 'is not', null)),
          eb.exists(eb.selectFrom('passkeys').select('passkeys.id').whereRef('passkeys.user_id', '=', 'memberships.user_id')),
        ])
        .as('two_step'),
    )
    .where('memberships.organization_id', '=', organizationId);
}

const memberOf = ({ role, role_id, role_name, two_step, ...rest }: { role: RoleRef['kind']; role_id: number | null; role_name: string | null; two_step: boolean | number } & Omit<Member, 'role' | 'two_step'>): Member => ({
  ...rest,
  role: roleOf({ role, role_id, role_name }).name,
  two_step: Boolean(two_step),
});

/** An organization's members in user id order, a page at a time (keyset on the memberships primary key). */
export async function listMembers(db: DB, organizationId: number, page: { afterUserId: number; limit: number }): Promise<Member[]> {
  const rows = await members(db, organizationId)
    .where('memberships.user_id', '>', page.afterUserId)
    // Said of users too: PostgreSQL does not carry a range across the join, and without it a merge
    // join read users from the first id (a page 900,000 deep read 900,000 users: 74 ms, not 1).
    .where('users.id', '>', page.afterUserId)
    .orderBy('memberships.user_id')
    .limit(page.limit)
    .execute();
  return rows.map(memberOf);
}

/** A member of the organization, or NotFoundError (also for another organization's). */
export async function getMember(db: DB, organizationId: number, userId: number): Promise<Member> {
  const member = await members(db, organizationId).where('memberships.user_id', '=', userId).executeTakeFirst();
  if (!member) throw new NotFoundError('no such member in this organization');
  return memberOf(member);
}

/** An organization of the user's, with their role there: `role` its name, `access` the role itself. */
export interface UserOrganization {
  id: number;
  name: string;
  role: string;
  access: RoleRef;
  /** Members reach it only after signing in with two factors. */
  requireMfa: boolean;
  /** It requires this user to sign in through one of its connections (SS-4, src/sso/required.ts). */
  ssoRequired: boolean;
}

/** The organizations a user belongs to, with their role in each (dashboard, consent page). */
export async function listUserOrganizations(db: DB, userId: number): Promise<UserOrganization[]> {
  const rows = await db
    .selectFrom('memberships')
    .innerJoin('organizations', 'organizations.id', 'memberships.organization_id')
    .innerJoin('users', 'users.id', 'memberships.user_id')
    .leftJoin('roles', 'roles.id', 'memberships.role_id')
    .select(['organizations.id', 'organizations.name', 'organizations.require_mfa', 'memberships.role', 'memberships.role_id', 'roles.name as role_name', 'roles.permissions as role_permissions'])
    .select(ssoRequiredSql(sql.ref('organizations.id'), sql.ref('users.email')).as('sso_required'))
    .where('memberships.user_id', '=', userId)
    .orderBy('organizations.name')
    .orderBy('organizations.id')
    .execute();
  return rows.map((row) => {
    const access = roleOf(row);
    return { id: row.id, name: row.name, role: access.name, access, requireMfa: row.require_mfa, ssoRequired: row.sso_required };
  });
}
