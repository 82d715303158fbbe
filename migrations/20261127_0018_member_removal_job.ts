import { type Kysely, sql } from 'kysely';

/*
 * Removing a member is a job too (issue 27): the removal takes effect at once, and a job revokes
 * the member's grants, however many.
 *
 * - removed_members.restored_at: when an admin or an invitation added the person back. The row
 *   stays (it used to be deleted): removed_at still says which of their tokens and grants the
 *   removal ended (those from before it), while the job may still be revoking them. A removal
 *   again sets removed_at and clears restored_at. Automation (just-in-time provisioning) adds
 *   back only those whose removal was restored.
 * - removed_members_removed_at_idx: what every instance reads, in (removed_at, organization_id,
 *   user_id) order, to refuse a removed member's access tokens within a second (the revoked
 *   set, src/oauth/models/revocation-list.ts).
 * - grants_live_member_id_idx: what the job walks, a member's live grants in an organization in
 *   id order (a keyset, flat however many there are).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`alter table removed_members add column restored_at timestamptz`.execute(db);
  await sql`create index removed_members_removed_at_idx on removed_members (removed_at, organization_id, user_id)`.execute(db);
  await sql`create index grants_live_member_id_idx on grants (organization_id, user_id, id) where revoked_at is null`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop index grants_live_member_id_idx`.execute(db);
  await sql`drop index removed_members_removed_at_idx`.execute(db);
  // Restored rows meant "not removed" under the old rule (deleted).
  await sql`delete from removed_members where restored_at is not null`.execute(db);
  await sql`alter table removed_members drop column restored_at`.execute(db);
}
