/**
 * The database as the compiler sees it. Kept in step with migrations/ by hand; the migration
 * tests compare this file's tables and columns with the migrated database's.
 *
 * bigint columns are read as JS numbers (see connect.ts: values beyond 2^53 throw rather than
 * round), dates as 'YYYY-MM-DD' strings, timestamptz as Date.
 */
import type { ColumnType, Generated, Insertable, Selectable, Updateable } from 'kysely';
import type { JWK } from 'jose';

type Timestamp = ColumnType<Date, Date | string | undefined, Date | string>;
type NullableTimestamp = ColumnType<Date | null, Date | string | null | undefined, Date | string | null>;
type TextArray = ColumnType<string[], string[], string[]>;
type Json<T> = ColumnType<T, string, string>;

/** The roles every organization has (src/accounts/roles.ts); 'custom' in a row means role_id names one of the organization's own. */
export type BuiltinRole = 'owner' | 'admin' | 'member' | 'viewer';
export type RoleKind = BuiltinRole | 'custom';
/** 'resource': a registered resource's own credentials (migration 0029), no organization's application. */
export type ApplicationType = 'public' | 'private' | 'resource';
export type TaskStatus = 'open' | 'done';

export interface UsersTable {
  id: Generated<number>;
  email: string;
  /** argon2id; null for someone who has only signed in through their organization's identity provider. */
  password_hash: ColumnType<string | null, string | null, string | null>;
  name: ColumnType<string, string | undefined, string>;
  /** When the user proved they read mail at `email`; null until then. */
  email_verified_at: NullableTimestamp;
  created_at: Generated<Date>;
  updated_at: Timestamp;
  /** Set when too many wrong second-step codes landed in the window (accounts/second-factors.ts). */
  second_step_locked_until: NullableTimestamp;
}

export type AccountTokenPurpose = 'verify_email' | 'reset_password';

/** A link sent to a user by email: only the token's SHA-256 is kept; used once. */
export interface AccountTokensTable {
  id: Generated<number>;
  token_hash: string;
  purpose: AccountTokenPurpose;
  user_id: number;
  /** The address a verification link confirms (for a reset: the address it was sent to). */
  email: string;
  created_at: Generated<Date>;
  expires_at: Timestamp;
  /** When the link was used, or ended unused (the password changed, a newer link was sent). */
  used_at: NullableTimestamp;
}

/**
 * A sign-up waiting for its address to be confirmed (src/accounts/sign-ups.ts): the user and
 * their organization are made only when the mailed link is followed. One per address.
 */
export interface PendingSignUpsTable {
  id: Generated<number>;
  email: string;
  /** SHA-256 (hex) of the link's token. */
  token_hash: string;
  /** argon2id. */
  password_hash: string;
  name: string;
  organization_name: string;
  /** Where the browser goes once signed in (a same-origin path, sessions.ts safeReturnTo). */
  return_to: string;
  created_at: Generated<Date>;
  expires_at: Timestamp;
}

/** A sign-up the throttles let through: counted per address and per client address group for an hour. */
export interface SignUpAttemptsTable {
  id: Generated<number>;
  /** The address as typed, lowercased. */
  email: string;
  /** The client's address group (lib/client-address.ts). */
  ip: string;
  created_at: Generated<Date>;
}

export interface InvitationsTable {
  id: Generated<number>;
  organization_id: number;
  email: string;
  role: RoleKind;
  /** The custom role, when role is 'custom'. */
  role_id: ColumnType<number | null, number | null | undefined, number | null>;
  token_hash: string;
  invited_by_user_id: number | null;
  invited_by_client_id: string | null;
  created_at: Generated<Date>;
  /** When the link was last sent (a resend sends a new link). */
  sent_at: Generated<Date>;
  expires_at: Timestamp;
  accepted_at: NullableTimestamp;
  accepted_by_user_id: number | null;
  revoked_at: NullableTimestamp;
}

export type JobState = 'queued' | 'running' | 'succeeded' | 'failed';

/** Durable background work (src/jobs/queue.ts). */
export interface JobsTable {
  id: Generated<number>;
  kind: string;
  organization_id: number | null;
  payload: ColumnType<Record<string, unknown>, string, string>;
  cursor: ColumnType<unknown, string | null, string | null>;
  state: ColumnType<JobState, JobState | undefined, JobState>;
  progress_done: ColumnType<number, number | undefined, number>;
  progress_total: number | null;
  attempts: ColumnType<number, number | undefined, number>;
  /** Runs that failed (not hand-backs or takeovers). */
  failures: ColumnType<number, number | undefined, number>;
  /** When a queued job may start; when a running job's lease runs out. */
  due_at: ColumnType<Date, Date | undefined, Date>;
  instance: string | null;
  last_error: string | null;
  created_at: Generated<Date>;
  started_at: NullableTimestamp;
  updated_at: ColumnType<Date, Date | undefined, Date>;
  finished_at: NullableTimestamp;
}

