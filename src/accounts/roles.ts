/**
 * Organization roles: what a member may do in an organization, and so what they may grant an
 * application there. A role is a set of permissions, and a permission is a scope name: the data
 * scopes are what a user can delegate to a third-party application at consent; the management
 * scopes are the dashboard's abilities (manage applications, manage members and roles, revoke
 * anyone's connected apps, view the audit log), the same names the management API asks an
 * application's token for. One vocabulary, so a role that may manage members in the dashboard is
 * exactly one that may give a private application `members.write`.
 *
 * Every organization has the built-in roles (below, not editable or deletable) and up to
 * MAX_CUSTOM_ROLES of its own (the roles table). Whoever assigns, edits or deletes a role may only
 * hand out what they hold themselves (mayAssign): delegation is bounded by the delegator's role.
 */
import { type Expression, type RawBuilder, sql, type Transaction } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isCheckViolation, isUniqueViolation } from '../db/errors.js';
import type { BuiltinRole, CustomRole, Database, RoleKind } from '../db/schema.js';
import { ConflictError, ForbiddenError, InvalidRequestError, NotFoundError } from '../errors.js';
import { type GrantAllowance, narrowGrantsInBatches, narrowGrantsInTransaction, type RevokedGrantsMemory } from '../oauth/models/grants.js';
import { enqueueJob, type JobHandler } from '../jobs/queue.js';
import { declaredScopeNames, isDeclaredScope } from '../oauth/models/resources.js';
import { DATA_SCOPES, isKnownScope, KNOWN_SCOPES, KNOWN_SCOPES_SQL, knownScopesOf, type Scope } from '../oauth/helpers/scopes.js';
import { isWellFormed, parseInput } from '../lib/validate.js';

export type Permission = Scope;
export const PERMISSIONS: readonly Permission[] = KNOWN_SCOPES;

/** What each permission lets a member do, as the Roles page and the API describe it. */
export const PERMISSION_DESCRIPTIONS: Record<Permission, string> = {
  'contacts.read': 'Read contacts, and let applications read them',
  'contacts.write': 'Create, change and delete contacts, and let applications do so',
  'tasks.read': 'Read tasks, and let applications read them',
  'tasks.write': 'Create, change and delete tasks, and let applications do so',
  'applications.read': 'See the organization’s applications',
  'applications.write': 'Manage applications: create, change, disable, delete, rotate secrets, generate tokens',
  'members.read': 'See the members, their roles and the roles',
  'members.write': 'Manage members, invitations and roles',
  'grants.read': 'See every member’s connected apps',
  'grants.write': 'Revoke any member’s connected apps',
  'audit.read': 'View the audit log',
  'sso.read': 'See the SSO connections and the verified domains',
  'sso.write': 'Manage SSO connections and domains: connect identity providers, verify domains, require SSO',
  'webhooks.read': 'See the webhook endpoints and their deliveries',
  'webhooks.write': 'Manage webhook endpoints: create, change, delete, rotate their secrets, ping them, retry deliveries',
  'directory.read': 'See the SCIM directories that provision members',
  'directory.write': 'Manage SCIM directories: create, change, delete and rotate their tokens',
};

export interface BuiltinRoleDefinition {
  description: string;
  permissions: readonly Permission[];
}

export const BUILTIN_ROLES: Readonly<Record<BuiltinRole, BuiltinRoleDefinition>> = {
  owner: { description: 'Everything, including making, changing and removing owners', permissions: KNOWN_SCOPES },
  admin: { description: 'Everything but making, changing or removing owners', permissions: KNOWN_SCOPES },
  // What members could do before roles had permissions: the data, and a look at everything else.
  member: { description: 'All data; sees applications, members, connected apps and the audit log', permissions: [...DATA_SCOPES, 'applications.read', 'members.read', 'grants.read', 'audit.read'] },
  viewer: { description: 'Reads contacts and tasks', permissions: ['contacts.read', 'tasks.read'] },
};

export const BUILTIN_ROLE_NAMES = Object.keys(BUILTIN_ROLES) as BuiltinRole[];
/** Custom roles per organization: the Roles page and GET /roles list them all at once. */
export const MAX_CUSTOM_ROLES = 100;

/** A role as everything outside the database sees it: built-in (id null) or one of the organization's own. */
export interface RoleRef {
  kind: RoleKind;
  /** The custom role's id; null for a built-in role. */
  id: number | null;
  name: string;
  permissions: readonly Permission[];
}

export function isBuiltinRole(name: string): name is BuiltinRole {
  return Object.hasOwn(BUILTIN_ROLES, name);
}

/** Whether `name` could name one of an organization's own roles (anything else is not found without asking the database). */
function mayBeRoleName(name: string): boolean {
  return name.length <= 64 && isWellFormed(name) && !/[\x00-\x1f\x7f]/.test(name);
}

