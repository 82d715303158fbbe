import { type Kysely, sql } from 'kysely';

/*
 * The Overview's activity (issue 29).
 *
 * - activity_daily: per organization, per metric, per UTC day, a count. Every instance counts
 *   events in memory as they happen (sign-ins, consents, tokens by grant type, API answers) and
 *   adds its counts here every few seconds (src/activity.ts), so the Overview and
 *   GET /api/v1/:org/activity read at most 30 days × a dozen metrics, whatever the organization
 *   holds: never the audit log or the grants. Retention deletes rows by day
 *   (activity_daily_day_idx) after 400 days.
 * - organizations.checklist_dismissed_at: the first-run checklist was put away.
 * - applications.first_used_at, set by the first token of every application now (it was for
 *   self-registered clients only): the Overview's "never used" reads it, not the grants.
 * - invitations_pending_organization_id_expires_at_idx: the Overview's "invitations about to
 *   expire", a range of one organization's pending invitations.
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`create table activity_daily (
    organization_id bigint not null references organizations (id) on delete cascade,
    metric text not null check (metric ~ '^[a-z0-9_]{1,40}$'),
    day date not null,
    count bigint not null check (count >= 0),
    primary key (organization_id, metric, day)
  )`.execute(db);
  await sql`create index activity_daily_day_idx on activity_daily (day)`.execute(db);
  await sql`alter table organizations add column checklist_dismissed_at timestamptz`.execute(db);
  // first_used_at was kept for self-registered clients only; now for every application. Those
  // in use already: since their first grant.
  await sql`update applications a set first_used_at = (select min(g.created_at) from grants g where g.application_id = a.id)
    where a.first_used_at is null and a.registration = 'developer' and exists (select 1 from grants g where g.application_id = a.id)`.execute(db);
  await sql`create index invitations_pending_organization_id_expires_at_idx on invitations (organization_id, expires_at)
    where accepted_at is null and revoked_at is null`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop index invitations_pending_organization_id_expires_at_idx`.execute(db);
  await sql`alter table organizations drop column checklist_dismissed_at`.execute(db);
  await sql`update applications set first_used_at = null where registration = 'developer'`.execute(db);
  await sql`drop table activity_daily`.execute(db);
}
