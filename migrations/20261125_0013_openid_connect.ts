import { type Kysely, sql } from 'kysely';

/*
 * OpenID Connect (issue 16).
 *
 * - identity_scopes (authorization_codes, grants): the OpenID scopes granted (openid, profile,
 *   email). They say what the application learns about the user, not what it may do with the
 *   organization's data, so they live beside `scopes` rather than in it: roles and an
 *   application's registered scopes bound `scopes` only, and every statement that compares
 *   `scopes` with a role or an application (redemption, refresh, narrowing) stays as it is.
 * - nonce, auth_time, sid (authorization_codes): what the ID token of the code's redemption
 *   carries: the nonce the request sent, when the user signed in, and the browser session's
 *   identifier (a hash, never the cookie). auth_time and sid go on to the grant, so a refresh's
 *   ID token has the same auth_time and sid (OIDC Core §12.2); the nonce does not.
 * - applications.post_logout_redirect_uris: where RP-initiated logout may send the browser
 *   afterwards (OpenID Connect RP-Initiated Logout 1.0), compared byte for byte like
 *   redirect_uris. Only public applications sign users in, so only they may have any.
 */
const IDENTITY = sql`array['openid', 'profile', 'email']::text[]`;

export async function up(db: Kysely<any>): Promise<void> {
  for (const table of ['authorization_codes', 'grants']) {
    await db.schema
      .alterTable(table)
      .addColumn('identity_scopes', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`).check(sql`identity_scopes <@ ${IDENTITY}`))
      .execute();
    await db.schema.alterTable(table).addColumn('auth_time', 'timestamptz').execute();
    await db.schema.alterTable(table).addColumn('sid', 'text', (c) => c.check(sql`length(sid) <= 64`)).execute();
  }
  await db.schema.alterTable('authorization_codes').addColumn('nonce', 'text', (c) => c.check(sql`length(nonce) <= 512`)).execute();
  await db.schema
    .alterTable('applications')
    .addColumn('post_logout_redirect_uris', sql`text[]`, (c) => c.notNull().defaultTo(sql`'{}'::text[]`))
    .execute();
  await db.schema
    .alterTable('applications')
    .addCheckConstraint(
      'applications_post_logout_redirect_uris_check',
      sql`cardinality(post_logout_redirect_uris) <= 20 and (type = 'public' or cardinality(post_logout_redirect_uris) = 0)`,
    )
    .execute();
}

export async function down(db: Kysely<any>): Promise<void> {
  // Grants for signing in only (no scope of data) would give the code before this migration
  // tokens with an empty scope: they end, with their refresh tokens.
  await sql`update refresh_tokens r set revoked_at = now() from grants g
    where g.id = r.grant_id and g.revoked_at is null and cardinality(g.scopes) = 0 and r.revoked_at is null`.execute(db);
  await sql`update grants set revoked_at = now(), revoked_reason = 'scopes_narrowed' where revoked_at is null and cardinality(scopes) = 0`.execute(db);
  await db.schema.alterTable('applications').dropConstraint('applications_post_logout_redirect_uris_check').execute();
  await db.schema.alterTable('applications').dropColumn('post_logout_redirect_uris').execute();
  await db.schema.alterTable('authorization_codes').dropColumn('nonce').execute();
  for (const table of ['grants', 'authorization_codes']) {
    await db.schema.alterTable(table).dropColumn('sid').execute();
    await db.schema.alterTable(table).dropColumn('auth_time').execute();
    await db.schema.alterTable(table).dropColumn('identity_scopes').execute();
  }
}
