import { z } from 'zod';
import { recordAuditEvent } from '../audit/events.js';
import { revokeGrant } from '../oauth/grant-store.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { Organization, Role } from '../db/schema.js';
import { ConflictError, NotFoundError } from '../errors.js';
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
      actorUserId: input.ownerUserId,
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

export interface MembershipResult {
  organization_id: number;
  user_id: number;
  role: Role;
}

/** Adds a user to an organization. A user already in it is a ConflictError (roles change elsewhere). */
export async function addMember(
  db: DB,
  input: { organizationId: number; userId: number; role: Role; actorUserId?: number | null },
): Promise<MembershipResult> {
  return inTransaction(db, async (trx) => {
    await getOrganization(trx, input.organizationId);
    try {
      const membership = await trx
        .insertInto('memberships')
        .values({ organization_id: input.organizationId, user_id: input.userId, role: input.role })
        .returning(['organization_id', 'user_id', 'role'])
        .executeTakeFirstOrThrow();
      await recordAuditEvent(trx, {
        organizationId: input.organizationId,
        action: 'member.added',
        actorUserId: input.actorUserId ?? null,
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
 * Removes a user from an organization and revokes every grant that user gave there, so their
 * tokens stop working on every instance (the API never has to re-check membership). The last
 * owner cannot be removed.
 */
export async function removeMember(db: DB, input: { organizationId: number; userId: number; actorUserId?: number | null }): Promise<void> {
  await inTransaction(db, async (trx) => {
    const owners = await trx
      .selectFrom('memberships')
      .select(['user_id', 'role'])
      .where('organization_id', '=', input.organizationId)
      .forUpdate()
      .execute();
    const member = owners.find((m) => m.user_id === input.userId);
    if (!member) throw new NotFoundError(`user ${input.userId} is not a member of organization ${input.organizationId}`);
    if (member.role === 'owner' && owners.filter((m) => m.role === 'owner').length === 1) {
      throw new ConflictError('the last owner of an organization cannot be removed');
    }
    await trx.deleteFrom('memberships').where('organization_id', '=', input.organizationId).where('user_id', '=', input.userId).execute();
    await recordAuditEvent(trx, {
      organizationId: input.organizationId,
      action: 'member.removed',
      actorUserId: input.actorUserId ?? null,
      details: { user_id: input.userId, role: member.role },
    });
    const grants = await trx
      .selectFrom('grants')
      .select('id')
      .where('organization_id', '=', input.organizationId)
      .where('user_id', '=', input.userId)
      .where('revoked_at', 'is', null)
      .execute();
    for (const grant of grants) await revokeGrant(trx, grant.id, 'member_removed', { actorUserId: input.actorUserId ?? null });
  });
}
