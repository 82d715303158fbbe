import { type Kysely, sql } from 'kysely';

/*
 * Resource servers (issue 44; src/oauth/models/resources.ts, endpoints/introspect.ts): a
 * registered resource gets credentials of its own, to introspect the tokens issued for it and to
 * exchange them (RFC 8693) for tokens to the next resource.
 *
 * - A resource's credentials are an applications row of type and registration 'resource',
 *   belonging to no organization, pointing at its resource (resource_id, unique; the row goes
 *   with the resource). So a resource authenticates as any client does (client_secret_basic or
 *   _post, private_key_jwt), with the same throttle, cache and NOTIFY on change; every grant and
 *   endpoint that checks an application's type refuses it. It has no scopes, redirect URIs or
 *   grant types but token exchange. A resource registered before this migration has none until
 *   `orgauth resource rotate-secret` makes them (a secret made here would be shown to nobody).
 * - resources.exchange_from: who may exchange a token for one to this resource (resource URIs
 *   in canonical form, client ids); empty, nobody.
 */
const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';

export async function up(db: Kysely<any>): Promise<void> {
  await sql`alter table resources
    add column exchange_from text[] not null default '{}'::text[] check (cardinality(exchange_from) <= 100)`.execute(db);
  await sql`alter table applications
    add column resource_id integer unique references resources(id) on delete cascade,
    drop constraint applications_type_check,
    add constraint applications_type_check check (type in ('public', 'private', 'resource')),
    drop constraint applications_registration_check,
    add constraint applications_registration_check check (registration in ('developer', 'dynamic', 'metadata_document', 'resource')),
    add constraint applications_resource_check check (
      (registration = 'resource') = (type = 'resource') and (type = 'resource') = (resource_id is not null)
      and (type <> 'resource' or (cardinality(scopes) = 0 and grant_types = ${sql.lit(`{${EXCHANGE}}`)}::text[] and token_endpoint_auth_method <> 'none'))
      and (type = 'resource' or not (${sql.lit(EXCHANGE)} = any(grant_types)))),
    drop constraint applications_registered_public_check,
    add constraint applications_registered_public_check check (registration in ('developer', 'resource') or type = 'public'),
    drop constraint applications_scopes_check,
    add constraint applications_scopes_check check (type = 'resource' or cardinality(scopes) >= 1),
    drop constraint applications_grant_types_check,
    add constraint applications_grant_types_check check (
      grant_types <@ ${sql.lit(`{authorization_code,refresh_token,client_credentials,urn:ietf:params:oauth:grant-type:device_code,${EXCHANGE}}`)}::text[]
      and cardinality(grant_types) >= 1),
    drop constraint applications_redirect_uris_check,
    add constraint applications_redirect_uris_check check (
      (type = 'public' and cardinality(redirect_uris) <= 20 and (cardinality(redirect_uris) >= 1 or not ('authorization_code' = any(grant_types))))
      or (type in ('private', 'resource') and cardinality(redirect_uris) = 0))`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`delete from applications where type = 'resource'`.execute(db);
  await sql`alter table applications
    drop constraint applications_resource_check,
    drop column resource_id,
    drop constraint applications_type_check,
    add constraint applications_type_check check (type in ('public', 'private')),
    drop constraint applications_registration_check,
    add constraint applications_registration_check check (registration in ('developer', 'dynamic', 'metadata_document')),
    drop constraint applications_registered_public_check,
    add constraint applications_registered_public_check check (registration = 'developer' or type = 'public'),
    drop constraint applications_scopes_check,
    add constraint applications_scopes_check check (cardinality(scopes) >= 1),
    drop constraint applications_grant_types_check,
    add constraint applications_grant_types_check check (
      grant_types <@ '{authorization_code,refresh_token,client_credentials,urn:ietf:params:oauth:grant-type:device_code}'::text[]
      and cardinality(grant_types) >= 1),
    drop constraint applications_redirect_uris_check,
    add constraint applications_redirect_uris_check check (
      (type = 'public' and cardinality(redirect_uris) <= 20 and (cardinality(redirect_uris) >= 1 or not ('authorization_code' = any(grant_types))))
      or (type = 'private' and cardinality(redirect_uris) = 0))`.execute(db);
  await sql`alter table resources drop column exchange_from`.execute(db);
}
