import { type Kysely, sql } from 'kysely';

/*
 * Durable jobs and signed webhooks (issue 27).
 *
 * - jobs: long work a request starts and any instance finishes (src/jobs/). state: queued →
 *   running → succeeded, or back to queued with a backoff after a failure, or failed after too
 *   many. due_at: when a queued job may start, or when a running job's lease runs out (then any
 *   instance may take it over). attempts counts claims; a step writes only while attempts is
 *   the one it claimed with (the lease is still its own). failures counts runs that failed
 *   (a hand-back at shutdown or a takeover after a crash is not one). cursor: where the work resumes (set in
 *   the same transaction as the step's work, so a crash never repeats or skips a step).
 *   progress_done / progress_total: what operators see. organization_id: whose change it is
 *   (null: the instance's).
 * - roles.deleting: the role was deleted; a job moves its members to the role chosen, then
 *   deletes the row. Until then it is in no list or lookup, and nobody is given it.
 * - applications.deleted_at: the application was deleted: disabled and invisible at once, its
 *   grants revoked by a job; the row stays as a tombstone holding those revoked grants.
 * - webhook_endpoints: an organization's receivers. secret_sealed holds the whsec_ secret
 *   sealed with SECRET_KEY; after a rotation previous_secret_sealed keeps signing beside it
 *   until previous_secret_expires_at. failing_since: the first failure of the current run of
 *   failures (cleared by a success); five days of them disable the endpoint (disabled_reason).
 * - applications_management_scopes_check also keeps the new management scopes (webhooks.read,
 *   webhooks.write) off public applications.
 * - webhook_events: what happened, one row per audited change an enabled endpoint subscribes
 *   to, written by a trigger on audit_events, so in the same transaction as the change (an
 *   outbox: no change without its event, no event without its change). message_id is the
 *   Standard Webhooks `webhook-id`, the same on every retry.
 * - webhook_deliveries: one per event and endpoint, claimed like the mail outbox (FOR UPDATE
 *   SKIP LOCKED, a lease on next_attempt_at, attempts as the lease's owner).
 * - webhook_attempts: the delivery log: each attempt's status, the first 1 KB of the answer,
 *   or the error. Events, deliveries and attempts go 30 days on (retention).
 */
const MANAGEMENT_SCOPES_BEFORE = sql`array['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write']::text[]`;
const MANAGEMENT_SCOPES = sql`array['applications.read', 'applications.write', 'members.read', 'members.write', 'grants.read', 'grants.write', 'audit.read', 'sso.read', 'sso.write', 'webhooks.read', 'webhooks.write']::text[]`;

async function checkManagementScopes(db: Kysely<any>, scopes: typeof MANAGEMENT_SCOPES): Promise<void> {
  await sql`alter table applications drop constraint applications_management_scopes_check`.execute(db);
  await sql`alter table applications add constraint applications_management_scopes_check check (type = 'private' or not (scopes && ${scopes}))`.execute(db);
}

