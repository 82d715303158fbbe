/**
 * What a directory's SCIM requests do to orgauth's people (issue 43; docs/directory.md).
 *
 * - A SCIM User is an orgauth account of an address in one of the organization's **verified**
 *   domains: created (no password; the organization vouches for the address) or claimed when it
 *   exists (the organization owns the domain; an account whose address nobody ever proved is
 *   reclaimed first, as SSO does). Any other address is `400 invalidValue`, so a directory can
 *   never take another organization's person.
 * - An active user is a member. The directory gives the role of the highest mapped group the
 *   user is in, else its default role to the members it added; a member who was there before
 *   keeps the role people gave them until a mapped group says otherwise, and an owner is never
 *   changed (owners are made and unmade by people).
 * - Deactivation (`active: false`) suspends the membership and DELETE removes it, both through
 *   removeMember: the person's access tokens in the organization are refused at once on every
 *   instance, their grants there are revoked by a job, and their sessions end. Their account stays
 *   for their other organizations. Reactivation makes them a member again; their old grants stay
 *   ended.
 * - Every change is one transaction with its audit entry (which is also its webhook event:
 *   directory.user.* and directory.group.*); the revoked-set notes a change makes reach this
 *   instance once it has committed.
 */
import { sql, type Transaction } from 'kysely';
import { recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { Database, DirectoryRole, RevocationReason } from '../db/schema.js';
import { addMember, changeMemberRole, type RemovedMembersMemory, removeMember } from '../accounts/organizations.js';
import { findUserByEmail, insertUser } from '../accounts/users.js';
import { enqueueJob, type JobHandler } from '../jobs/queue.js';
import type { RevokedGrantsMemory } from '../oauth/models/grants.js';
import { hasVerifiedDomain, emailDomain } from '../sso/domains.js';
import { canonicalEmail, reclaimUnverifiedAccount } from '../sso/identities.js';
import { DIRECTORY_ROLES, type DirectoryView } from './directories.js';
import { ScimError, badScim } from './scim-errors.js';
import { clientAttributes, etagMatches, groupRepresentation, type GroupRow, type Reference, refuseDeepNesting, userRepresentation, type UserRow } from './representation.js';
import { applyGroupPatch, applyUserPatch, MAX_MEMBER_IDS, type MemberChange, type PatchOperation } from './patch.js';

type Trx = Transaction<Database>;

/** What the service knows of the request's directory. */
export interface DirectoryScope {
  db: DB;
  directory: DirectoryView;
  /** `<issuer>/scim/v2/<id>`: the base of every `location` and `$ref`. */
  baseUrl: string;
  revocations?: (RevokedGrantsMemory & RemovedMembersMemory) | undefined;
}

/** A stored representation's largest size, as JSON. */
const MAX_RESOURCE_CHARS = 64 * 1024;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Revoked-set notes made inside a transaction, told to this instance's memory only once it has
 * committed (a rolled-back removal must not refuse anyone's tokens).
 */
class AfterCommit implements RevokedGrantsMemory, RemovedMembersMemory {
  private readonly notes: ((memory: RevokedGrantsMemory & RemovedMembersMemory) => void)[] = [];
  noteRevoked(grantIds: readonly number[], reason: RevocationReason): void {
    this.notes.push((m) => m.noteRevoked(grantIds, reason));
  }
  noteMemberRemoved(organizationId: number, userId: number, removedAtS: number): void {
    this.notes.push((m) => m.noteMemberRemoved(organizationId, userId, removedAtS));
  }
  tell(memory: (RevokedGrantsMemory & RemovedMembersMemory) | undefined): void {
    if (memory) for (const note of this.notes) note(memory);
  }
}

/** Runs `fn` in a transaction and tells the instance's revoked set what it did once committed; a unique violation is 409 uniqueness. */
async function change<T>(scope: DirectoryScope, fn: (trx: Trx, notes: AfterCommit) => Promise<T>): Promise<T> {
  const notes = new AfterCommit();
  try {
    const result = await inTransaction(scope.db, (trx) => fn(trx, notes));
    notes.tell(scope.revocations);
    return result;
  } catch (err) {
    if (isUniqueViolation(err)) throw new ScimError(409, 'uniqueness', uniquenessDetail(err));
    throw err;
  }
}

function uniquenessDetail(err: unknown): string {
  const constraint = (err as { constraint?: string }).constraint ?? '';
  if (constraint.includes('display_name')) return 'a group with this displayName already exists in this directory';
  if (constraint.startsWith('users_')) return 'an account with this address is being provisioned by another request';
  if (constraint === 'directory_users_user_key') return 'this account is already provisioned in this directory as another user';
  return 'a user with this userName already exists in this directory';
}

// ---------------------------------------------------------------------------------------------
// Reading a User from a request body

interface UserFields {
  userName: string;
  externalId: string | null;
  displayName: string | null;
  active: boolean;
  /** The address the account has: from emails (primary, then work, then the first), else userName. */
  email: string;
  /** Everything else, as stored. */
  resource: Record<string, unknown>;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** `true`/`false`, or Entra ID's strings "True"/"False" (any case). */
export function parseActive(value: unknown): boolean {
  if (value === undefined || value === null) return true;
  if (typeof value === 'boolean') return value;
  if (typeof value === 'string' && /^(true|false)$/i.test(value.trim())) return value.trim().toLowerCase() === 'true';
  throw badScim('invalidValue', 'active must be true or false');
}

function optionalString(body: Record<string, unknown>, key: string, max: number): string | null {
  const value = body[key];
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string' || value.length > max) throw badScim('invalidValue', `${key} must be a string of at most ${max} characters`);
  return value;
}

/** Takes a body's attribute, whatever its letter case (RFC 7643 §2.1: attribute names are case-insensitive). */
function take(body: Record<string, unknown>, name: string): unknown {
  const key = Object.keys(body).find((k) => k.toLowerCase() === name.toLowerCase());
  if (key === undefined) return undefined;
  const value = body[key];
  delete body[key];
  return value;
}

function chosenEmail(emails: unknown, userName: string): string {
  if (emails !== undefined && emails !== null) {
    if (!Array.isArray(emails) || emails.length > 20 || !emails.every((e) => isObject(e) && typeof e.value === 'string')) {
      throw badScim('invalidValue', 'emails must be a list of at most 20 objects with a string value');
    }
    const list = emails as { value: string; type?: unknown; primary?: unknown }[];
    const primary = list.find((e) => e.primary === true || e.primary === 'true' || e.primary === 'True') ?? list.find((e) => typeof e.type === 'string' && e.type.toLowerCase() === 'work') ?? list[0];
    if (primary) return primary.value;
  }
  return userName;
}

/** RFC 7643 §2.5: a null is an unassigned attribute, so it is left out (as a PATCH's null removes), not kept and sent back. */
function withoutNulls(value: Record<string, unknown>): Record<string, unknown> {
  const assigned = (v: unknown): unknown => (isObject(v) ? withoutNulls(v) : Array.isArray(v) ? v.map(assigned) : v);
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== null).map(([k, v]) => [k, assigned(v)]));
}

export function userFields(body: unknown): UserFields {
  if (!isObject(body)) throw badScim('invalidSyntax', 'the body must be a JSON object');
  refuseDeepNesting(body, 'the resource');
  const attributes = withoutNulls(clientAttributes(body));
  const userName = take(attributes, 'userName');
  if (typeof userName !== 'string' || userName.trim() === '' || userName.length > 254) throw badScim('invalidValue', 'userName is required: a string of 1 to 254 characters');
  const rest: Record<string, unknown> = { ...attributes };
  const externalId = optionalString({ externalId: take(rest, 'externalId') }, 'externalId', 256);
  const displayName = optionalString({ displayName: take(rest, 'displayName') }, 'displayName', 256);
  const active = parseActive(take(rest, 'active'));
  // A password a client syncs (Okta can) is never kept: people sign in through the organization's IdP.
  take(rest, 'password');
  const email = chosenEmail(rest[Object.keys(rest).find((k) => k.toLowerCase() === 'emails') ?? 'emails'], userName.trim());
  if (JSON.stringify(rest).length > MAX_RESOURCE_CHARS) throw badScim('invalidValue', `the resource is larger than ${MAX_RESOURCE_CHARS} characters`);
  return { userName: userName.trim(), externalId, displayName, active, email, resource: rest };
}

/** The address canonical and in one of the organization's verified domains, or 400 invalidValue. */
async function verifiedAddress(trx: DB, organizationId: number, address: string): Promise<string> {
  const email = canonicalEmail(address);
  const domain = email === undefined ? undefined : emailDomain(email);
  if (email === undefined || domain === undefined) throw badScim('invalidValue', 'the user has no usable email address (emails, or a userName that is an address)');
  if (!(await hasVerifiedDomain(trx, organizationId, domain))) throw badScim('invalidValue', `${domain} is not a verified domain of this organization: a directory provisions addresses of its organization's verified domains only`);
  return email;
}

// ---------------------------------------------------------------------------------------------
// Rows

const USER_COLUMNS = ['id', 'user_id', 'user_name', 'external_id', 'display_name', 'active', 'resource', 'role', 'version', 'created_at', 'updated_at'] as const;
type DirectoryUser = UserRow & { user_id: number; role: DirectoryRole | null };

async function lockUser(trx: Trx, directoryId: number, id: string): Promise<DirectoryUser> {
  if (!UUID.test(id)) throw userNotFound(id);
  const row = await trx.selectFrom('directory_users').select(USER_COLUMNS).where('directory_id', '=', directoryId).where('id', '=', id).forUpdate().executeTakeFirst();
  if (!row) throw userNotFound(id);
  return row;
}

const userNotFound = (id: string) => new ScimError(404, undefined, `no User ${id.slice(0, 64)} in this directory`);
const groupNotFound = (id: string) => new ScimError(404, undefined, `no Group ${id.slice(0, 64)} in this directory`);

/** 412 unless `ifMatch` (when given) names the current version (RFC 7644 §3.14). */
function checkVersion(ifMatch: string | undefined, version: number | string): void {
  if (ifMatch !== undefined && !etagMatches(ifMatch, version)) throw new ScimError(412, undefined, 'the resource has changed since the version If-Match names');
}

/** The groups a page of users is in, for their `groups` attribute. */
export async function groupsOfUsers(db: DB, ids: readonly string[]): Promise<Map<string, Reference[]>> {
  const byUser = new Map<string, Reference[]>(ids.map((id) => [id, []]));
  if (ids.length === 0) return byUser;
  const rows = await db
    .selectFrom('directory_group_members')
    .innerJoin('directory_groups', 'directory_groups.id', 'directory_group_members.group_id')
    .select(['directory_group_members.user_id', 'directory_groups.id', 'directory_groups.display_name'])
    .where('directory_group_members.user_id', 'in', ids)
    .orderBy('directory_groups.seq')
    .execute();
  for (const row of rows) byUser.get(row.user_id)?.push({ value: row.id, display: row.display_name });
  return byUser;
}

/** The members of a page of groups, for their `members` attribute. */
export async function membersOfGroups(db: DB, ids: readonly string[]): Promise<Map<string, Reference[]>> {
  const byGroup = new Map<string, Reference[]>(ids.map((id) => [id, []]));
  if (ids.length === 0) return byGroup;
  const rows = await db
    .selectFrom('directory_group_members')
    .innerJoin('directory_users', 'directory_users.id', 'directory_group_members.user_id')
    .select(['directory_group_members.group_id', 'directory_users.id', 'directory_users.display_name', 'directory_users.user_name'])
    .where('directory_group_members.group_id', 'in', ids)
    .orderBy('directory_users.seq')
    .execute();
  for (const row of rows) byGroup.get(row.group_id)?.push({ value: row.id, display: row.display_name ?? row.user_name });
  return byGroup;
}

export async function getUser(scope: DirectoryScope, id: string): Promise<{ resource: Record<string, unknown>; version: number | string }> {
  if (!UUID.test(id)) throw userNotFound(id);
  const row = await scope.db.selectFrom('directory_users').select(USER_COLUMNS).where('directory_id', '=', scope.directory.id).where('id', '=', id).executeTakeFirst();
  if (!row) throw userNotFound(id);
  const groups = await groupsOfUsers(scope.db, [id]);
  return { resource: userRepresentation(scope.baseUrl, row, groups.get(id)), version: row.version };
}

export async function getGroup(scope: DirectoryScope, id: string, withMembers: boolean): Promise<{ resource: Record<string, unknown>; version: number | string }> {
  if (!UUID.test(id)) throw groupNotFound(id);
  const row = await scope.db.selectFrom('directory_groups').select(GROUP_COLUMNS).where('directory_id', '=', scope.directory.id).where('id', '=', id).executeTakeFirst();
  if (!row) throw groupNotFound(id);
  const members = withMembers ? (await membersOfGroups(scope.db, [id])).get(id) : undefined;
  return { resource: groupRepresentation(scope.baseUrl, row, members), version: row.version };
}

// ---------------------------------------------------------------------------------------------
// Membership and role

/** The highest role a mapped group gives the directory user, or undefined when none of their groups is mapped. */
async function mappedRole(trx: DB, directoryId: number, directoryUserId: string): Promise<DirectoryRole | undefined> {
  const rows = await trx
    .selectFrom('directory_group_members as m')
    .innerJoin('directory_groups as g', 'g.id', 'm.group_id')
    .innerJoin('directory_group_roles as r', (join) =>
      join.onRef('r.directory_id', '=', 'g.directory_id').on((eb) => eb.or([eb(sql`lower(r.group_ref)`, '=', sql`lower(g.display_name)`), eb(sql`lower(r.group_ref)`, '=', sql`g.id::text`)])),
    )
    .select('r.role')
    .where('m.user_id', '=', directoryUserId)
    .where('g.directory_id', '=', directoryId)
    .execute();
  let best: DirectoryRole | undefined;
  for (const { role } of rows) if (best === undefined || DIRECTORY_ROLES.indexOf(role) > DIRECTORY_ROLES.indexOf(best)) best = role;
  return best;
}

async function membershipOf(trx: DB, organizationId: number, userId: number) {
  return trx.selectFrom('memberships').select(['role', 'role_id']).where('organization_id', '=', organizationId).where('user_id', '=', userId).executeTakeFirst();
}

interface DirectoryRef {
  id: number;
  organization_id: number;
  default_role: DirectoryRole;
}

/**
 * Makes an active directory user's membership what the directory says: a member (added with its
 * role when they are not one), with the mapped role or, when the directory added them, its
 * default. Owners, and members the directory did not add while no mapped group names them, keep
 * the role people gave them.
 */
async function syncMembership(trx: Trx, directory: DirectoryRef, user: Pick<DirectoryUser, 'id' | 'user_id' | 'active' | 'role'>, notes: AfterCommit, options: { add: boolean }): Promise<void> {
  if (!user.active) return;
  const membership = await membershipOf(trx, directory.organization_id, user.user_id);
  const mapped = await mappedRole(trx, directory.id, user.id);
  if (!membership) {
    if (!options.add) return;
    const role = mapped ?? directory.default_role;
    await addMember(trx, { organizationId: directory.organization_id, userId: user.user_id, role }, { actingAs: 'owner' });
    await trx.updateTable('directory_users').set({ role }).where('id', '=', user.id).execute();
    return;
  }
  if (membership.role === 'owner') return;
  const target = mapped ?? (user.role !== null ? directory.default_role : undefined);
  if (target === undefined || (membership.role === target && membership.role_id === null)) {
    if (target !== undefined && user.role !== target) await trx.updateTable('directory_users').set({ role: target }).where('id', '=', user.id).execute();
    return;
  }
  await changeMemberRole(trx, { organizationId: directory.organization_id, userId: user.user_id, role: target }, { actingAs: 'owner', revocations: notes });
  await trx.updateTable('directory_users').set({ role: target }).where('id', '=', user.id).execute();
}

/**
 * Ends the person's access here: their membership (not an owner's: owners are unmade by people;
 * the audit entry says so), their tokens and grants in the organization (removeMember), and their
 * sessions, which could otherwise still reach the organization until they expire.
 */
async function endAccess(trx: Trx, directory: DirectoryRef, userId: number, notes: AfterCommit): Promise<'removed' | 'kept_owner' | 'not_a_member'> {
  await trx.deleteFrom('sessions').where('user_id', '=', userId).execute();
  const membership = await membershipOf(trx, directory.organization_id, userId);
  if (!membership) return 'not_a_member';
  if (membership.role === 'owner') return 'kept_owner';
  await removeMember(trx, { organizationId: directory.organization_id, userId }, { actingAs: 'owner', revocations: notes });
  return 'removed';
}

// ---------------------------------------------------------------------------------------------
// Users

function auditUser(trx: DB, scope: DirectoryScope, action: string, user: Pick<DirectoryUser, 'id' | 'user_id' | 'user_name'>, details: Record<string, unknown> = {}): Promise<void> {
  return recordAuditEvent(trx, {
    organizationId: scope.directory.organization_id,
    action,
    details: { directory_id: scope.directory.id, scim_id: user.id, user_id: user.user_id, user_name: user.user_name, ...details },
  });
}

/** POST /Users: the account created or claimed, linked, and (when active) a member. */
export async function createUser(scope: DirectoryScope, body: unknown): Promise<{ resource: Record<string, unknown>; version: number | string }> {
  const fields = userFields(body);
  const organizationId = scope.directory.organization_id;
  const row = await change(scope, async (trx, notes) => {
    const email = await verifiedAddress(trx, organizationId, fields.email);
    const taken = await trx.selectFrom('directory_users').select('id').where('directory_id', '=', scope.directory.id).where(sql`lower(user_name)`, '=', fields.userName.toLowerCase()).executeTakeFirst();
    if (taken) throw new ScimError(409, 'uniqueness', 'a user with this userName already exists in this directory');
    const found = await findUserByEmail(trx, email);
    // The account must have exactly this address: lower() folds some non-ASCII letters the domain check does not.
    if (found && found.email.toLowerCase() !== email) throw badScim('invalidValue', 'the address does not match its account exactly');
    let userId: number;
    let claimed = false;
    if (found) {
      userId = found.id;
      claimed = true;
      if (found.email_verified_at === null) await reclaimUnverifiedAccount(trx, userId, organizationId, { directory_id: scope.directory.id });
    } else {
      userId = (await insertUser(trx, { email, name: accountName(fields), passwordHash: null, emailVerified: true })).id;
    }
    const inserted = await trx
      .insertInto('directory_users')
      .values({
        directory_id: scope.directory.id,
        user_id: userId,
        user_name: fields.userName,
        external_id: fields.externalId,
        display_name: fields.displayName,
        active: fields.active,
        resource: JSON.stringify(fields.resource),
        role: null,
        updated_at: sql<Date>`now()`,
      })
      .returning(USER_COLUMNS)
      .executeTakeFirstOrThrow();
    if (fields.active) await syncMembership(trx, scope.directory, inserted, notes, { add: true });
    else await endAccess(trx, scope.directory, userId, notes);
    await auditUser(trx, scope, 'directory.user.created', inserted, { active: fields.active, claimed_existing_account: claimed });
    return inserted;
  });
  return { resource: userRepresentation(scope.baseUrl, row, []), version: row.version };
}

function accountName(fields: UserFields): string {
  const name = isObject(fields.resource.name) ? fields.resource.name : {};
  const formatted = typeof name.formatted === 'string' ? name.formatted : [name.givenName, name.familyName].filter((p) => typeof p === 'string').join(' ');
  return (fields.displayName ?? formatted).trim().slice(0, 200);
}

/** The representation a PATCH starts from: what the client could read, without what the server owns. */
function patchable(row: DirectoryUser): Record<string, unknown> {
  return {
    ...row.resource,
    userName: row.user_name,
    ...(row.external_id !== null ? { externalId: row.external_id } : {}),
    ...(row.display_name !== null ? { displayName: row.display_name } : {}),
    active: row.active,
  };
}

/** PUT (`body` replaces the resource) or PATCH (`ops` change it): the same rules, one transaction. */
export async function updateUser(scope: DirectoryScope, id: string, input: { body: unknown } | { ops: PatchOperation[] }, ifMatch: string | undefined): Promise<{ resource: Record<string, unknown>; version: number | string }> {
  const organizationId = scope.directory.organization_id;
  const row = await change(scope, async (trx, notes) => {
    const current = await lockUser(trx, scope.directory.id, id);
    checkVersion(ifMatch, current.version);
    const body = 'body' in input ? input.body : applyUserPatch(patchable(current), input.ops, { id: current.id });
    if (isObject(body) && typeof body.id === 'string' && body.id !== id && 'body' in input) throw badScim('mutability', 'id cannot be changed');
    const fields = userFields(body);
    const account = await trx.selectFrom('users').select(['id', 'email']).where('id', '=', current.user_id).executeTakeFirstOrThrow();
    const email = await verifiedAddress(trx, organizationId, fields.email);
    if (email !== account.email.toLowerCase()) {
      // The address moves with the directory: still a verified domain's, and nobody else's.
      await trx.updateTable('users').set({ email, updated_at: new Date() }).where('id', '=', current.user_id).execute();
    }
    const updated = await trx
      .updateTable('directory_users')
      .set({
        user_name: fields.userName,
        external_id: fields.externalId,
        display_name: fields.displayName,
        active: fields.active,
        resource: JSON.stringify(fields.resource),
        version: sql<number>`version + 1`,
        updated_at: sql<Date>`now()`,
      })
      .where('id', '=', id)
      .returning(USER_COLUMNS)
      .executeTakeFirstOrThrow();
    if (current.active && !fields.active) {
      const membership = await endAccess(trx, scope.directory, current.user_id, notes);
      await auditUser(trx, scope, 'directory.user.deactivated', updated, { membership });
    } else if (!current.active && fields.active) {
      await syncMembership(trx, scope.directory, updated, notes, { add: true });
      await auditUser(trx, scope, 'directory.user.reactivated', updated);
    } else {
      await auditUser(trx, scope, 'directory.user.updated', updated, { ...(email !== account.email.toLowerCase() ? { email_changed: true } : {}) });
    }
    return updated;
  });
  const groups = await groupsOfUsers(scope.db, [id]);
  return { resource: userRepresentation(scope.baseUrl, row, groups.get(id)), version: row.version };
}

/** DELETE /Users/:id: the membership removed, the link forgotten; the account stays. */
export async function deleteUser(scope: DirectoryScope, id: string, ifMatch: string | undefined): Promise<void> {
  await change(scope, async (trx, notes) => {
    const current = await lockUser(trx, scope.directory.id, id);
    checkVersion(ifMatch, current.version);
    const membership = current.active ? await endAccess(trx, scope.directory, current.user_id, notes) : 'not_a_member';
    await trx.deleteFrom('directory_users').where('id', '=', id).execute();
    await auditUser(trx, scope, 'directory.user.deleted', current, { membership });
  });
}

// ---------------------------------------------------------------------------------------------
// Groups

const GROUP_COLUMNS = ['id', 'display_name', 'external_id', 'version', 'created_at', 'updated_at'] as const;

interface GroupFields {
  displayName: string;
  externalId: string | null;
  members: string[] | undefined;
}

function memberIds(value: unknown): string[] {
  if (!Array.isArray(value) || !value.every((m) => isObject(m) && typeof m.value === 'string')) throw badScim('invalidValue', 'members must be a list of objects with a string value');
  if (value.length > MAX_MEMBER_IDS) throw badScim('invalidValue', `at most ${MAX_MEMBER_IDS} members a request`);
  return [...new Set(value.map((m) => (m as { value: string }).value))];
}

export function groupFields(body: unknown): GroupFields {
  if (!isObject(body)) throw badScim('invalidSyntax', 'the body must be a JSON object');
  refuseDeepNesting(body, 'the resource');
  const attributes = clientAttributes(body);
  const displayName = take(attributes, 'displayName');
  if (typeof displayName !== 'string' || displayName.trim() === '' || displayName.length > 256) throw badScim('invalidValue', 'displayName is required: a string of 1 to 256 characters');
  const externalId = optionalString({ externalId: take(attributes, 'externalId') }, 'externalId', 256);
  const members = take(attributes, 'members');
  return { displayName: displayName.trim(), externalId, members: members === undefined || members === null ? undefined : memberIds(members) };
}

/** The ids that are this directory's users; anything else is 400 invalidValue (RFC 7644 §3.5.2: a bad reference). */
async function ownUsers(trx: DB, directoryId: number, ids: readonly string[]): Promise<string[]> {
  if (ids.length === 0) return [];
  const bad = ids.find((id) => !UUID.test(id));
  if (bad !== undefined) throw badScim('invalidValue', `member ${bad.slice(0, 64)} is not a User of this directory`);
  const found = new Set<string>();
  for (let i = 0; i < ids.length; i += 1000) {
    const rows = await trx.selectFrom('directory_users').select('id').where('directory_id', '=', directoryId).where('id', 'in', ids.slice(i, i + 1000)).execute();
    for (const row of rows) found.add(row.id);
  }
  const missing = ids.find((id) => !found.has(id.toLowerCase()) && !found.has(id));
  if (missing !== undefined) throw badScim('invalidValue', `member ${missing} is not a User of this directory`);
  return ids.map((id) => id.toLowerCase());
}

/** Whether a mapping names the group (by displayName or id): then changing its members or name changes roles. */
function isMapped(directory: DirectoryView, group: { id: string; display_name: string }): boolean {
  return directory.group_roles.some((m) => m.group.toLowerCase() === group.display_name.toLowerCase() || m.group.toLowerCase() === group.id);
}

/** Syncs the roles of the given directory users (a bounded list: one request's members). */
async function syncUsers(trx: Trx, scope: DirectoryScope, directoryUserIds: readonly string[], notes: AfterCommit): Promise<void> {
  for (let i = 0; i < directoryUserIds.length; i += 1000) {
    const rows = await trx.selectFrom('directory_users').select(['id', 'user_id', 'active', 'role']).where('directory_id', '=', scope.directory.id).where('id', 'in', directoryUserIds.slice(i, i + 1000)).orderBy('seq').execute();
    for (const row of rows) await syncMembership(trx, scope.directory, row, notes, { add: false });
  }
}

/** Every member's role of the directory, again: queued when a change could move any number of them. */
export async function queueRoleSync(trx: DB, directory: { id: number; organization_id: number }, reason: string): Promise<void> {
  await enqueueJob(trx, { kind: DIRECTORY_ROLES_JOB, organizationId: directory.organization_id, payload: { directory_id: directory.id, reason } });
}

async function insertMembers(trx: DB, groupId: string, ids: readonly string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += 1000) {
    await trx.insertInto('directory_group_members').values(ids.slice(i, i + 1000).map((userId) => ({ group_id: groupId, user_id: userId }))).onConflict((oc) => oc.doNothing()).execute();
  }
}

