/**
 * An organization's SCIM directories (issue 43): each is one SCIM client (an Okta or Entra ID
 * application) that provisions and deprovisions the organization's members. What the management
 * API, the dashboard and the CLI show and do; one set of rules for the three.
 *
 * The bearer token is random (`scim_` and 43 base64url characters), leaves the server only in
 * the answer that made it (create, rotate) and is kept as its SHA-256: rotating replaces the
 * hash in one statement, so the old token stops at once on every instance (each request looks
 * the hash up). A directory gives provisioned members its default role unless a mapped group
 * gives a higher one; neither is ever owner (an owner is made by people, not by a directory).
 * Every change is audited in its own transaction.
 */
import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import type { DirectoryRole } from '../db/schema.js';
import { builtinRole, mayAssign, type RoleRef } from '../accounts/roles.js';
import { ConflictError, ForbiddenError, NotFoundError } from '../errors.js';
import { generateSecret, sha256Hex } from '../lib/crypto.js';
import { parseInput } from '../lib/validate.js';
import { queueRoleSync } from './provisioning.js';

/** Directories per organization: one per identity provider, and one more while one replaces another. */
export const MAX_DIRECTORIES = 10;
/** Group mappings per directory. */
export const MAX_GROUP_ROLES = 100;
/** The roles a directory may give, lowest first: a member of several mapped groups gets the highest. */
export const DIRECTORY_ROLES: readonly DirectoryRole[] = ['viewer', 'member', 'admin'];
const TOKEN_PREFIX = 'scim_';

export interface GroupRole {
  /** A SCIM group's displayName or id (compared without case). */
  group: string;
  role: DirectoryRole;
}

/** A directory as it leaves the server: never its token, which only create and rotate answer with. */
export interface DirectoryView {
  id: number;
  organization_id: number;
  name: string;
  state: 'active' | 'disabled';
  default_role: DirectoryRole;
  group_roles: GroupRole[];
  token_created_at: Date;
  created_at: Date;
  updated_at: Date;
}

const roleSchema = z.enum(DIRECTORY_ROLES as [DirectoryRole, ...DirectoryRole[]], { message: `must be one of ${DIRECTORY_ROLES.join(', ')} (a directory never makes owners)` });
const nameSchema = z.string().trim().min(1, 'must not be empty').max(200, 'must be at most 200 characters');
const groupRolesSchema = z
  .array(z.object({ group: z.string().trim().min(1, 'must not be empty').max(256, 'must be at most 256 characters'), role: roleSchema }).strict())
  .max(MAX_GROUP_ROLES, `at most ${MAX_GROUP_ROLES} group mappings`)
  .refine((list) => new Set(list.map((g) => g.group.toLowerCase())).size === list.length, 'each group may be mapped once');

export const createDirectorySchema = z
  .object({ name: nameSchema, default_role: roleSchema.optional(), group_roles: groupRolesSchema.optional() })
  .strict();
export const updateDirectorySchema = z
  .object({ name: nameSchema.optional(), state: z.enum(['active', 'disabled']).optional(), default_role: roleSchema.optional(), group_roles: groupRolesSchema.optional() })
  .strict();

/**
 * Refuses a directory configuration that gives (or, when replaced, took away) a role `actingAs`
 * could not give a member by hand: a holder of directory.write alone must not make admins by
 * mapping a group. Undefined actingAs: the operator or an owner's setup link, who may.
 */
function refuseRolesBeyond(actingAs: RoleRef | undefined, roles: Iterable<DirectoryRole>): void {
  if (actingAs === undefined) return;
  for (const role of new Set(roles)) {
    if (!mayAssign(actingAs, builtinRole(role))) throw new ForbiddenError(`your role may not give the role ${role}: it holds permissions yours does not`);
  }
}

const rolesOf = (fields: { default_role?: DirectoryRole | undefined; group_roles?: readonly GroupRole[] | undefined }) => [
  ...(fields.default_role !== undefined ? [fields.default_role] : []),
  ...(fields.group_roles ?? []).map((g) => g.role),
];

function newToken(): { token: string; hash: string } {
  const token = `${TOKEN_PREFIX}${generateSecret(32)}`;
  return { token, hash: sha256Hex(token) };
}