export async function up(db: Kysely<any>): Promise<void> {
  await checkManagementScopes(db, MANAGEMENT_SCOPES);
  await sql`create table jobs (
    id bigint generated always as identity primary key,
    kind text not null check (length(kind) between 1 and 100),
    organization_id bigint references organizations (id) on delete cascade,
    payload jsonb not null default '{}'::jsonb,
    cursor jsonb,
    state text not null default 'queued' check (state in ('queued', 'running', 'succeeded', 'failed')),
    progress_done bigint not null default 0,
    progress_total bigint,
    attempts integer not null default 0,
    failures integer not null default 0,
    due_at timestamptz not null default now(),
    instance text,
    last_error text,
    created_at timestamptz not null default now(),
    started_at timestamptz,
    updated_at timestamptz not null default now(),
    finished_at timestamptz
  )`.execute(db);
  await sql`create index jobs_due_idx on jobs (due_at) where state in ('queued', 'running')`.execute(db);
  await sql`create index jobs_finished_at_idx on jobs (finished_at) where finished_at is not null`.execute(db);
  await sql`create index jobs_organization_id_id_idx on jobs (organization_id, id) where organization_id is not null`.execute(db);

  await sql`alter table applications add column deleted_at timestamptz`.execute(db);
  await sql`alter table roles add column deleting boolean not null default false`.execute(db);
  // What the application jobs walk: an application's live grants in id order.
  await sql`create index grants_live_application_id_id_idx on grants (application_id, id) where revoked_at is null`.execute(db);

  await sql`create table webhook_endpoints (
    id bigint generated always as identity primary key,
    organization_id bigint not null references organizations (id) on delete cascade,
    url text not null check (length(url) between 1 and 2000),
    description text not null default '' check (length(description) <= 500),
    events text[] not null check (cardinality(events) between 1 and 100),
    enabled boolean not null default true,
    disabled_reason text,
    secret_sealed text not null,
    previous_secret_sealed text,
    previous_secret_expires_at timestamptz,
    failing_since timestamptz,
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now()
  )`.execute(db);
  await sql`create index webhook_endpoints_organization_id_id_idx on webhook_endpoints (organization_id, id)`.execute(db);

  await sql`create table webhook_events (
    id bigint generated always as identity primary key,
    organization_id bigint not null references organizations (id) on delete cascade,
    type text not null,
    message_id text not null unique,
    payload jsonb not null,
    created_at timestamptz not null default now()
  )`.execute(db);
  await sql`create index webhook_events_created_at_idx on webhook_events (created_at)`.execute(db);

  await sql`create table webhook_deliveries (
    id bigint generated always as identity primary key,
    event_id bigint not null references webhook_events (id) on delete cascade,
    endpoint_id bigint not null references webhook_endpoints (id) on delete cascade,
    organization_id bigint not null,
    state text not null default 'pending' check (state in ('pending', 'succeeded', 'failed')),
    attempts integer not null default 0,
    next_attempt_at timestamptz not null default now(),
    last_status integer,
    last_error text,
    created_at timestamptz not null default now(),
    finished_at timestamptz
  )`.execute(db);
  await sql`create index webhook_deliveries_due_idx on webhook_deliveries (next_attempt_at) where state = 'pending'`.execute(db);
  await sql`create index webhook_deliveries_endpoint_id_id_idx on webhook_deliveries (endpoint_id, id)`.execute(db);
  await sql`create index webhook_deliveries_event_id_idx on webhook_deliveries (event_id)`.execute(db);

  await sql`create table webhook_attempts (
    id bigint generated always as identity primary key,
    delivery_id bigint not null references webhook_deliveries (id) on delete cascade,
    attempt integer not null,
    started_at timestamptz not null default now(),
    duration_ms integer not null,
    status integer,
    response_body text,
    error text
  )`.execute(db);
  await sql`create index webhook_attempts_delivery_id_idx on webhook_attempts (delivery_id, attempt)`.execute(db);

  // The outbox: every audited change that an enabled endpoint of its organization subscribes to
  // becomes an event and a delivery per such endpoint, in the inserting statement's transaction.
  // One statement per insert into audit_events (a transition table), so a batch of 300 revoked
  // grants costs one probe of the endpoints' index per row, and nothing when none subscribes.
  await sql`create function orgauth_webhook_outbox() returns trigger language plpgsql as $$
    declare
      queued integer;
    begin
      with event as (
        insert into webhook_events (organization_id, type, message_id, payload, created_at)
        select n.organization_id, n.action, 'msg_' || replace(gen_random_uuid()::text, '-', ''),
          jsonb_build_object(
            'type', n.action,
            'timestamp', to_char(n.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'data', n.details || jsonb_build_object(
              'organization_id', n.organization_id,
              'actor', jsonb_build_object('user_id', n.actor_user_id, 'client_id', n.actor_client_id))
              -- The resource's version where it has one (its updated_at after this change): ordering
              -- is not guaranteed, so a receiver keeps the newest version it saw.
              || jsonb_strip_nulls(jsonb_build_object('version', to_char((case
                when n.action like 'application.%' then (select a.updated_at from applications a where a.client_id = n.details->>'client_id')
                when n.action like 'role.%' then (select r.updated_at from roles r where r.organization_id = n.organization_id and r.id::text = n.details->>'role_id')
                when n.action = 'organization.updated' then (select o.updated_at from organizations o where o.id = n.organization_id)
              end) at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')))),
          n.created_at
        from new_rows n
        where exists (select 1 from webhook_endpoints e where e.organization_id = n.organization_id and e.enabled and n.action = any (e.events))
        returning id, organization_id, type
      )
      -- FOR KEY SHARE: an endpoint deleted meanwhile is skipped (its delete waited for, if still
      -- running), never a foreign-key error in the change being audited (a token issued, a member added).
      insert into webhook_deliveries (event_id, endpoint_id, organization_id)
      select event.id, e.id, event.organization_id
      from event join webhook_endpoints e on e.organization_id = event.organization_id and e.enabled and event.type = any (e.events)
      for key share of e;
      get diagnostics queued = row_count;
      if queued > 0 then
        perform pg_notify('orgauth_webhooks', '');
      end if;
      return null;
    end $$`.execute(db);
  await sql`create trigger audit_events_webhook_outbox after insert on audit_events
    referencing new table as new_rows for each statement execute function orgauth_webhook_outbox()`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop trigger audit_events_webhook_outbox on audit_events`.execute(db);
  await sql`drop function orgauth_webhook_outbox()`.execute(db);
  await sql`drop table webhook_attempts`.execute(db);
  await sql`drop table webhook_deliveries`.execute(db);
  await sql`drop table webhook_events`.execute(db);
  await sql`drop table webhook_endpoints`.execute(db);
  await sql`drop index grants_live_application_id_id_idx`.execute(db);
  await sql`alter table roles drop column deleting`.execute(db);
  await sql`alter table applications drop column deleted_at`.execute(db);
  await sql`drop table jobs`.execute(db);
  await checkManagementScopes(db, MANAGEMENT_SCOPES_BEFORE);
}