/** An organization's webhook receiver (src/webhooks/). */
export interface WebhookEndpointsTable {
  id: Generated<number>;
  organization_id: number;
  url: string;
  description: ColumnType<string, string | undefined, string>;
  events: string[];
  enabled: ColumnType<boolean, boolean | undefined, boolean>;
  disabled_reason: string | null;
  /** The whsec_ secret, sealed with SECRET_KEY. */
  secret_sealed: string;
  previous_secret_sealed: string | null;
  previous_secret_expires_at: NullableTimestamp;
  failing_since: NullableTimestamp;
  created_at: Generated<Date>;
  updated_at: ColumnType<Date, Date | undefined, Date>;
}

/** An event for the organization's webhooks, written by a trigger on audit_events (migration 0017). */
export interface WebhookEventsTable {
  id: Generated<number>;
  organization_id: number;
  type: string;
  /** The Standard Webhooks webhook-id, the same on every retry. */
  message_id: string;
  payload: ColumnType<Record<string, unknown>, string, string>;
  created_at: Generated<Date>;
}

export type WebhookDeliveryState = 'pending' | 'succeeded' | 'failed';

export interface WebhookDeliveriesTable {
  id: Generated<number>;
  event_id: number;
  endpoint_id: number;
  organization_id: number;
  state: ColumnType<WebhookDeliveryState, WebhookDeliveryState | undefined, WebhookDeliveryState>;
  attempts: ColumnType<number, number | undefined, number>;
  next_attempt_at: ColumnType<Date, Date | undefined, Date>;
  last_status: number | null;
  last_error: string | null;
  created_at: Generated<Date>;
  finished_at: NullableTimestamp;
}

/** The delivery log: one row per attempt. */
export interface WebhookAttemptsTable {
  id: Generated<number>;
  delivery_id: number;
  attempt: number;
  started_at: Generated<Date>;
  duration_ms: number;
  status: number | null;
  /** The first 1 KB of the answer's body. */
  response_body: string | null;
  error: string | null;
}

/** A message waiting to be sent, or sent (body cleared); see src/mail/outbox.ts. */
export interface MailOutboxTable {
  id: Generated<number>;
  recipient: string;
  subject: string;
  /** The text and HTML bodies, encrypted under a key derived from SECRET_KEY; null once sent. */
  body_encrypted: string | null;
  created_at: Generated<Date>;
  attempts: ColumnType<number, number | undefined, number>;
  next_attempt_at: Timestamp;
  last_error: string | null;
  sent_at: NullableTimestamp;
  failed_at: NullableTimestamp;
  /** Set when the message is done with (sent or given up): retention deletes it a week later. */
  expires_at: NullableTimestamp;
}

export interface OrganizationsTable {
  id: Generated<number>;
  name: string;
  /** Members reach this organization only after signing in with two factors. */
  require_mfa: ColumnType<boolean, boolean | undefined, boolean>;
  created_at: Generated<Date>;
  updated_at: Timestamp;
  /** The Overview's first-run checklist was put away. */
  checklist_dismissed_at: NullableTimestamp;
}

/** Per organization, metric and UTC day, how many times it happened (src/activity.ts). */
export interface ActivityDailyTable {
  organization_id: number;
  metric: string;
  /** 'YYYY-MM-DD' (pg returns dates as text, see connect.ts). */
  day: ColumnType<string, string, never>;
  count: ColumnType<number, number, number>;
}

export interface MembershipsTable {
  organization_id: number;
  user_id: number;
  role: RoleKind;
  /** The custom role, when role is 'custom'. */
  role_id: ColumnType<number | null, number | null | undefined, number | null>;
  created_at: Generated<Date>;
}

/** An organization's own role (the built-in ones are in code: src/accounts/roles.ts). */
export interface RolesTable {
  id: Generated<number>;
  organization_id: number;
  name: string;
  description: ColumnType<string, string | undefined, string>;
  permissions: TextArray;
  created_at: Generated<Date>;
  updated_at: Timestamp;
  /** Deleted: a job is moving its members to another role, then deletes the row (roles.ts deleteRole). */
  deleting: ColumnType<boolean, boolean | undefined, boolean>;
}