/**
 * The forms of a name that must not be a built-in role's: lower-cased as JavaScript does, and
 * without diacritics (PostgreSQL's lower() makes "ADMİN" "admin", JavaScript "admi̇n").
 */
function reservedForms(name: string): string[] {
  const lower = name.toLowerCase();
  return [lower, lower.normalize('NFKD').replace(/\p{M}/gu, '')];
}

/**
 * The built-in roles that hold every scope a resource declares (models/resources.ts): owner, admin
 * and member. A viewer reads contacts and tasks and holds none. An organization's own roles hold
 * those they list (permissionsSchema takes the names the registered resources declare).
 */
export const DECLARED_SCOPE_HOLDERS: ReadonlySet<RoleKind> = new Set<RoleKind>(['owner', 'admin', 'member']);

/**
 * Whether the membership row's role lets it hold every scope in `scopes` (SQL), for the
 * statements that decide in the database (code redemption, refresh, the device grant): orgauth's
 * own scopes within its permissions (membershipPermissionsSql), and any other name (a resource's
 * declared scope) only for DECLARED_SCOPE_HOLDERS. Which names a resource lists now is the
 * resource's business, applied when the token is issued.
 */
export function memberHoldsScopesSql(scopes: RawBuilder<string[]>, role: Expression<string>, customPermissions: Expression<string[] | null>): RawBuilder<boolean> {
  const holders = sql.raw([...DECLARED_SCOPE_HOLDERS].map((r) => `'${r}'`).join(','));
  // Declared names: a holder role holds them all; an organization's own role those it lists.
  return sql<boolean>`(${knownScopesOf(scopes)} <@ ${membershipPermissionsSql(role, customPermissions)} and (${role} in (${holders}) or ${scopes} <@ (${KNOWN_SCOPES_SQL} || coalesce(${customPermissions}, array[]::text[]))))`;
}

/** Whether `role` lets its member grant `scope`: orgauth's permissions as listed, a resource's declared scope by DECLARED_SCOPE_HOLDERS. */
export function roleHoldsScope(role: RoleRef, scope: string): boolean {
  return (isDeclaredScope(scope) && DECLARED_SCOPE_HOLDERS.has(role.kind)) || (role.permissions as readonly string[]).includes(scope);
}

/** What a member with `role` keeps when their grants are narrowed to it (grants.ts narrowGrants*): its permissions, and every declared scope when it holds them. */
export function narrowingAllowance(role: RoleRef): GrantAllowance {
  return { permissions: role.permissions, declared: DECLARED_SCOPE_HOLDERS.has(role.kind) };
}

export function builtinRole(kind: BuiltinRole): RoleRef {
  return { kind, id: null, name: kind, permissions: BUILTIN_ROLES[kind].permissions };
}

/**
 * The role an application acts with when it manages its organization through the API: exactly
 * the scopes its token holds, and never an owner. A private application with `members.write`
 * gives a member no role holding a permission its token lacks, so an application cannot be used
 * to widen the role of whoever configured it.
 */
export function applicationRole(scopes: Iterable<string>): RoleRef {
  return { kind: 'custom', id: null, name: 'application', permissions: canonical([...scopes]) };
}

/**
 * Stored permissions in canonical order: orgauth's own in PERMISSIONS order (anything no longer
 * known dropped), then the resource-declared scope names the role was given (checked against the
 * registered resources when it was written), in the order stored.
 */
function canonical(permissions: readonly string[]): Permission[] {
  const declared = [...new Set(permissions)].filter((p) => isDeclaredScope(p) && DECLARED_NAME.test(p));
  return [...PERMISSIONS.filter((p) => permissions.includes(p)), ...(declared as Permission[])];
}
/** What a declared scope name looks like (models/resources.ts checks it on registration). */
const DECLARED_NAME = /^[A-Za-z0-9][A-Za-z0-9._:/-]{0,99}$/;

/** A membership's (or invitation's) role from its row: `role`, and the custom role's name and permissions when role is 'custom'. */
export function roleOf(row: { role: RoleKind; role_id: number | null; role_name?: string | null; role_permissions?: string[] | null }): RoleRef {
  if (row.role !== 'custom') return builtinRole(row.role);
  return { kind: 'custom', id: row.role_id, name: row.role_name ?? '', permissions: canonical(row.role_permissions ?? []) };
}

/**
 * The permissions of a membership row in SQL, for statements that must decide in the database
 * (createGrant checks a code's scopes against the role at the moment of redemption): the
 * built-in roles' lists inline, a custom role's from `customPermissions`.
 */