async function groupRolesOf(db: DB, directoryIds: readonly number[]): Promise<Map<number, GroupRole[]>> {
  const byDirectory = new Map<number, GroupRole[]>(directoryIds.map((id) => [id, []]));
  if (directoryIds.length === 0) return byDirectory;
  const rows = await db
    .selectFrom('directory_group_roles')
    .select(['directory_id', 'group_ref', 'role'])
    .where('directory_id', 'in', directoryIds)
    .orderBy('directory_id')
    .orderBy(sql`lower(group_ref)`)
    .execute();
  for (const row of rows) byDirectory.get(Number(row.directory_id))?.push({ group: row.group_ref, role: row.role });
  return byDirectory;
}

const COLUMNS = ['id', 'organization_id', 'name', 'state', 'default_role', 'token_created_at', 'created_at', 'updated_at'] as const;

/** The organization's directories, oldest first (at most MAX_DIRECTORIES). */
export async function listDirectories(db: DB, organizationId: number): Promise<DirectoryView[]> {
  const rows = await db.selectFrom('directories').select(COLUMNS).where('organization_id', '=', organizationId).orderBy('id').limit(MAX_DIRECTORIES).execute();
  const groups = await groupRolesOf(db, rows.map((r) => Number(r.id)));
  return rows.map((r) => ({ ...r, id: Number(r.id), organization_id: Number(r.organization_id), group_roles: groups.get(Number(r.id)) ?? [] }));
}

/** One of the organization's directories; NotFoundError for another organization's. */
export async function getDirectory(db: DB, organizationId: number, id: number): Promise<DirectoryView> {
  const row = await db.selectFrom('directories').select(COLUMNS).where('organization_id', '=', organizationId).where('id', '=', id).executeTakeFirst();
  if (!row) throw new NotFoundError('directory not found');
  const groups = await groupRolesOf(db, [id]);
  return { ...row, id: Number(row.id), organization_id: Number(row.organization_id), group_roles: groups.get(id) ?? [] };
}

const canonicalMappings = (list: readonly GroupRole[]) => list.map((g) => [g.group.toLowerCase(), g.role]).sort(([a], [b]) => (a! < b! ? -1 : a! > b! ? 1 : 0));

async function replaceGroupRoles(trx: DB, directoryId: number, groupRoles: readonly GroupRole[]): Promise<void> {
  await trx.deleteFrom('directory_group_roles').where('directory_id', '=', directoryId).execute();
  if (groupRoles.length > 0) {
    await trx.insertInto('directory_group_roles').values(groupRoles.map((g) => ({ directory_id: directoryId, group_ref: g.group, role: g.role }))).execute();
  }
}

/** Makes a directory; its token is in this answer only. `actingAs`: the role of whoever asks, who may configure only roles they could give. */
export async function createDirectory(db: DB, organizationId: number, input: unknown, actor?: Actor, actingAs?: RoleRef): Promise<{ directory: DirectoryView; token: string }> {
  const fields = parseInput(createDirectorySchema, input);
  refuseRolesBeyond(actingAs, [fields.default_role ?? 'member', ...rolesOf(fields)]);
  const { token, hash } = newToken();
  const id = await inTransaction(db, async (trx) => {
    // The organization's row, locked: two creations at once cannot both pass the count.
    const organization = await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().executeTakeFirst();
    if (!organization) throw new NotFoundError('organization not found');
    const { count } = await trx.selectFrom('directories').select((eb) => eb.fn.countAll<number>().as('count')).where('organization_id', '=', organizationId).executeTakeFirstOrThrow();
    if (Number(count) >= MAX_DIRECTORIES) throw new ConflictError(`an organization may have at most ${MAX_DIRECTORIES} directories`);
    const row = await trx
      .insertInto('directories')
      .values({ organization_id: organizationId, name: fields.name, default_role: fields.default_role ?? 'member', token_hash: hash, updated_at: sql`now()` })
      .returning('id')
      .executeTakeFirstOrThrow();
    const directoryId = Number(row.id);
    await replaceGroupRoles(trx, directoryId, fields.group_roles ?? []);
    await recordAuditEvent(trx, {
      organizationId,
      action: 'directory.created',
      actor,
      details: { directory_id: directoryId, name: fields.name, default_role: fields.default_role ?? 'member', group_roles: fields.group_roles ?? [] },
    });
    return directoryId;
  });
  return { directory: await getDirectory(db, organizationId, id), token };
}