/** Who registered an application: a developer (it belongs to their organization), RFC 7591 dynamic registration, or a client ID metadata document. */
export type ApplicationRegistration = 'developer' | 'dynamic' | 'metadata_document' | 'resource';
/** The clients that registered themselves (no organization's, no resource's): the operator's `orgauth client`, the reaper of unused ones. */
export const SELF_REGISTRATIONS = ['dynamic', 'metadata_document'] as const satisfies readonly ApplicationRegistration[];
export type TokenEndpointAuthMethod = 'client_secret_basic' | 'client_secret_post' | 'none' | 'private_key_jwt';
/** The algorithms an application may ask its ID tokens to be signed with (OpenID Connect Registration id_token_signed_response_alg). */
export const ID_TOKEN_ALGS = ['RS256', 'ES256'] as const;
export type IdTokenAlg = (typeof ID_TOKEN_ALGS)[number];
/** An RFC 7517 JWK Set of public keys, as registered for private_key_jwt. */
export interface PublicJwks {
  keys: JWK[];
}
export const DEVICE_CODE_GRANT = 'urn:ietf:params:oauth:grant-type:device_code';
export const TOKEN_EXCHANGE_GRANT = 'urn:ietf:params:oauth:grant-type:token-exchange';
export type GrantType = 'authorization_code' | 'refresh_token' | 'client_credentials' | typeof DEVICE_CODE_GRANT | typeof TOKEN_EXCHANGE_GRANT;

export interface ApplicationsTable {
  id: Generated<number>;
  /** The organization a developer's application belongs to; null for clients that registered themselves. */
  organization_id: ColumnType<number | null, number | null | undefined, number | null>;
  client_id: string;
  /** SHA-256 of the secret; null exactly when token_endpoint_auth_method is none. */
  client_secret_hash: string | null;
  type: ApplicationType;
  name: string;
  redirect_uris: ColumnType<string[], string[] | undefined, string[]>;
  /** Where RP-initiated logout may send the browser afterwards (public applications only). */
  post_logout_redirect_uris: ColumnType<string[], string[] | undefined, string[]>;
  scopes: TextArray;
  require_pkce: ColumnType<boolean, boolean | undefined, boolean>;
  disabled: ColumnType<boolean, boolean | undefined, boolean>;
  secret_rotated_at: NullableTimestamp;
  created_at: Generated<Date>;
  updated_at: Timestamp;
  registration: ColumnType<ApplicationRegistration, ApplicationRegistration | undefined, ApplicationRegistration>;
  token_endpoint_auth_method: ColumnType<TokenEndpointAuthMethod, TokenEndpointAuthMethod | undefined, TokenEndpointAuthMethod>;
  grant_types: ColumnType<GrantType[], GrantType[] | undefined, GrantType[]>;
  /** RFC 7592: SHA-256 of the registration access token (dynamic registrations). */
  registration_token_hash: ColumnType<string | null, string | null | undefined, string | null>;
  registered_ip: ColumnType<string | null, string | null | undefined, string | null>;
  /** When a self-registered client first obtained a token; those that never do are reaped after a day. */
  first_used_at: NullableTimestamp;
  metadata_fetched_at: NullableTimestamp;
  /** Deleted: disabled and invisible while a job revokes its grants, then the row goes. */
  deleted_at: NullableTimestamp;
  /** private_key_jwt: the client's public keys, inline (RFC 7591 jwks) or at a URL (jwks_uri); exactly one of them, only then. */
  jwks: ColumnType<PublicJwks | null, string | null | undefined, string | null>;
  jwks_uri: ColumnType<string | null, string | null | undefined, string | null>;
  /** RFC 9449 §5.2: every access token of the application is DPoP-bound (a request without a proof is refused). */
  dpop_bound_access_tokens: ColumnType<boolean, boolean | undefined, boolean>;
  /** RFC 9126 §6: authorization requests only through /oauth/par. */
  require_pushed_authorization_requests: ColumnType<boolean, boolean | undefined, boolean>;
  id_token_signed_response_alg: ColumnType<IdTokenAlg, IdTokenAlg | undefined, IdTokenAlg>;
  /** The FAPI 2.0 Security Profile (src/oauth/helpers/fapi.ts): PAR, PKCE, DPoP, private_key_jwt and short codes, together. */
  fapi2: ColumnType<boolean, boolean | undefined, boolean>;
  /** Type 'resource': the resource these are the credentials of. */
  resource_id: ColumnType<number | null, number | null | undefined, number | null>;
}

/**
 * One successful dynamic registration (RFC 7591): what the per-address limit counts, kept when
 * the client is deleted; purged an hour on. ip: the address, or an IPv6 address's /64
 * (src/lib/client-address.ts addressGroup).
 */
export interface ClientRegistrationsTable {
  id: Generated<number>;
  ip: string;
  created_at: Generated<Date>;
}

/** A resource a token may be for (RFC 8707), registered by the operator; orgauth's own API is not a row. */
export interface ResourcesTable {
  id: Generated<number>;
  /** Canonical form (helpers/resources.ts canonicalResourceUri). */
  uri: string;
  name: string;
  scopes: ColumnType<string[], string[] | undefined, string[]>;
  access_token_ttl: ColumnType<number, number | undefined, number>;
  /** Who may exchange a token for one to this resource (RFC 8693): resource URIs (canonical) and client ids. */
  exchange_from: ColumnType<string[], string[] | undefined, string[]>;
  created_at: Generated<Date>;
  updated_at: ColumnType<Date, Date | undefined, Date>;
}