export function membershipPermissionsSql(role: Expression<string>, customPermissions: Expression<string[] | null>): RawBuilder<string[]> {
  const cases = BUILTIN_ROLE_NAMES.map((name) => sql`when ${sql.lit(name)} then ${sql.raw(`array[${BUILTIN_ROLES[name].permissions.map((p) => `'${p}'`).join(',')}]::text[]`)}`);
  return sql<string[]>`(case ${role} ${sql.join(cases, sql` `)} else coalesce(${customPermissions}, array[]::text[]) end)`;
}

/**
 * Which scopes a member's role lets them hold now (orgauth's within its permissions, a resource's
 * declared ones for DECLARED_SCOPE_HOLDERS), as a test; undefined when they are no longer a member.
 */
export async function memberScopeTest(db: DB, organizationId: number, userId: number): Promise<((scope: string) => boolean) | undefined> {
  const member = await db
    .selectFrom('memberships as m')
    .select([membershipPermissionsSql(sql`m.role`, sql<string[] | null>`(select rr.permissions from roles rr where rr.id = m.role_id)`).as('permissions'), 'm.role'])
    .where('m.organization_id', '=', organizationId)
    .where('m.user_id', '=', userId)
    .executeTakeFirst();
  if (!member) return undefined;
  return (s) => (isDeclaredScope(s) && DECLARED_SCOPE_HOLDERS.has(member.role)) || member.permissions.includes(s);
}

/**
 * Whether someone acting with `actingAs` may give `role` to a member (or take it away): an owner
 * only by an owner; any other role only by someone who holds every permission in it. An admin
 * manages admins, members, viewers and any custom role; a custom role that may manage members
 * hands out at most what it holds.
 */
export function mayAssign(actingAs: RoleRef, role: RoleRef): boolean {
  if (role.kind === 'owner') return actingAs.kind === 'owner';
  return role.permissions.every((p) => roleHoldsScope(actingAs, p));
}

export function hasPermission(role: RoleRef | undefined, permission: Permission): boolean {
  return role !== undefined && role.permissions.includes(permission);
}

const IMPLIED_READ: Record<string, Permission> = {
  'applications.write': 'applications.read',
  'members.write': 'members.read',
  'grants.write': 'grants.read',
  'sso.write': 'sso.read',
  'webhooks.write': 'webhooks.read',
  'directory.write': 'directory.read',
  // A webhook event is an audit entry (its payload is the entry's details), so who sees
  // deliveries, or subscribes an endpoint to them, reads the audit log.
  'webhooks.read': 'audit.read',
};

/** `list` with everything its permissions imply, to the end of the chain (webhooks.write → webhooks.read → audit.read). */
function withImplied(list: readonly string[]): string[] {
  const all = new Set(list);
  for (let grew = true; grew; ) {
    grew = false;
    for (const p of all) {
      const implied = IMPLIED_READ[p];
      if (implied && !all.has(implied)) {
        all.add(implied);
        grew = true;
      }
    }
  }
  return [...all];
}

export const roleNameSchema = z
  .string()
  .trim()
  .min(1, 'must not be empty')
  .max(64, 'must be at most 64 characters')
  .regex(/^[\p{L}\p{N}][\p{L}\p{N} ._-]*$/u, 'letters, digits, spaces, dots, dashes and underscores, starting with a letter or digit')
  .refine((name) => reservedForms(name).every((form) => !isBuiltinRole(form) && form !== 'custom'), 'is the name of a built-in role');

export const roleDescriptionSchema = z
  .string()
  .trim()
  .max(500, 'must be at most 500 characters')
  .refine((d) => isWellFormed(d) && !/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/.test(d), 'must be text without control characters');

/**
 * A role's permissions as written: orgauth's, and the scope names the registered resources
 * declare now (`declared`, from declaredScopeNames).
 */
export function permissionsSchema(declared: ReadonlySet<string> = new Set()) {
  return (
    z
      .array(z.string().max(100))
      .max((PERMISSIONS.length + declared.size) * 2, 'too many permissions')
      .superRefine((list, ctx) => {
        const unknown = list.filter((p) => !isKnownScope(p) && !declared.has(p));
        if (unknown.length > 0) {
          const known = [...PERMISSIONS, ...declared].join(' ');
          ctx.addIssue({ code: 'custom', message: `unknown permission ${unknown.map((p) => JSON.stringify(p.slice(0, 40))).join(', ')}; known: ${known}` });
        }
      })
      // Managing a list means seeing it: a management write brings its read (the pages that manage show the list).
      .transform((list) => canonical(withImplied(list)))
  );
}


/** One field parsed, its problems reported under the field's name. */
function parseField<T extends z.ZodType>(schema: T, value: unknown, name: string): z.output<T> {
  return (parseInput(z.object({ [name]: schema }), { [name]: value }) as Record<string, z.output<T>>)[name]!;
}