export async function createGroup(scope: DirectoryScope, body: unknown): Promise<{ resource: Record<string, unknown>; version: number | string }> {
  const fields = groupFields(body);
  const row = await change(scope, async (trx, notes) => {
    const members = await ownUsers(trx, scope.directory.id, fields.members ?? []);
    const inserted = await trx
      .insertInto('directory_groups')
      .values({ directory_id: scope.directory.id, display_name: fields.displayName, external_id: fields.externalId, updated_at: sql<Date>`now()` })
      .returning(GROUP_COLUMNS)
      .executeTakeFirstOrThrow();
    await insertMembers(trx, inserted.id, members);
    if (isMapped(scope.directory, inserted)) await syncUsers(trx, scope, members, notes);
    await auditGroup(trx, scope, 'directory.group.created', inserted, { members_added: members.length });
    return inserted;
  });
  return { resource: groupRepresentation(scope.baseUrl, row, (await membersOfGroups(scope.db, [row.id])).get(row.id)), version: row.version };
}

function auditGroup(trx: DB, scope: DirectoryScope, action: string, group: { id: string; display_name: string }, details: Record<string, unknown> = {}): Promise<void> {
  return recordAuditEvent(trx, {
    organizationId: scope.directory.organization_id,
    action,
    details: { directory_id: scope.directory.id, scim_id: group.id, display_name: group.display_name, ...details },
  });
}