/**
 * Changes what `input` names and keeps the rest; group_roles, when given, replaces the mappings
 * whole. A new default role or new mappings change the roles of members the directory already
 * provisioned: a job walks them (src/directory/provisioning.ts, directoryRolesJob), narrowing the
 * grants of those whose role went down as any role change does.
 */
export async function updateDirectory(db: DB, organizationId: number, id: number, input: unknown, actor?: Actor, actingAs?: RoleRef): Promise<DirectoryView> {
  const fields = parseInput(updateDirectorySchema, input);
  await inTransaction(db, async (trx) => {
    const current = await trx.selectFrom('directories').select(['id', 'organization_id', 'name', 'state', 'default_role']).where('organization_id', '=', organizationId).where('id', '=', id).forUpdate().executeTakeFirst();
    if (!current) throw new NotFoundError('directory not found');
    const before = (await groupRolesOf(trx, [id])).get(id) ?? [];
    const rolesChanged =
      (fields.default_role !== undefined && fields.default_role !== current.default_role) ||
      (fields.group_roles !== undefined && JSON.stringify(canonicalMappings(fields.group_roles)) !== JSON.stringify(canonicalMappings(before)));
    // What changes, both what it gives and what it took: taking admin from a group's members is as much a role change as giving it.
    if (rolesChanged) refuseRolesBeyond(actingAs, [...rolesOf(fields), ...(fields.default_role !== undefined ? [current.default_role] : []), ...(fields.group_roles !== undefined ? before.map((g) => g.role) : [])]);
    const changes = { ...(fields.name !== undefined ? { name: fields.name } : {}), ...(fields.state !== undefined ? { state: fields.state } : {}), ...(fields.default_role !== undefined ? { default_role: fields.default_role } : {}) };
    await trx.updateTable('directories').set({ ...changes, updated_at: sql`now()` }).where('id', '=', id).execute();
    if (fields.group_roles !== undefined) await replaceGroupRoles(trx, id, fields.group_roles);
    if (rolesChanged) await queueRoleSync(trx, { id, organization_id: organizationId }, 'mappings_changed');
    await recordAuditEvent(trx, {
      organizationId,
      action: 'directory.updated',
      actor,
      details: { directory_id: id, ...changes, ...(fields.group_roles !== undefined ? { group_roles: fields.group_roles } : {}) },
    });
  });
  return getDirectory(db, organizationId, id);
}

/** A new token for the directory; the old one is refused from the moment this commits. */
export async function rotateDirectoryToken(db: DB, organizationId: number, id: number, actor?: Actor): Promise<{ directory: DirectoryView; token: string }> {
  const { token, hash } = newToken();
  await inTransaction(db, async (trx) => {
    const row = await trx
      .updateTable('directories')
      .set({ token_hash: hash, token_created_at: sql`now()`, updated_at: sql`now()` })
      .where('organization_id', '=', organizationId)
      .where('id', '=', id)
      .returning('id')
      .executeTakeFirst();
    if (!row) throw new NotFoundError('directory not found');
    await recordAuditEvent(trx, { organizationId, action: 'directory.token_rotated', actor, details: { directory_id: id } });
  });
  return { directory: await getDirectory(db, organizationId, id), token };
}

/** Deletes the directory and its mappings; its token stops with it. */
export async function deleteDirectory(db: DB, organizationId: number, id: number, actor?: Actor): Promise<void> {
  await inTransaction(db, async (trx) => {
    const row = await trx.deleteFrom('directories').where('organization_id', '=', organizationId).where('id', '=', id).returning('name').executeTakeFirst();
    if (!row) throw new NotFoundError('directory not found');
    await recordAuditEvent(trx, { organizationId, action: 'directory.deleted', actor, details: { directory_id: id, name: row.name } });
  });
}

/**
 * The active directory `id` whose token is `token`, or undefined: one indexed read of the token's
 * hash (the hash is unique), then the id compared, so a token only ever opens its own directory.
 */
export async function authenticateDirectory(db: DB, id: number, token: string): Promise<DirectoryView | undefined> {
  if (!token.startsWith(TOKEN_PREFIX) || token.length > 100) return undefined;
  const row = await db.selectFrom('directories').select(['id', 'organization_id']).where('token_hash', '=', sha256Hex(token)).where('state', '=', 'active').executeTakeFirst();
  if (!row || Number(row.id) !== id) return undefined;
  return getDirectory(db, Number(row.organization_id), id);
}