function customRef(row: Pick<CustomRole, 'id' | 'name' | 'permissions'>): RoleRef {
  return { kind: 'custom', id: row.id, name: row.name, permissions: canonical(row.permissions) };
}

/**
 * The organization's role called `name`: a built-in one (by its exact lower-case name) or one of
 * its own (ignoring case). `forShare` share-locks a custom role's row, so it cannot change or go while
 * the caller's transaction gives it to someone.
 */
export async function findRole(db: DB, organizationId: number, name: string, options: { forShare?: boolean } = {}): Promise<RoleRef | undefined> {
  if (isBuiltinRole(name)) return builtinRole(name);
  if (!mayBeRoleName(name)) return undefined;
  const row = await db
    .selectFrom('roles')
    .select(['id', 'name', 'permissions'])
    .where('organization_id', '=', organizationId)
    .where(sql<string>`lower(name)`, '=', sql<string>`lower(${name})`)
    .where('deleting', '=', false)
    .$if(options.forShare === true, (qb) => qb.forShare())
    .executeTakeFirst();
  return row && customRef(row);
}

/**
 * `role` as it is now, share-locked for the caller's transaction: a custom role read before the
 * transaction may have been changed or deleted since (then an InvalidRequestError, as for a
 * name that never existed). Built-in roles are returned as they are.
 */
export async function lockRole(trx: DB, organizationId: number, role: RoleRef, field = 'role'): Promise<RoleRef> {
  if (role.kind !== 'custom') return role;
  const row = await trx
    .selectFrom('roles')
    .select(['id', 'name', 'permissions'])
    .where('organization_id', '=', organizationId)
    .where('id', '=', role.id ?? 0)
    .where('deleting', '=', false)
    .forShare()
    .executeTakeFirst();
  if (!row) throw new InvalidRequestError(`${field}: the role ${JSON.stringify(role.name)} no longer exists in this organization`, { details: [{ path: field, message: 'no such role in this organization' }] });
  return customRef(row);
}

/** findRole, or an InvalidRequestError naming the field (dashboard forms, API bodies). */
export async function requireRole(db: DB, organizationId: number, name: string, field = 'role'): Promise<RoleRef> {
  const role = await findRole(db, organizationId, name, { forShare: true });
  if (!role) throw new InvalidRequestError(`${field}: no role named ${JSON.stringify(name.slice(0, 64))} in this organization`, { details: [{ path: field, message: 'no such role in this organization' }] });
  return role;
}

export interface RoleView extends RoleRef {
  builtin: boolean;
  description: string;
  created_at: Date | null;
  updated_at: Date | null;
}

/** Every role of the organization: the built-in ones, then its own in name order. */
export async function listRoles(db: DB, organizationId: number): Promise<RoleView[]> {
  const custom = await db
    .selectFrom('roles')
    .selectAll()
    .where('organization_id', '=', organizationId)
    .where('deleting', '=', false)
    .orderBy(sql`lower(name)`)
    .orderBy('id')
    .limit(MAX_CUSTOM_ROLES)
    .execute();
  return [
    ...BUILTIN_ROLE_NAMES.map((kind) => ({ ...builtinRole(kind), builtin: true, description: BUILTIN_ROLES[kind].description, created_at: null, updated_at: null })),
    ...custom.map((row) => ({ ...customRef(row), builtin: false, description: row.description, created_at: row.created_at, updated_at: row.updated_at })),
  ];
}

export async function getRole(db: DB, organizationId: number, name: string): Promise<RoleView> {
  const role = (await listRolesNamed(db, organizationId, name))[0];
  if (!role) throw new NotFoundError('no such role in this organization');
  return role;
}

async function listRolesNamed(db: DB, organizationId: number, name: string): Promise<RoleView[]> {
  if (isBuiltinRole(name)) return [{ ...builtinRole(name), builtin: true, description: BUILTIN_ROLES[name].description, created_at: null, updated_at: null }];
  if (!mayBeRoleName(name)) return [];
  const row = await db
    .selectFrom('roles')
    .selectAll()
    .where('organization_id', '=', organizationId)
    .where(sql<string>`lower(name)`, '=', sql<string>`lower(${name})`)
    .where('deleting', '=', false)
    .executeTakeFirst();
  return row ? [{ ...customRef(row), builtin: false, description: row.description, created_at: row.created_at, updated_at: row.updated_at }] : [];
}

/** Who changes roles: the audit log's actor, the role they act with (an owner by default: the operator), and this instance's revoked set. */
export interface RoleChangeOptions {
  actor?: Actor | undefined;
  actingAs?: RoleRef | undefined;
  revocations?: RevokedGrantsMemory | undefined;
}

const OWNER = builtinRole('owner');

