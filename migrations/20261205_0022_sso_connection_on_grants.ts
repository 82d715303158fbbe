import type { Kysely } from 'kysely';

/*
 * SS-4: an organization that requires single sign-on is reached only through one of its own active
 * connections, checked whenever a sign-in is used for it: at consent, when a code (or an approved
 * device code) is redeemed, and at every refresh. So what a session was signed in through travels
 * with what it made: the authorization code, the device authorization it approved, and the grant.
 *
 * No foreign key: the value records what the sign-in was made through, as amr does. A connection
 * deleted since is not an active connection, which is all the checks ask (and deleting a
 * connection does not have to visit every grant of its organization).
 *
 * Grants made before this column have no record of their sign-in's connection: a grant of a person
 * whose organization requires SSO is refused at its next refresh, and the application sends them
 * through sign-in again, once.
 */
export async function up(db: Kysely<any>): Promise<void> {
  for (const table of ['authorization_codes', 'device_authorizations', 'grants']) {
    await db.schema.alterTable(table).addColumn('sso_connection_id', 'integer').execute();
  }
}

export async function down(db: Kysely<any>): Promise<void> {
  for (const table of ['authorization_codes', 'device_authorizations', 'grants']) {
    await db.schema.alterTable(table).dropColumn('sso_connection_id').execute();
  }
}
