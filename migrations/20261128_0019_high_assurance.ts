import { type Kysely, sql } from 'kysely';

/*
 * High-assurance OAuth (issue 28): sender-constrained tokens (DPoP, RFC 9449), pushed
 * authorization requests (RFC 9126), private_key_jwt (RFC 7523), ID tokens signed as each
 * application asks (RS256 by default), and the FAPI 2.0 profile per application.
 *
 * - signing_keys: one active key per algorithm (was: one active key). Access tokens are signed
 *   with SIGNING_ALG's; ID tokens with the application's id_token_signed_response_alg's, and
 *   OpenID Connect Discovery requires RS256 among them, so an RS256 and an ES256 key are always
 *   kept.
 * - applications: the RFC 7591 / RFC 9449 / RFC 9126 fields. A private_key_jwt application has
 *   no secret (the secret check is widened to it) and exactly one of jwks and jwks_uri. The
 *   existing applications keep the ID token algorithm they had, the active key's (SIGNING_ALG):
 *   RS256 stays RS256, ES256 stays ES256; EdDSA, which an application can no longer ask for,
 *   becomes ES256. New ones get RS256, the OpenID Connect registration default.
 * - authorization_codes.dpop_jkt, grants.dpop_jkt: the key a code (dpop_jkt, RFC 9449 §10) and a
 *   grant's tokens are bound to.
 * - pushed_authorization_requests: a request_uri's parameters, 60 s to first use, one code.
 * - seen_jtis: the replay store of DPoP proofs (until their window closes) and of private_key_jwt
 *   assertions (until they expire, at most 5 minutes), keyed by kind, key or client, and jti.
 *   UNLOGGED: its writes skip the WAL and its commits wait for no flush, which is what makes a
 *   write per proof affordable; a crash empties it, as a cache in memory would be emptied, and
 *   what it protects is minutes long (tokens stay bound to their key either way).
 */
export async function up(db: Kysely<any>): Promise<void> {
  await sql`drop index signing_keys_one_active_key`.execute(db);
  await sql`create unique index signing_keys_one_active_key_per_alg on signing_keys (alg) where retired_at is null`.execute(db);

  await sql`alter table applications
    drop constraint applications_token_endpoint_auth_method_check,
    add constraint applications_token_endpoint_auth_method_check
      check (token_endpoint_auth_method in ('client_secret_basic', 'client_secret_post', 'none', 'private_key_jwt')),
    drop constraint applications_secret_check,
    add constraint applications_secret_check check ((client_secret_hash is null) = (token_endpoint_auth_method in ('none', 'private_key_jwt'))),
    add column jwks jsonb,
    add column jwks_uri text check (length(jwks_uri) <= 2000),
    add constraint applications_client_keys_check check (
      (jwks is null or jwks_uri is null)
      and ((token_endpoint_auth_method = 'private_key_jwt') = (jwks is not null or jwks_uri is not null))),
    add column dpop_bound_access_tokens boolean not null default false,
    add column require_pushed_authorization_requests boolean not null default false,
    add column id_token_signed_response_alg text not null default 'ES256' check (id_token_signed_response_alg in ('RS256', 'ES256')),
    add column fapi2 boolean not null default false`.execute(db);
  await sql`update applications set id_token_signed_response_alg = 'RS256'
    where exists (select 1 from signing_keys where retired_at is null and alg = 'RS256')`.execute(db);
  await sql`alter table applications alter column id_token_signed_response_alg set default 'RS256'`.execute(db);

  await sql`alter table authorization_codes add column dpop_jkt text`.execute(db);
  await sql`alter table grants add column dpop_jkt text`.execute(db);

  await sql`create table pushed_authorization_requests (
    id bigint generated always as identity primary key,
    request_uri_hash text not null unique,
    application_id integer not null references applications (id) on delete cascade,
    params jsonb not null,
    dpop_jkt text,
    expires_at timestamptz not null,
    first_used_at timestamptz,
    consumed_at timestamptz,
    created_at timestamptz not null default now()
  )`.execute(db);
  await sql`create index pushed_authorization_requests_expires_at_idx on pushed_authorization_requests (expires_at)`.execute(db);

  await sql`create unlogged table seen_jtis (
    key text primary key check (length(key) <= 400),
    expires_at timestamptz not null
  )`.execute(db);
  await sql`create index seen_jtis_expires_at_idx on seen_jtis (expires_at)`.execute(db);
}

export async function down(db: Kysely<any>): Promise<void> {
  await sql`drop table seen_jtis`.execute(db);
  await sql`drop table pushed_authorization_requests`.execute(db);
  await sql`alter table grants drop column dpop_jkt`.execute(db);
  await sql`alter table authorization_codes drop column dpop_jkt`.execute(db);
  // Keys cannot be given back a secret: a private_key_jwt application gets one nobody knows and is
  // left disabled, until an administrator rotates its secret (none: the old code would let anyone
  // with its client_id in, as a public client).
  await sql`alter table applications drop constraint applications_client_keys_check, drop constraint applications_secret_check`.execute(db);
  await sql`update applications set disabled = true, token_endpoint_auth_method = 'client_secret_basic', jwks = null, jwks_uri = null,
      client_secret_hash = encode(sha256(gen_random_uuid()::text::bytea), 'hex')
    where token_endpoint_auth_method = 'private_key_jwt'`.execute(db);
  await sql`alter table applications
    drop column fapi2, drop column id_token_signed_response_alg, drop column require_pushed_authorization_requests,
    drop column dpop_bound_access_tokens, drop column jwks_uri, drop column jwks,
    add constraint applications_secret_check check ((client_secret_hash is null) = (token_endpoint_auth_method = 'none')),
    drop constraint applications_token_endpoint_auth_method_check,
    add constraint applications_token_endpoint_auth_method_check check (token_endpoint_auth_method in ('client_secret_basic', 'client_secret_post', 'none'))`.execute(db);
  // One active key again: the oldest, the one from before this migration (the ID tokens' keys
  // came with it); the others are retired.
  await sql`update signing_keys set retired_at = now() where retired_at is null
    and kid <> (select kid from signing_keys where retired_at is null order by created_at, kid limit 1)`.execute(db);
  await sql`drop index signing_keys_one_active_key_per_alg`.execute(db);
  await sql`create unique index signing_keys_one_active_key on signing_keys ((retired_at is null)) where retired_at is null`.execute(db);
}