function refuseBeyond(actingAs: RoleRef, permissions: readonly Permission[], what: string): void {
  const beyond = permissions.filter((p) => !roleHoldsScope(actingAs, p));
  if (beyond.length > 0) throw new ForbiddenError(`${what}: your role does not hold ${beyond.join(' ')}, so you cannot give it`);
}

/** What a write of a role's name can run into: another role's name (409), or the table's check of built-in names (400). */
function nameRefused(err: unknown, name: string): unknown {
  if (isUniqueViolation(err)) return new ConflictError(`a role named ${JSON.stringify(name)} already exists in this organization`);
  if (isCheckViolation(err)) return new InvalidRequestError('name: is the name of a built-in role', { details: [{ path: 'name', message: 'is the name of a built-in role' }] });
  return err;
}

/** Creates a custom role holding at most what the creator holds. */
export async function createRole(
  db: DB,
  organizationId: number,
  input: { name: unknown; description?: unknown; permissions: unknown },
  options: RoleChangeOptions = {},
): Promise<RoleView> {
  const name = parseField(roleNameSchema, input.name, 'name');
  const description = parseField(roleDescriptionSchema, input.description ?? '', 'description');
  const permissions = parseField(permissionsSchema(await declaredScopeNames(db)), input.permissions, 'permissions');
  refuseBeyond(options.actingAs ?? OWNER, permissions, 'permissions');
  return inTransaction(db, async (trx) => {
    // Serializes role creation in the organization, so the cap holds under concurrency (NO KEY:
    // members joining, which key-share the row, go on meanwhile).
    const organization = await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().executeTakeFirst();
    if (!organization) throw new NotFoundError(`organization ${organizationId} not found`);
    // A role being deleted is not counted: deleting one makes room at once.
    const { count } = await trx
      .selectFrom('roles')
      .select((eb) => eb.fn.countAll<number>().as('count'))
      .where('organization_id', '=', organizationId)
      .where('deleting', '=', false)
      .executeTakeFirstOrThrow();
    if (Number(count) >= MAX_CUSTOM_ROLES) throw new ConflictError(`an organization has at most ${MAX_CUSTOM_ROLES} custom roles`);
    let row: CustomRole;
    try {
      row = await trx.insertInto('roles').values({ organization_id: organizationId, name, description, permissions, updated_at: new Date() }).returningAll().executeTakeFirstOrThrow();
    } catch (err) {
      throw nameRefused(err, name);
    }
    await recordAuditEvent(trx, { organizationId, action: 'role.created', actor: options.actor, details: { role_id: row.id, name, permissions: permissions.join(' ') } });
    return { ...customRef(row), builtin: false, description: row.description, created_at: row.created_at, updated_at: row.updated_at };
  });
}

/** The custom role called `name`, locked for the transaction; built-in roles cannot be changed. */
async function lockCustomRole(trx: DB, organizationId: number, name: string): Promise<CustomRole> {
  if (isBuiltinRole(name)) throw new ForbiddenError(`${name} is a built-in role: it cannot be changed or deleted`);
  if (!mayBeRoleName(name)) throw new NotFoundError('no such role in this organization');
  const row = await trx
    .selectFrom('roles')
    .selectAll()
    .where('organization_id', '=', organizationId)
    .where(sql<string>`lower(name)`, '=', sql<string>`lower(${name})`)
    .where('deleting', '=', false)
    .forUpdate()
    .executeTakeFirst();
  if (!row) throw new NotFoundError('no such role in this organization');
  return row;
}

/**
 * Renames a custom role, changes its description or its permissions. Someone may edit only a
 * role they could assign, and give it only what they hold. A permission taken away narrows
 * every live grant its members gave in the organization: the change commits first, so from then
 * on no refresh or code redemption gives a token the permission, and with it a job
 * (roleGrantsJob) that narrows the grants in batches, each published to every instance within a
 * second as it commits. The request does not wait for the job; an instance that dies midway
 * leaves it to another, which resumes where it stopped.
 */