export type DeviceAuthorizationStatus = 'pending' | 'approved' | 'denied' | 'consumed';

/** RFC 8628: a device's authorization request, decided by a user on /device. */
export interface DeviceAuthorizationsTable {
  id: Generated<number>;
  device_code_hash: string;
  user_code: string;
  application_id: number;
  resource_id: number | null;
  scopes: TextArray;
  identity_scopes: ColumnType<string[], string[] | undefined, string[]>;
  status: ColumnType<DeviceAuthorizationStatus, DeviceAuthorizationStatus | undefined, DeviceAuthorizationStatus>;
  user_id: number | null;
  organization_id: number | null;
  granted_scopes: string[] | null;
  auth_time: NullableTimestamp;
  amr: ColumnType<string[], string[] | undefined, string[]>;
  grant_id: number | null;
  interval_s: ColumnType<number, number | undefined, number>;
  last_polled_at: NullableTimestamp;
  expires_at: Timestamp;
  created_at: Generated<Date>;
  /** SS-4: the SSO connection the user signed in through (null: not through SSO). */
  sso_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
}

/** Why a grant (or an access token) was revoked: grants.revoked_reason, the audit log, the metrics. */
export type RevocationReason =
  | 'revoked_by_client'
  | 'revoked_by_user'
  /** By an organization's administrator: an application through the management API, or the operator's CLI. */
  | 'revoked_by_admin'
  | 'code_replay'
  | 'refresh_token_reuse'
  | 'application_disabled'
  | 'member_removed'
  | 'scopes_narrowed'
  /** A role change took a scope from the grant's user: the grant was replaced by a narrower one, or revoked when nothing was left. */
  | 'role_changed'
  /** An account whose address nobody had proved was taken over by its organization's identity provider (src/sso/identities.ts). */
  | 'account_reclaimed';

export interface GrantsTable {
  id: Generated<number>;
  organization_id: number;
  application_id: number;
  user_id: number | null;
  scopes: TextArray;
  /** The OpenID scopes granted (openid, profile, email): what the application learns about the user. */
  identity_scopes: ColumnType<string[], string[] | undefined, string[]>;
  /** When the user signed in for the authorization (the ID token's auth_time), and that browser session's sid. */
  auth_time: ColumnType<Date | null, Date | null | undefined, Date | null>;
  sid: ColumnType<string | null, string | null | undefined, string | null>;
  /** How the user signed in (RFC 8176 values: pwd, otp, hwk, swk, user, mfa). */
  amr: ColumnType<string[], string[] | undefined, string[]>;
  created_at: Generated<Date>;
  last_used_at: NullableTimestamp;
  revoked_at: NullableTimestamp;
  revoked_reason: string | null;
  /** The grant this one replaced when its user's role narrowed it (see narrowGrantsInTransaction). */
  narrowed_from_grant_id: ColumnType<number | null, number | null | undefined, number | null>;
  /** The resource its tokens are for (RFC 8707); null: orgauth's API. */
  resource_id: ColumnType<number | null, number | null | undefined, number | null>;
  /** RFC 9449: the thumbprint of the key the grant's tokens are bound to (its refresh needs a proof; a public client's, by that key). */
  dpop_jkt: ColumnType<string | null, string | null | undefined, string | null>;
  /** SS-4: the SSO connection the user signed in through (null: not through SSO). */
  sso_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
}

/** An access token revoked by itself (its grant lives on), kept until it expires. */
export interface RevokedAccessTokensTable {
  jti: string;
  organization_id: number;
  grant_id: number;
  expires_at: Date;
  revoked_at: Generated<Date>;
}

export interface AuthorizationCodesTable {
  id: Generated<number>;
  code_hash: string;
  organization_id: number;
  application_id: number;
  user_id: number;
  redirect_uri: string;
  scopes: TextArray;
  code_challenge: string | null;
  code_challenge_method: 'S256' | null;
  identity_scopes: ColumnType<string[], string[] | undefined, string[]>;
  /** OpenID Connect: the request's nonce, when the user signed in, and the browser session's sid (see grants). */
  nonce: ColumnType<string | null, string | null | undefined, string | null>;
  auth_time: ColumnType<Date | null, Date | null | undefined, Date | null>;
  sid: ColumnType<string | null, string | null | undefined, string | null>;
  /** How the user signed in (RFC 8176 values: pwd, otp, hwk, swk, user, mfa). */
  amr: ColumnType<string[], string[] | undefined, string[]>;
  expires_at: Timestamp;
  consumed_at: NullableTimestamp;
  grant_id: number | null;
  created_at: Generated<Date>;
  /** The resource asked for (RFC 8707); null: orgauth's API. */
  resource_id: ColumnType<number | null, number | null | undefined, number | null>;
  /** RFC 9449 §10: the key the code must be redeemed with (dpop_jkt, or the pushed request's proof). */
  dpop_jkt: ColumnType<string | null, string | null | undefined, string | null>;
  /** SS-4: the SSO connection the user signed in through (null: not through SSO). */
  sso_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
}