/** PUT (members replaced whole when given) or PATCH (member changes applied in order), one transaction. */
export async function updateGroup(
  scope: DirectoryScope,
  id: string,
  input: { body: unknown } | { ops: PatchOperation[] },
  ifMatch: string | undefined,
  options: { withMembers: boolean },
): Promise<{ resource: Record<string, unknown>; version: number | string } | undefined> {
  if (!UUID.test(id)) throw groupNotFound(id);
  const row = await change(scope, async (trx, notes) => {
    const current = await trx.selectFrom('directory_groups').select(GROUP_COLUMNS).where('directory_id', '=', scope.directory.id).where('id', '=', id).forUpdate().executeTakeFirst();
    if (!current) throw groupNotFound(id);
    checkVersion(ifMatch, current.version);
    let displayName: string;
    let externalId: string | null;
    let changes: MemberChange[];
    if ('body' in input) {
      const fields = groupFields(input.body);
      ({ displayName, externalId } = fields);
      changes = fields.members === undefined ? [] : [{ op: 'replace', ids: fields.members }];
    } else {
      const patched = applyGroupPatch({ id: current.id, displayName: current.display_name, externalId: current.external_id }, input.ops);
      ({ displayName, externalId } = patched);
      changes = patched.members;
      if (displayName.trim() === '' || displayName.length > 256) throw badScim('invalidValue', 'displayName must be a string of 1 to 256 characters');
    }
    const updated = await trx
      .updateTable('directory_groups')
      .set({ display_name: displayName, external_id: externalId, version: sql<number>`version + 1`, updated_at: sql<Date>`now()` })
      .where('id', '=', id)
      .returning(GROUP_COLUMNS)
      .executeTakeFirstOrThrow();
    const mapped = isMapped(scope.directory, current) || isMapped(scope.directory, updated);
    const touched = new Set<string>();
    let everyone = current.display_name.toLowerCase() !== updated.display_name.toLowerCase() && mapped;
    let added = 0;
    let removed = 0;
    for (const c of changes) {
      if (c.op === 'remove_all' || c.op === 'replace') {
        const gone = await trx.deleteFrom('directory_group_members').where('group_id', '=', id).executeTakeFirst();
        removed += Number(gone.numDeletedRows);
        everyone ||= mapped && Number(gone.numDeletedRows) > 0;
      }
      if (c.op === 'add' || c.op === 'replace') {
        const ids = await ownUsers(trx, scope.directory.id, c.ids);
        await insertMembers(trx, id, ids);
        added += ids.length;
        for (const userId of ids) touched.add(userId);
      }
      if (c.op === 'remove') {
        const ids = c.ids.filter((v) => UUID.test(v)).map((v) => v.toLowerCase());
        for (let i = 0; i < ids.length; i += 1000) {
          const gone = await trx.deleteFrom('directory_group_members').where('group_id', '=', id).where('user_id', 'in', ids.slice(i, i + 1000)).executeTakeFirst();
          removed += Number(gone.numDeletedRows);
        }
        for (const userId of ids) touched.add(userId);
      }
    }
    if (everyone) await queueRoleSync(trx, scope.directory, 'group_changed');
    else if (mapped) await syncUsers(trx, scope, [...touched], notes);
    await auditGroup(trx, scope, 'directory.group.updated', updated, {
      ...(current.display_name !== updated.display_name ? { previous_display_name: current.display_name } : {}),
      members_added: added,
      members_removed: removed,
    });
    return updated;
  });
  if (!options.withMembers) return { resource: groupRepresentation(scope.baseUrl, row, undefined), version: row.version };
  return { resource: groupRepresentation(scope.baseUrl, row, (await membersOfGroups(scope.db, [id])).get(id)), version: row.version };
}