export async function updateRole(
  db: DB,
  organizationId: number,
  name: string,
  input: { name?: unknown; description?: unknown; permissions?: unknown },
  options: RoleChangeOptions = {},
): Promise<RoleView> {
  const newName = input.name === undefined ? undefined : parseField(roleNameSchema, input.name, 'name');
  const description = input.description === undefined ? undefined : parseField(roleDescriptionSchema, input.description, 'description');
  const permissions = input.permissions === undefined ? undefined : parseField(permissionsSchema(await declaredScopeNames(db)), input.permissions, 'permissions');
  const actingAs = options.actingAs ?? OWNER;
  const view = await inTransaction(db, async (trx) => {
    const current = await lockCustomRole(trx, organizationId, name);
    refuseBeyond(actingAs, canonical(current.permissions), 'this role');
    if (permissions) refuseBeyond(actingAs, permissions, 'permissions');
    let row: CustomRole;
    try {
      row = await trx
        .updateTable('roles')
        .set({ name: newName ?? current.name, description: description ?? current.description, permissions: permissions ?? current.permissions, updated_at: sql`now()` })
        .where('id', '=', current.id)
        .returningAll()
        .executeTakeFirstOrThrow();
    } catch (err) {
      throw nameRefused(err, newName ?? name);
    }
    const removed = canonical(current.permissions).filter((p) => !row.permissions.includes(p));
    const added = canonical(row.permissions).filter((p) => !current.permissions.includes(p));
    await recordAuditEvent(trx, {
      organizationId,
      action: 'role.updated',
      actor: options.actor,
      details: {
        role_id: row.id,
        name: row.name,
        ...(row.name !== current.name ? { previous_name: current.name } : {}),
        ...(added.length > 0 ? { permissions_added: added.join(' ') } : {}),
        ...(removed.length > 0 ? { permissions_removed: removed.join(' ') } : {}),
      },
    });
    const view = { ...customRef(row), builtin: false, description: row.description, created_at: row.created_at, updated_at: row.updated_at };
    if (removed.length > 0) {
      const payload: RoleGrantsPayload = { role_id: row.id, actor: options.actor ?? {} };
      await enqueueJob(trx, { kind: ROLE_GRANTS_JOB, organizationId, payload: { ...payload } });
    }
    return view;
  });
  return view;
}

interface RoleGrantsPayload {
  role_id: number;
  actor: Actor;
}

export const ROLE_GRANTS_JOB = 'role.narrow_grants';

/**
 * The next `limit` members holding custom role `roleId` after `afterUserId`, by keyset on the
 * (organization_id, role_id, user_id) index (the entries of members already moved are dead until
 * a vacuum, and are not walked again); `lock`: their membership rows locked for the transaction.
 */
async function nextHolders(trx: DB, organizationId: number, roleId: number, afterUserId: number, limit: number, options: { lock?: boolean } = {}): Promise<number[]> {
  const rows = await trx
    .selectFrom('memberships')
    .select('user_id')
    .where('organization_id', '=', organizationId)
    .where('role_id', '=', roleId)
    .where('user_id', '>', afterUserId)
    .orderBy('user_id')
    .limit(limit)
    .$if(options.lock === true, (qb) => qb.forUpdate())
    .execute();
  return rows.map((r) => r.user_id);
}

/** Members whose grants one step of the role job narrows (all their grants, in the step's transaction). */
const NARROW_MEMBERS_PER_STEP = 100;

/**
 * The job that narrows the grants of every member holding a custom role to the role's
 * permissions: NARROW_MEMBERS_PER_STEP members a step, by keyset on the (organization_id,
 * role_id, user_id) index, each member's grants narrowed in the step's transaction
 * (narrowGrantsInTransaction) and published to every instance as it commits. Walking members
 * rather than grants keeps each step's plan the same however many grants the organization holds
 * and however many successors earlier steps made. The permissions are read in each step,
 * share-locked, so a role changed again meanwhile is followed; a role deleted ends the job
 * (deleting moved its members, and narrowed their grants, itself).
 */
export function roleGrantsJob(memory?: RevokedGrantsMemory): JobHandler<RoleGrantsPayload, { after_user_id: number }> {
  return {
    kind: ROLE_GRANTS_JOB,
    async step(trx, job, cursor) {
      const organizationId = job.organizationId!;
      const roleId = job.payload.role_id;
      const allowance = await rolePermissionsNow(trx, organizationId, roleId);
      if (!allowance) return { cursor, processed: 0, finished: true };
      const userIds = await nextHolders(trx, organizationId, roleId, cursor?.after_user_id ?? 0, NARROW_MEMBERS_PER_STEP);
      if (userIds.length === 0) return { cursor, processed: 0, finished: true };
      const ids = await narrowGrantsInTransaction(trx, { organizationId, userIds }, allowance, job.payload.actor);
      return {
        cursor: { after_user_id: userIds.at(-1)! },
        processed: ids.length,
        finished: false,
        afterCommit: () => memory?.noteRevoked(ids, 'role_changed'),
      };
    },
  };
}

/** The permissions of custom role `roleId` now, share-locked for the caller's transaction; undefined when it is gone. */
async function rolePermissionsNow(trx: DB, organizationId: number, roleId: number): Promise<GrantAllowance | undefined> {
  const row = await trx.selectFrom('roles').select('permissions').where('organization_id', '=', organizationId).where('id', '=', roleId).forShare().executeTakeFirst();
  return row && { permissions: canonical(row.permissions), declared: false };
}

/**
 * Narrows one member's grants to what their role allows now: for a refresh that found its token
 * holding more, because a role-wide narrowing has not reached it yet (or was interrupted).
 */