export interface RefreshTokensTable {
  id: Generated<number>;
  token_hash: string;
  organization_id: number;
  grant_id: number;
  parent_id: number | null;
  scopes: TextArray;
  expires_at: Timestamp;
  rotated_at: NullableTimestamp;
  revoked_at: NullableTimestamp;
  created_at: Generated<Date>;
}

export interface SigningKeysTable {
  kid: string;
  alg: 'ES256' | 'RS256' | 'EdDSA';
  public_jwk: Json<JWK>;
  private_jwk_encrypted: string;
  created_at: Generated<Date>;
  retired_at: NullableTimestamp;
}

export interface SessionsTable {
  /** A plain number naming the session in the account page's forms (the key is id_hash). */
  id: Generated<number>;
  id_hash: string;
  user_id: number;
  current_organization_id: number | null;
  created_at: Generated<Date>;
  last_seen_at: Generated<Date>;
  expires_at: Timestamp;
  /** What the request that signed in sent, cut to 512 characters. */
  user_agent: string | null;
  ip: string | null;
  /** The WebAuthn challenge given to this session (to register a passkey, or to step up with one), until used. */
  webauthn_challenge: ColumnType<string | null, string | null | undefined, string | null>;
  /** How the user signed in (RFC 8176 values: pwd, otp, hwk, swk, user, mfa, fed). */
  amr: ColumnType<string[], string[] | undefined, string[]>;
  /** The SSO connection the session was signed in through (ended with it). */
  sso_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
  /** The social connection the session was signed in through (ended when it is deleted). */
  social_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
}

/** A user's authenticator app (RFC 6238). Only a confirmed one is a second factor. */
export interface TotpFactorsTable {
  user_id: number;
  /** The base32 secret, sealed under a key derived from SECRET_KEY (lib/crypto.ts sealText). */
  secret_sealed: string;
  confirmed_at: NullableTimestamp;
  /** The newest time step accepted: codes of that step or older are refused (used once). */
  last_step: number | null;
  /** SHA-256 of the session that started the enrolment: only it sees the key and confirms it. */
  started_session_hash: string | null;
  created_at: Generated<Date>;
}

/** A single-use recovery code: only its HMAC-SHA256 under a key derived from SECRET_KEY. */
export interface RecoveryCodesTable {
  id: Generated<number>;
  user_id: number;
  code_hash: string;
  used_at: NullableTimestamp;
  created_at: Generated<Date>;
}

/** A WebAuthn credential (passkey) registered by a user. */
export interface PasskeysTable {
  id: Generated<number>;
  user_id: number;
  /** The credential's id, base64url. */
  credential_id: string;
  /** The COSE public key. */
  public_key: Uint8Array;
  sign_count: ColumnType<number, number | undefined, number>;
  transports: ColumnType<string[], string[] | undefined, string[]>;
  /** Whether the authenticator said the credential is synced (a "multi-device" passkey). */
  backed_up: ColumnType<boolean, boolean | undefined, boolean>;
  name: string;
  created_at: Generated<Date>;
  last_used_at: NullableTimestamp;
}

/** A browser between its first step (password, or none for a passkey) and its second: not a session. */
export interface PendingSignInsTable {
  id_hash: string;
  /** Null for a passwordless passkey sign-in: the passkey says who it is when it finishes. */
  user_id: number | null;
  amr: ColumnType<string[], string[] | undefined, string[]>;
  return_to: string;
  /** The WebAuthn challenge this browser was given, until it is used. */
  challenge: string | null;
  /** The social connection the first step was made through: the session after the second step keeps it. */
  social_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
  created_at: Generated<Date>;
  expires_at: Timestamp;
}

/** A user's own security log (audit/events.ts recordAccountEvent): never secrets. */
export interface AccountEventsTable {
  id: Generated<number>;
  user_id: number;
  action: string;
  details: Json<Record<string, unknown>>;
  created_at: Generated<Date>;
}

export interface SecondStepFailuresTable {
  id: Generated<number>;
  user_id: number;
  failed_at: Generated<Date>;
}

export interface AuditEventsTable {
  id: Generated<number>;
  organization_id: number;
  actor_user_id: number | null;
  actor_client_id: string | null;
  action: string;
  details: Json<Record<string, unknown>>;
  created_at: Generated<Date>;
}

