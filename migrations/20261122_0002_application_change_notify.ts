import { type Kysely, sql } from 'kysely';

/*
 * Every change to an application (secret rotated, disabled, edited, deleted), whoever makes it
 * (dashboard, CLI, an operator's SQL), is published on the channel `orgauth_applications` with
 * the client_id as payload, when the change commits. Instances cache applications for client
 * authentication and drop the entry on this signal (src/oauth/models/application-cache.ts).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`
    create function orgauth_notify_application_change() returns trigger language plpgsql as $$
    begin
      perform pg_notify('orgauth_applications', old.client_id);
      return null;
    end
    $$`.execute(db);
  await sql`
    create trigger applications_notify_change
    after update or delete on applications
    for each row execute function orgauth_notify_application_change()`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop trigger applications_notify_change on applications`.execute(db);
  await sql`drop function orgauth_notify_application_change()`.execute(db);
}