export async function narrowMemberGrants(db: DB, organizationId: number, userId: number, options: Pick<RoleChangeOptions, 'actor' | 'revocations'> = {}): Promise<number> {
  return narrowGrantsInBatches(
    db,
    { organizationId, userId },
    async (trx) => {
      const row = await trx
        .selectFrom('memberships')
        .leftJoin('roles', 'roles.id', 'memberships.role_id')
        .select(['memberships.role', 'memberships.role_id', 'roles.name as role_name', 'roles.permissions as role_permissions'])
        .where('memberships.organization_id', '=', organizationId)
        .where('memberships.user_id', '=', userId)
        .forShare('memberships')
        .executeTakeFirst();
      // Not a member: the removal ended their tokens, and its job revokes their grants.
      return row && narrowingAllowance(roleOf(row));
    },
    options.actor,
    options.revocations,
  );
}

/** Members moved per step of the deletion job (their grants narrowed with them). */
const MOVE_BATCH = 500;

interface RoleDeletionPayload {
  role_id: number;
  /** Where the members go: a built-in role's kind, or a custom role's id; null when nobody held it. */
  move_to: { kind: RoleKind; id: number | null; name: string } | null;
  actor: Actor;
}

export const ROLE_DELETION_JOB = 'role.delete';

/** A custom role as deleting it would find it: who it would move, and whether a role to move them to is needed. */
export interface RoleDeletion {
  role: RoleView;
  /** Members who hold it now. */
  members: number;
  /** Invitations still to be accepted that name it. */
  pendingInvitations: number;
  /** Whether deleteRole needs `moveTo`: members hold it, or invitations name it. */
  needsMoveTo: boolean;
}

/**
 * What deleteRole would refuse about the role itself (a built-in one, none of that name, one
 * holding what `actingAs` does not), checked without changing anything, with deleteRole's
 * messages, and what deleting it would move: for a page that asks first. deleteRole checks again.
 */
export async function checkRoleDeletion(db: DB, organizationId: number, name: string, options: Pick<RoleChangeOptions, 'actingAs'> = {}): Promise<RoleDeletion> {
  if (isBuiltinRole(name)) throw new ForbiddenError(`${name} is a built-in role: it cannot be changed or deleted`);
  const role = await getRole(db, organizationId, name);
  refuseBeyond(options.actingAs ?? OWNER, canonical(role.permissions), 'this role');
  const roleId = role.id ?? 0;
  const holders = await db
    .selectFrom('memberships')
    .select((eb) => eb.fn.countAll<number>().as('count'))
    .where('organization_id', '=', organizationId)
    .where('role_id', '=', roleId)
    .executeTakeFirstOrThrow();
  const invitations = await db
    .selectFrom('invitations')
    .select((eb) => [eb.fn.countAll<number>().as('count'), sql<number>`count(*) filter (where accepted_at is null and revoked_at is null)`.as('pending')])
    .where('organization_id', '=', organizationId)
    .where('role_id', '=', roleId)
    .executeTakeFirstOrThrow();
  const members = Number(holders.count);
  return { role, members, pendingInvitations: Number(invitations.pending), needsMoveTo: members > 0 || Number(invitations.count) > 0 };
}

/**
 * Deletes a custom role. Members who hold it (and invitations to it) move to `moveTo`, which the
 * deleter must be allowed to assign; a role in use without `moveTo` is a ConflictError saying
 * how many hold it. Moving narrows the moved members' grants.
 *
 * A role may be held by a million members, so the request only decides, in one transaction:
 * the role is marked `deleting` (gone from every list and lookup: nobody is given it any more)
 * and its permissions become what both it and the role its members go to allow, so at once no
 * refresh or code redemption gives more, and every instance refuses tokens holding more (the
 * tokens name the role: role-scopes.ts); the deletion is audited (role.deleted, with how many
 * members move) and a job queued (roleDeletionJob) that moves the members MOVE_BATCH a step,
 * narrowing their grants, then the invitations, and deletes the row. An instance that dies
 * midway leaves the job to another. Returns how many members are moving.
 */