export interface ContactsTable {
  id: Generated<number>;
  organization_id: number;
  name: string;
  email: string | null;
  phone: string | null;
  company: string | null;
  notes: string | null;
  created_at: Generated<Date>;
  updated_at: Timestamp;
}

export interface TasksTable {
  id: Generated<number>;
  organization_id: number;
  title: string;
  description: string | null;
  status: ColumnType<TaskStatus, TaskStatus | undefined, TaskStatus>;
  due_on: string | null;
  contact_id: number | null;
  completed_at: NullableTimestamp;
  created_at: Generated<Date>;
  updated_at: Timestamp;
}

export type SsoProtocol = 'oidc' | 'saml';
export type SsoConnectionState = 'draft' | 'active' | 'disabled';

/** An organization's own identity provider (src/sso/connections.ts). */
export interface SsoConnectionsTable {
  id: Generated<number>;
  organization_id: number;
  protocol: SsoProtocol;
  name: string;
  state: ColumnType<SsoConnectionState, SsoConnectionState | undefined, SsoConnectionState>;
  /** Whether a first sign-in of someone unknown makes the user and the membership. */
  jit: ColumnType<boolean, boolean | undefined, boolean>;
  /** The role JIT gives: a built-in role, or 'custom' with default_role_id. */
  default_role: ColumnType<RoleKind, RoleKind | undefined, RoleKind>;
  default_role_id: ColumnType<number | null, number | null | undefined, number | null>;
  oidc_issuer: ColumnType<string | null, string | null | undefined, string | null>;
  oidc_client_id: ColumnType<string | null, string | null | undefined, string | null>;
  /** Sealed under a key derived from SECRET_KEY (lib/crypto.ts sealText). */
  oidc_client_secret_sealed: ColumnType<string | null, string | null | undefined, string | null>;
  oidc_scopes: ColumnType<string | null, string | null | undefined, string | null>;
  saml_idp_entity_id: ColumnType<string | null, string | null | undefined, string | null>;
  saml_idp_sso_url: ColumnType<string | null, string | null | undefined, string | null>;
  /** PEM certificates; a response signed by any of them is accepted (rotation). */
  saml_idp_certificates: ColumnType<string[], string[] | undefined, string[]>;
  saml_idp_initiated: ColumnType<boolean, boolean | undefined, boolean>;
  /** Whether it may link an existing account by its verified email without the account's proof (trust set by an owner or the operator). */
  links_existing_accounts: ColumnType<boolean, boolean | undefined, boolean>;
  created_at: Generated<Date>;
  updated_at: Generated<Date>;
}

/** A domain an organization claims; only a verified one routes, provisions or links (src/sso/domains.ts). */
export interface SsoDomainsTable {
  id: Generated<number>;
  organization_id: number;
  domain: string;
  state: ColumnType<'pending' | 'verified', 'pending' | 'verified' | undefined, 'pending' | 'verified'>;
  /** What the TXT record `_orgauth-challenge.<domain>` must hold. */
  verification_token: string;
  sso_required: ColumnType<boolean, boolean | undefined, boolean>;
  verified_at: NullableTimestamp;
  checked_at: NullableTimestamp;
  created_at: Generated<Date>;
}

/** A user's identity at one connection (src/sso/identities.ts). */
export interface SsoIdentitiesTable {
  id: Generated<number>;
  connection_id: number;
  user_id: number;
  /** OIDC: the iss; SAML: the IdP's entity ID. */
  issuer: string;
  /** SAML: the NameID Format; OIDC: ''. */
  subject_format: string;
  /** OIDC: sub; SAML: the NameID. */
  subject: string;
  email: string | null;
  created_at: Generated<Date>;
  last_used_at: Generated<Date>;
}

/** A sign-in in flight at an identity provider (src/sso/sign-ins.ts). */
export interface SsoSignInsTable {
  id: Generated<number>;
  handle_hash: string;
  /** The SSO connection, or (social_connection_id) the social one: exactly one. */
  connection_id: ColumnType<number | null, number | null | undefined, number | null>;
  social_connection_id: ColumnType<number | null, number | null | undefined, number | null>;
  browser_hash: string | null;
  return_to: string;
  oidc_nonce: ColumnType<string | null, string | null | undefined, string | null>;
  oidc_code_verifier_sealed: ColumnType<string | null, string | null | undefined, string | null>;
  saml_request_id: ColumnType<string | null, string | null | undefined, string | null>;
  result: ColumnType<unknown, string | null | undefined, string | null>;
  created_at: Generated<Date>;
  expires_at: Timestamp;
  consumed_at: NullableTimestamp;
}

export type SocialProvider = 'google' | 'microsoft' | 'github' | 'oidc';
export type SocialConnectionState = 'enabled' | 'disabled';