export async function deleteGroup(scope: DirectoryScope, id: string, ifMatch: string | undefined): Promise<void> {
  if (!UUID.test(id)) throw groupNotFound(id);
  await change(scope, async (trx) => {
    const current = await trx.selectFrom('directory_groups').select(GROUP_COLUMNS).where('directory_id', '=', scope.directory.id).where('id', '=', id).forUpdate().executeTakeFirst();
    if (!current) throw groupNotFound(id);
    checkVersion(ifMatch, current.version);
    await trx.deleteFrom('directory_groups').where('id', '=', id).execute();
    if (isMapped(scope.directory, current)) await queueRoleSync(trx, scope.directory, 'group_deleted');
    await auditGroup(trx, scope, 'directory.group.deleted', current);
  });
}

// ---------------------------------------------------------------------------------------------
// The job that syncs every member's role

export const DIRECTORY_ROLES_JOB = 'directory.sync_roles';
const SYNC_USERS_PER_STEP = 200;

/**
 * Walks a directory's users by keyset (directory_users_seq_idx), SYNC_USERS_PER_STEP a step, and
 * makes each active member's role what the directory's mappings say now (read in each step, so
 * a mapping changed again meanwhile is followed). Narrowed grants reach this instance once each
 * step commits. A directory deleted meanwhile ends the job.
 */