export async function deleteRole(db: DB, organizationId: number, name: string, input: { moveTo?: string | undefined }, options: RoleChangeOptions = {}): Promise<{ moved: number }> {
  const actingAs = options.actingAs ?? OWNER;
  return inTransaction(db, async (trx) => {
    // Deletions in an organization queue here (NO KEY: members joining, which key-share the row,
    // go on): two roles deleted at once, each moving its members to the other, cannot deadlock;
    // the second finds the first gone.
    await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().execute();
    // Locked (FOR UPDATE): a member being given it meanwhile (share lock) is waited for, and then counted.
    const current = await lockCustomRole(trx, organizationId, name);
    refuseBeyond(actingAs, canonical(current.permissions), 'this role');
    const target = input.moveTo === undefined ? undefined : await requireRole(trx, organizationId, input.moveTo, 'move_to');
    if (target && target.kind === 'custom' && target.id === current.id) throw new InvalidRequestError('move_to: choose another role than the one being deleted', { details: [{ path: 'move_to', message: 'must be another role' }] });
    if (target && !mayAssign(actingAs, target)) throw new ForbiddenError(`move_to: your role may not give ${target.name}`);
    const to = target && (await lockRole(trx, organizationId, target, 'move_to'));
    const holders = await trx
      .selectFrom('memberships')
      .select((eb) => eb.fn.countAll<number>().as('count'))
      .where('organization_id', '=', organizationId)
      .where('role_id', '=', current.id)
      .executeTakeFirstOrThrow();
    const members = Number(holders.count);
    if (!to) {
      const invited = await trx.selectFrom('invitations').select('id').where('organization_id', '=', organizationId).where('role_id', '=', current.id).limit(1).executeTakeFirst();
      if (members > 0 || invited) {
        throw new ConflictError(
          `${members > 0 ? `${members} member(s) hold` : 'invitations name'} the role ${current.name}; choose a role to move ${members > 0 ? 'them' : 'the invitations'} to (move_to)`,
        );
      }
    }
    // What its members keep until they are moved: what both roles allow.
    const permissions = to ? canonical(current.permissions).filter((p) => roleHoldsScope(to, p)) : canonical(current.permissions);
    await trx.updateTable('roles').set({ deleting: true, permissions, updated_at: sql`now()` }).where('id', '=', current.id).execute();
    await recordAuditEvent(trx, {
      organizationId,
      action: 'role.deleted',
      actor: options.actor,
      details: { role_id: current.id, name: current.name, ...(to ? { members_moved_to: to.name, members_moved: members } : {}) },
    });
    const payload: RoleDeletionPayload = { role_id: current.id, move_to: to ? { kind: to.kind, id: to.id, name: to.name } : null, actor: options.actor ?? {} };
    await enqueueJob(trx, { kind: ROLE_DELETION_JOB, organizationId, payload: { ...payload } });
    return { moved: members };
  });
}

/**
 * The job that finishes a role's deletion (deleteRole): MOVE_BATCH members a step, by keyset on
 * the (organization_id, role_id, user_id) index, each moved to the role chosen with their grants
 * narrowed to it (in the step's transaction, published as it commits); then the invitations
 * naming it, and the row. The role they go to is read (share-locked) in each step: a custom role
 * deleted meanwhile fails the step, and the job is retried, then given up and logged.
 */
export function roleDeletionJob(memory?: RevokedGrantsMemory): JobHandler<RoleDeletionPayload, { after_user_id: number }> {
  return {
    kind: ROLE_DELETION_JOB,
    async step(trx, job, cursor) {
      const organizationId = job.organizationId!;
      const { role_id: roleId, move_to: moveTo, actor } = job.payload;
      const going = await trx.selectFrom('roles').select('id').where('id', '=', roleId).where('deleting', '=', true).forNoKeyUpdate().executeTakeFirst();
      if (!going) return { cursor, processed: 0, finished: true };
      const userIds = await nextHolders(trx, organizationId, roleId, cursor?.after_user_id ?? 0, MOVE_BATCH, { lock: true });
      // A custom role as it is now (share-locked); a built-in one as it always is.
      const to = !moveTo ? undefined : moveTo.kind === 'custom' ? await lockRole(trx, organizationId, { kind: 'custom', id: moveTo.id, name: moveTo.name, permissions: [] }, 'move_to') : builtinRole(moveTo.kind);
      if (userIds.length > 0) {
        if (!to) throw new Error(`role ${roleId} is held by members but has nowhere to move them`);
        const revoked = await narrowGrantsInTransaction(trx, { organizationId, userIds }, narrowingAllowance(to), actor);
        await trx
          .updateTable('memberships')
          .set({ role: to.kind, role_id: to.id })
          .where('organization_id', '=', organizationId)
          .where('user_id', '=', sql<number>`any(${userIds}::bigint[])`)
          .where('role_id', '=', roleId)
          .execute();
        return { cursor: { after_user_id: userIds.at(-1)! }, processed: userIds.length, finished: false, afterCommit: () => memory?.noteRevoked(revoked, 'role_changed') };
      }
      if (to) await trx.updateTable('invitations').set({ role: to.kind, role_id: to.id }).where('organization_id', '=', organizationId).where('role_id', '=', roleId).execute();
      await trx.deleteFrom('roles').where('id', '=', roleId).execute();
      return { cursor, processed: 0, finished: true };
    },
  };
}