/** A social sign-in the operator set up for the whole instance (src/social/connections.ts; migration 0030). */
export interface SocialConnectionsTable {
  id: Generated<number>;
  provider: SocialProvider;
  /** What the sign-in page's button names ("Continue with Google"). */
  name: string;
  state: ColumnType<SocialConnectionState, SocialConnectionState | undefined, SocialConnectionState>;
  client_id: string;
  client_secret_sealed: string;
  /** google, microsoft, oidc: where the provider is discovered (microsoft: without the tenant). */
  issuer: string | null;
  /** microsoft: common, organizations, consumers or one tenant id. */
  tenant: string | null;
  /** github: github.com or a GitHub Enterprise Server. */
  base_url: string | null;
  /** When not empty, only addresses in these domains sign in. */
  allowed_domains: ColumnType<string[], string[] | undefined, string[]>;
  created_at: Generated<Date>;
  updated_at: Generated<Date>;
}

/** A user's identity at a social connection, by the provider's subject (src/social/identities.ts). */
export interface SocialIdentitiesTable {
  id: Generated<number>;
  connection_id: number;
  user_id: number;
  subject: string;
  email: string | null;
  created_at: Generated<Date>;
  last_used_at: Generated<Date>;
}

/** Who an organization removed: just-in-time provisioning never adds them back. */
export interface RemovedMembersTable {
  organization_id: number;
  user_id: number;
  /** The latest removal: tokens and grants from before it are ended (a job revokes the grants). */
  removed_at: Generated<Date>;
  /** When an admin or an invitation added them back since; null: still removed. */
  restored_at: NullableTimestamp;
}

/** RFC 9126: a pushed authorization request, its request_uri's digest, usable 60 s until first used and for one code. */
export interface PushedAuthorizationRequestsTable {
  id: Generated<number>;
  request_uri_hash: string;
  application_id: number;
  params: Json<Record<string, string>>;
  dpop_jkt: string | null;
  expires_at: Timestamp;
  first_used_at: NullableTimestamp;
  consumed_at: NullableTimestamp;
  created_at: Generated<Date>;
}

/**
 * The replay store (RFC 9449 §11.1, RFC 7523 §3 point 7): a DPoP proof's key thumbprint and jti,
 * or a client assertion's client and jti, until it could no longer be accepted. UNLOGGED.
 */
export interface SeenJtisTable {
  key: string;
  expires_at: Timestamp;
}

/** SAML replay store: an assertion ID seen, kept until its NotOnOrAfter. */
export interface SamlAssertionIdsTable {
  id: Generated<number>;
  connection_id: number;
  assertion_id: string;
  expires_at: Timestamp;
}

/** A built-in role a directory may give (never owner). */
export type DirectoryRole = 'admin' | 'member' | 'viewer';

export interface DirectoriesTable {
  id: Generated<number>;
  organization_id: number;
  name: string;
  state: ColumnType<'active' | 'disabled', 'active' | 'disabled' | undefined, 'active' | 'disabled'>;
  default_role: ColumnType<DirectoryRole, DirectoryRole | undefined, DirectoryRole>;
  /** SHA-256 (hex) of the bearer token; the token itself is shown once. */
  token_hash: string;
  token_created_at: Timestamp;
  created_at: Generated<Date>;
  updated_at: Timestamp;
}

export interface DirectoryGroupRolesTable {
  directory_id: number;
  /** A SCIM group's displayName or id, compared without case. */
  group_ref: string;
  role: DirectoryRole;
}

/** A SCIM User a directory pushed, linked to the account it created or claimed (migration 0026). */
export interface DirectoryUsersTable {
  /** The SCIM id (a UUID orgauth assigns). */
  id: Generated<string>;
  /** List order and keyset cursor. */
  seq: Generated<number>;
  directory_id: number;
  user_id: number;
  user_name: string;
  external_id: string | null;
  display_name: string | null;
  active: ColumnType<boolean, boolean | undefined, boolean>;
  /** The rest of the representation as the client sent it (without id, meta, groups). */
  resource: ColumnType<Record<string, unknown>, string, string>;
  /** The role the directory last gave; null for an owner, whom a directory never changes. */
  role: DirectoryRole | null;
  /** The ETag, W/"<version>"; bumped by each change. */
  version: ColumnType<number, number | undefined, number>;
  created_at: Generated<Date>;
  updated_at: Timestamp;
}

/** A SCIM Group a directory pushed. */
export interface DirectoryGroupsTable {
  id: Generated<string>;
  seq: Generated<number>;
  directory_id: number;
  display_name: string;
  external_id: string | null;
  version: ColumnType<number, number | undefined, number>;
  created_at: Generated<Date>;
  updated_at: Timestamp;
}