export function directoryRolesJob(memory?: RevokedGrantsMemory & Partial<RemovedMembersMemory>): JobHandler<{ directory_id: number }, { after_seq: number }> {
  return {
    kind: DIRECTORY_ROLES_JOB,
    async step(trx, job, cursor) {
      const directory = await trx.selectFrom('directories').select(['id', 'organization_id', 'default_role']).where('id', '=', job.payload.directory_id).executeTakeFirst();
      if (!directory) return { cursor, processed: 0, finished: true };
      const rows = await trx
        .selectFrom('directory_users')
        .select(['id', 'seq', 'user_id', 'active', 'role'])
        .where('directory_id', '=', directory.id)
        .where('seq', '>', cursor?.after_seq ?? 0)
        .orderBy('seq')
        .limit(SYNC_USERS_PER_STEP)
        .execute();
      if (rows.length === 0) return { cursor, processed: 0, finished: true };
      const notes = new AfterCommit();
      for (const row of rows) await syncMembership(trx, { ...directory, id: Number(directory.id), organization_id: Number(directory.organization_id) }, row, notes, { add: false });
      return {
        cursor: { after_seq: Number(rows.at(-1)!.seq) },
        processed: rows.length,
        finished: false,
        afterCommit: () => notes.tell(memory as RevokedGrantsMemory & RemovedMembersMemory),
      };
    },
  };
}