export interface DirectoryGroupMembersTable {
  group_id: string;
  /** directory_users.id */
  user_id: string;
}

/** A SCIM request a directory received, for the Directory page (never the token or a body). */
export interface DirectoryRequestsTable {
  id: Generated<number>;
  directory_id: number;
  method: string;
  path: string;
  status: number;
  scim_type: string | null;
  created_at: Generated<Date>;
}

export interface Database {
  users: UsersTable;
  organizations: OrganizationsTable;
  memberships: MembershipsTable;
  roles: RolesTable;
  applications: ApplicationsTable;
  client_registrations: ClientRegistrationsTable;
  grants: GrantsTable;
  authorization_codes: AuthorizationCodesTable;
  resources: ResourcesTable;
  device_authorizations: DeviceAuthorizationsTable;
  refresh_tokens: RefreshTokensTable;
  revoked_access_tokens: RevokedAccessTokensTable;
  signing_keys: SigningKeysTable;
  sessions: SessionsTable;
  audit_events: AuditEventsTable;
  contacts: ContactsTable;
  tasks: TasksTable;
  account_tokens: AccountTokensTable;
  invitations: InvitationsTable;
  pending_sign_ups: PendingSignUpsTable;
  sign_up_attempts: SignUpAttemptsTable;
  mail_outbox: MailOutboxTable;
  totp_factors: TotpFactorsTable;
  recovery_codes: RecoveryCodesTable;
  passkeys: PasskeysTable;
  pending_sign_ins: PendingSignInsTable;
  second_step_failures: SecondStepFailuresTable;
  account_events: AccountEventsTable;
  sso_connections: SsoConnectionsTable;
  sso_domains: SsoDomainsTable;
  sso_identities: SsoIdentitiesTable;
  sso_sign_ins: SsoSignInsTable;
  social_connections: SocialConnectionsTable;
  social_identities: SocialIdentitiesTable;
  saml_assertion_ids: SamlAssertionIdsTable;
  removed_members: RemovedMembersTable;
  jobs: JobsTable;
  webhook_endpoints: WebhookEndpointsTable;
  webhook_events: WebhookEventsTable;
  webhook_deliveries: WebhookDeliveriesTable;
  webhook_attempts: WebhookAttemptsTable;
  pushed_authorization_requests: PushedAuthorizationRequestsTable;
  seen_jtis: SeenJtisTable;
  activity_daily: ActivityDailyTable;
  directories: DirectoriesTable;
  directory_group_roles: DirectoryGroupRolesTable;
  directory_users: DirectoryUsersTable;
  directory_groups: DirectoryGroupsTable;
  directory_group_members: DirectoryGroupMembersTable;
  directory_requests: DirectoryRequestsTable;
  setup_links: SetupLinksTable;
}

export type User = Selectable<UsersTable>;
export type NewUser = Insertable<UsersTable>;
export type Organization = Selectable<OrganizationsTable>;
export type Membership = Selectable<MembershipsTable>;
export type Application = Selectable<ApplicationsTable>;
/** An application a developer registered: it belongs to their organization (management API, dashboard, CLI). */
export type DeveloperApplication = Application & { organization_id: number; type: 'public' | 'private' };

/** Whether an application belongs to an organization (anything but a self-registered client). */
export function isDeveloperApplication(application: Application): application is DeveloperApplication {
  // A resource's credentials (type 'resource') belong to no organization either (migration 0029).
  return application.organization_id !== null && application.type !== 'resource';
}
export type NewApplication = Insertable<ApplicationsTable>;
export type ApplicationUpdate = Updateable<ApplicationsTable>;
export type Grant = Selectable<GrantsTable>;
export type SigningKey = Selectable<SigningKeysTable>;
export type AuditEvent = Selectable<AuditEventsTable>;
export type Contact = Selectable<ContactsTable>;
export type Task = Selectable<TasksTable>;
export type Invitation = Selectable<InvitationsTable>;
export type CustomRole = Selectable<RolesTable>;
export type Passkey = Selectable<PasskeysTable>;
export type SsoConnection = Selectable<SsoConnectionsTable>;
export type SsoDomain = Selectable<SsoDomainsTable>;

/** A link an owner gives a customer's IT admin to set up domains, SSO and directories (migration 0027; accounts/setup-links.ts). */
export interface SetupLinksTable {
  id: Generated<number>;
  organization_id: number;
  /** A non-empty subset of 'domains', 'sso', 'directory'. */
  features: TextArray;
  /** SHA-256 (hex) of the token in the link's URL; the token itself is shown once. */
  token_hash: string;
  /** The owner who made it; null when the operator did (the CLI). */
  created_by_user_id: number | null;
  created_at: Generated<Date>;
  expires_at: Timestamp;
  revoked_at: NullableTimestamp;
  last_used_at: NullableTimestamp;
}
