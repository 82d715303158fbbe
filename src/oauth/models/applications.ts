import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { z } from 'zod';
import { type Actor, recordAuditEvent } from '../../audit/events.js';
import { type DB, inTransaction } from '../../db/connect.js';
import { isForeignKeyViolation } from '../../db/errors.js';
import {
  type Application,
  type ApplicationType,
  type DeveloperApplication,
  ID_TOKEN_ALGS,
  type IdTokenAlg,
  type RevocationReason,
  type TokenEndpointAuthMethod,
} from '../../db/schema.js';
import { clientKeysProblem, publicJwksSchema } from '../helpers/client-assertion.js';
import { ConflictError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';
import { isWellFormed, parseInput } from '../../lib/validate.js';
import { redirectUriListSchema } from '../helpers/redirect-uris.js';
import { countLiveGrants, revokeBatch, type RevokedGrantsMemory } from './grants.js';
import { enqueueJob, type JobHandler } from '../../jobs/queue.js';
import { applicationScopes, knownScopesOf } from '../helpers/scopes.js';
import { declaredScopeNames } from './resources.js';

// Validated under the names clients send (API bodies, CLI JSON), so that error details name them.
const nameSchema = z
  .string()
  .trim()
  .min(1, 'must not be empty')
  .max(200, 'must be at most 200 characters')
  .refine((v) => isWellFormed(v) && !v.includes('\u0000'), 'must be well-formed Unicode without NUL characters');
const redirectUrisSchema = redirectUriListSchema('redirect URIs');
const postLogoutRedirectUrisSchema = redirectUriListSchema('post-logout redirect URIs');
const typeSchema = z.enum(['public', 'private'], { error: 'must be public or private' });

/**
 * Public applications redirect users back and need a redirect URI; private ones never redirect
 * (and PKCE is for redirects), nor sign anyone in, so they have no post-logout redirect URIs.
 */
const shapeSchema = z
  .object({ type: typeSchema, redirect_uris: z.array(z.string()), post_logout_redirect_uris: z.array(z.string()), require_pkce: z.boolean() })
  .superRefine((app, ctx) => {
    if (app.type === 'public' && app.redirect_uris.length === 0) {
      ctx.addIssue({ code: 'custom', path: ['redirect_uris'], message: 'a public application needs at least one redirect URI' });
    }
    if (app.type === 'private' && app.redirect_uris.length > 0) {
      ctx.addIssue({ code: 'custom', path: ['redirect_uris'], message: 'a private application has no redirect URIs (it uses client_credentials)' });
    }
    if (app.type === 'private' && app.post_logout_redirect_uris.length > 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['post_logout_redirect_uris'],
        message: 'a private application has no post-logout redirect URIs (it uses client_credentials)',
      });
    }
    if (app.type === 'private' && app.require_pkce) {
      ctx.addIssue({ code: 'custom', path: ['require_pkce'], message: 'PKCE applies to public applications only' });
    }
  });

const newApplicationSchema = z.object({
  organization_id: z.number().int().positive(),
  type: typeSchema,
  name: nameSchema,
  redirect_uris: redirectUrisSchema.default([]),
  post_logout_redirect_uris: postLogoutRedirectUrisSchema.default([]),
  require_pkce: z.boolean().default(false),
});

export interface NewApplicationInput {
  organizationId: number;
  type: ApplicationType;
  name: string;
  redirectUris?: string[];
  /** Where RP-initiated logout may send the browser afterwards (public applications only); none when omitted. */
  postLogoutRedirectUris?: string[];
  /** Space-separated or a list; the data scopes when omitted. Management scopes: private applications only (AD-1). */
  scopes?: string | string[];
  requirePkce?: boolean;
  actor?: Actor;
}

/** What leaves the server about an application, plus its secret the one time it is known. */
export interface ApplicationWithSecret {
  client_id: string;
  client_secret: string;
  type: ApplicationType;
  organization_id: number;
  name: string;
  redirect_uris: string[];
  post_logout_redirect_uris: string[];
  scopes: string[];
}

/** What every client id we issue looks like (see newClientId). */
export const CLIENT_ID_PATTERN = /^[0-9a-f]{32}$/;
/** The longest client ID metadata document URL we look at. */
export const MAX_CLIENT_ID_URL_LENGTH = 2000;

/**
 * Whether `clientId` could name a client of ours: one we issued, or the https URL of a client ID
 * metadata document. Anything else is answered without a query (and without a throttle entry).
 */
export function isClientIdShape(clientId: string): boolean {
  return CLIENT_ID_PATTERN.test(clientId) || (clientId.startsWith('https://') && clientId.length <= MAX_CLIENT_ID_URL_LENGTH && !/[\s\x00-\x1f\x7f]/.test(clientId));
}

/**
 * 128 random bits in hex: public, but unguessable, and safe wherever it goes (a URL, a Basic
 * header, a shell argument: base64url could start with "-" and read as an option).
 */
export function newClientId(): string {
  return randomBytes(16).toString('hex');
}

/** A new client secret and the SHA-256 digest the database keeps of it. */
export function newClientSecret(): { secret: string; hash: string } {
  const secret = generateSecret(32);
  return { secret, hash: sha256Hex(secret) };
}

/**
 * Registers an application. The client secret is returned here and never again: the database
 * keeps only its SHA-256 digest.
 */
export async function createApplication(db: DB, input: NewApplicationInput): Promise<ApplicationWithSecret> {
  const app = parseInput(newApplicationSchema, {
    organization_id: input.organizationId,
    type: input.type,
    name: input.name,
    redirect_uris: input.redirectUris,
    post_logout_redirect_uris: input.postLogoutRedirectUris,
    require_pkce: input.requirePkce,
  });
  parseInput(shapeSchema, app);
  const scopes = applicationScopes(app.type, input.scopes, app.type === 'private' ? await declaredScopeNames(db) : undefined);
  const { secret, hash } = newClientSecret();
  try {
    return await inTransaction(db, async (trx) => {
      const row = await trx
        .insertInto('applications')
        .values({
          organization_id: app.organization_id,
          client_id: newClientId(),
          client_secret_hash: hash,
          type: app.type,
          name: app.name,
          redirect_uris: app.redirect_uris,
          post_logout_redirect_uris: app.post_logout_redirect_uris,
          scopes,
          require_pkce: app.require_pkce,
          grant_types: app.type === 'private' ? ['client_credentials'] : ['authorization_code', 'refresh_token'],
        })
        .returning(['client_id', 'type', 'name', 'redirect_uris', 'post_logout_redirect_uris', 'scopes'])
        .executeTakeFirstOrThrow()
        .then((r) => ({ ...r, organization_id: app.organization_id }));
      await recordAuditEvent(trx, {
        organizationId: row.organization_id,
        action: 'application.created',
        actor: input.actor,
        details: { client_id: row.client_id, type: row.type, name: row.name, scopes },
      });
      return { ...row, client_secret: secret };
    });
  } catch (err) {
    if (isForeignKeyViolation(err)) throw new NotFoundError(`organization ${app.organization_id} not found`);
    throw err;
  }
}

export async function findApplicationByClientId(db: DB, clientId: string): Promise<Application | undefined> {
  return db.selectFrom('applications').selectAll().where('client_id', '=', clientId).executeTakeFirst();
}

/** Replaces an application's secret; the old one stops working as soon as this commits (and at once on this instance). */
export async function rotateClientSecret(
  db: DB,
  application: Pick<DeveloperApplication, 'organization_id' | 'client_id'>,
  options: ChangeOptions = {},
): Promise<{ client_id: string; client_secret: string }> {
  const { secret, hash } = newClientSecret();
  const rotated = await inTransaction(db, async (trx) => {
    // An application on keys (private_key_jwt) goes back to a secret, its keys forgotten; not one under FAPI 2.0, which needs keys.
    const row = await trx
      .updateTable('applications')
      .set({
        client_secret_hash: hash,
        token_endpoint_auth_method: sql`case when token_endpoint_auth_method = 'private_key_jwt' then 'client_secret_basic' else token_endpoint_auth_method end`,
        jwks: null,
        jwks_uri: null,
        secret_rotated_at: sql`now()`,
        updated_at: sql`now()`,
      })
      .where('organization_id', '=', application.organization_id)
      .where('client_id', '=', application.client_id)
      .returning(['client_id', 'fapi2'])
      .executeTakeFirst();
    if (!row) throw new NotFoundError(`no application with client_id ${application.client_id}`);
    if (row.fapi2) throw new ConflictError('a FAPI 2.0 application authenticates with private_key_jwt and has no secret; turn the profile off first');
    await recordAuditEvent(trx, { actor: options.actor, organizationId: application.organization_id, action: 'application.secret_rotated', details: { client_id: row.client_id } });
    return { client_id: row.client_id, client_secret: secret };
  });
  options.applications?.forget(application.client_id);
  return rotated;
}

/**
 * What a change to applications or grants tells besides the database: who made it (for the
 * audit log), and this instance's caches, so that its own API and token endpoint see the change
 * at once. Other instances hear of it by NOTIFY within milliseconds, and within a second by
 * polling and cache age (README, "Running several instances").
 */
export interface ChangeOptions {
  actor?: Actor | undefined;
  /** A jwks_uri may be plain http (development: the instance's outbound policy allows it). */
  allowHttp?: boolean | undefined;
  revocations?: RevokedGrantsMemory | undefined;
  applications?: { forget(clientId: string): void } | undefined;
}

/** An organization's applications in id order, a page at a time (keyset on the (organization_id, id) index). */
export async function listApplications(db: DB, organizationId: number, page: { afterId: number; limit: number }): Promise<DeveloperApplication[]> {
  return (await db
    .selectFrom('applications')
    .selectAll()
    .where('organization_id', '=', organizationId)
    .where('deleted_at', 'is', null)
    .where('id', '>', page.afterId)
    .orderBy('id')
    .limit(page.limit)
    .execute()) as DeveloperApplication[];
}

/** An application of the organization, or NotFoundError: another organization's is as missing as an unknown one. */
export async function getApplication(db: DB, organizationId: number, clientId: string | undefined): Promise<DeveloperApplication> {
  const application =
    clientId === undefined || !CLIENT_ID_PATTERN.test(clientId)
      ? undefined
      : await db
          .selectFrom('applications')
          .selectAll()
          .where('organization_id', '=', organizationId)
          .where('client_id', '=', clientId)
          .where('deleted_at', 'is', null)
          .executeTakeFirst();
  if (!application) throw new NotFoundError('no such application in this organization');
  return application as DeveloperApplication;
}

/** How many live grants of the application hold a scope outside `scopes` (what narrowing to them revokes). */
export async function countGrantsBeyond(db: DB, application: Pick<DeveloperApplication, 'id' | 'organization_id' | 'type'>, scopes: readonly string[]): Promise<number> {
  const row = await db
    .selectFrom('grants')
    .select((eb) => eb.fn.countAll<number>().as('n'))
    .where('organization_id', '=', application.organization_id)
    .where('application_id', '=', application.id)
    .where('revoked_at', 'is', null)
    // As the narrowing counts them: a private application's own grants by every scope, a public one's by orgauth's (its users granted a resource's declared scopes).
    .where(sql<boolean>`not (${application.type === 'private' ? sql<string[]>`scopes` : knownScopesOf(sql`scopes`)} <@ ${[...scopes]}::text[])`)
    .executeTakeFirstOrThrow();
  return Number(row.n);
}

/** What may change about an application; absent fields stay as they are. */
export interface ApplicationChanges {
  name?: string | undefined;
  redirectUris?: readonly string[] | undefined;
  postLogoutRedirectUris?: readonly string[] | undefined;
  /** Space-separated or a list. */
  scopes?: string | readonly string[] | undefined;
  requirePkce?: boolean | undefined;
  disabled?: boolean | undefined;
  /** RFC 7591 token_endpoint_auth_method: a secret's two ways, or private_key_jwt (with jwks or jwksUri). Back to a secret: rotate it (rotateClientSecret). */
  tokenEndpointAuthMethod?: DeveloperAuthMethod | undefined;
  /** The client's public keys for private_key_jwt, inline (null: none); setting it clears jwksUri. */
  jwks?: unknown;
  /** Or where they are published (fetched through the guarded outbound client); setting it clears jwks. */
  jwksUri?: string | null | undefined;
  dpopBoundAccessTokens?: boolean | undefined;
  requirePushedAuthorizationRequests?: boolean | undefined;
  idTokenSignedResponseAlg?: IdTokenAlg | undefined;
  /** The FAPI 2.0 profile (helpers/fapi.ts); needs private_key_jwt. */
  fapi2?: boolean | undefined;
}

/** How a developer's application may authenticate (none is for clients that registered themselves). */
export const DEVELOPER_AUTH_METHODS = ['client_secret_basic', 'client_secret_post', 'private_key_jwt'] as const;
export type DeveloperAuthMethod = (typeof DEVELOPER_AUTH_METHODS)[number];

const changesSchema = z.object({
  name: nameSchema.optional(),
  redirect_uris: redirectUrisSchema.optional(),
  post_logout_redirect_uris: postLogoutRedirectUrisSchema.optional(),
  require_pkce: z.boolean().optional(),
  disabled: z.boolean().optional(),
  token_endpoint_auth_method: z.enum(DEVELOPER_AUTH_METHODS, { error: `must be one of ${DEVELOPER_AUTH_METHODS.join(', ')}` }).optional(),
  jwks: publicJwksSchema.nullable().optional(),
  jwks_uri: z.string().nullable().optional(),
  dpop_bound_access_tokens: z.boolean().optional(),
  require_pushed_authorization_requests: z.boolean().optional(),
  id_token_signed_response_alg: z.enum(ID_TOKEN_ALGS, { error: `must be one of ${ID_TOKEN_ALGS.join(', ')}` }).optional(),
  fapi2: z.boolean().optional(),
});

/** The high-assurance settings as they would be after a change: consistent, or a validation error naming the field. */
function checkAssurance(
  type: ApplicationType,
  next: {
    token_endpoint_auth_method: TokenEndpointAuthMethod;
    jwks: unknown;
    jwks_uri: string | null;
    require_pushed_authorization_requests: boolean;
    fapi2: boolean;
  },
  current: { token_endpoint_auth_method: TokenEndpointAuthMethod },
  options: { allowHttp: boolean },
): void {
  const problem = (path: string, message: string) => {
    throw new InvalidRequestError(`${path}: ${message}`, { details: [{ path, message }] });
  };
  const keys = clientKeysProblem(next.token_endpoint_auth_method, next.jwks, next.jwks_uri, options);
  if (keys !== null) problem(keys.path, keys.message);
  if (current.token_endpoint_auth_method === 'private_key_jwt' && next.token_endpoint_auth_method !== 'private_key_jwt') {
    problem('token_endpoint_auth_method', 'to go back to a client secret, rotate the secret (the new one is shown once)');
  }
  if (type === 'private' && next.require_pushed_authorization_requests) {
    problem('require_pushed_authorization_requests', 'pushed authorization requests apply to public applications only');
  }
  if (next.fapi2 && next.token_endpoint_auth_method !== 'private_key_jwt') {
    problem('fapi2', 'the FAPI 2.0 profile needs private_key_jwt client authentication: register jwks or jwks_uri and set token_endpoint_auth_method');
  }
}

/**
 * Changes an application of its organization, audited, and queues the revocation of what it may
 * no longer have: when disabled, every live grant (`application_disabled`); when its scopes
 * were narrowed, those holding a scope it no longer has (`scopes_narrowed`). The row is locked
 * and the change computed from it as it is, so a concurrent change is not undone. The change
 * takes effect at once: no new grant gets what was taken away (createGrant and code redemption
 * check the application as it is), and every instance refuses such tokens within the
 * application cache's 500 ms, because the API checks each token against its application
 * (access-tokens.ts). The revocations themselves, which may be a million, are a job
 * (applicationGrantsJob) queued in the same transaction: the request does not wait for them,
 * and an instance that dies midway leaves them to another. Returns the application as it now is.
 */
export async function updateApplication(db: DB, application: DeveloperApplication, changes: ApplicationChanges, options: ChangeOptions = {}): Promise<DeveloperApplication> {
  const valid = parseInput(changesSchema, {
    name: changes.name,
    redirect_uris: changes.redirectUris,
    post_logout_redirect_uris: changes.postLogoutRedirectUris,
    require_pkce: changes.requirePkce,
    disabled: changes.disabled,
    token_endpoint_auth_method: changes.tokenEndpointAuthMethod,
    jwks: changes.jwks,
    jwks_uri: changes.jwksUri,
    dpop_bound_access_tokens: changes.dpopBoundAccessTokens,
    require_pushed_authorization_requests: changes.requirePushedAuthorizationRequests,
    id_token_signed_response_alg: changes.idTokenSignedResponseAlg,
    fapi2: changes.fapi2,
  });
  const scopes = changes.scopes === undefined ? undefined : applicationScopes(application.type, changes.scopes, application.type === 'private' ? await declaredScopeNames(db) : undefined);
  const updated = await inTransaction(db, async (trx) => {
    const current = await trx
      .selectFrom('applications')
      .selectAll()
      .where('organization_id', '=', application.organization_id)
      .where('id', '=', application.id)
      .where('deleted_at', 'is', null)
      .forUpdate()
      .executeTakeFirst();
    if (!current) throw new NotFoundError('no such application in this organization');
    const next = {
      name: valid.name ?? current.name,
      redirect_uris: valid.redirect_uris ?? current.redirect_uris,
      post_logout_redirect_uris: valid.post_logout_redirect_uris ?? current.post_logout_redirect_uris,
      scopes: scopes ?? current.scopes,
      require_pkce: valid.require_pkce ?? current.require_pkce,
      disabled: valid.disabled ?? current.disabled,
      token_endpoint_auth_method: valid.token_endpoint_auth_method ?? current.token_endpoint_auth_method,
      // One of the two: setting either clears the other.
      jwks: valid.jwks !== undefined ? valid.jwks : valid.jwks_uri != null ? null : current.jwks,
      jwks_uri: valid.jwks_uri !== undefined ? valid.jwks_uri : valid.jwks != null ? null : current.jwks_uri,
      dpop_bound_access_tokens: valid.dpop_bound_access_tokens ?? current.dpop_bound_access_tokens,
      require_pushed_authorization_requests: valid.require_pushed_authorization_requests ?? current.require_pushed_authorization_requests,
      id_token_signed_response_alg: valid.id_token_signed_response_alg ?? current.id_token_signed_response_alg,
      fapi2: valid.fapi2 ?? current.fapi2,
    };
    parseInput(shapeSchema, { type: current.type, ...next });
    checkAssurance(current.type, next, current, { allowHttp: options.allowHttp ?? false });
    const edited = Object.fromEntries(
      (
        [
          'name', 'redirect_uris', 'post_logout_redirect_uris', 'scopes', 'require_pkce', 'token_endpoint_auth_method', 'jwks', 'jwks_uri',
          'dpop_bound_access_tokens', 'require_pushed_authorization_requests', 'id_token_signed_response_alg', 'fapi2',
        ] as const
      )
        .filter((k) => JSON.stringify(next[k]) !== JSON.stringify(current[k]))
        .map((k) => [k, next[k]]),
    );
    const toggled = next.disabled !== current.disabled;
    if (Object.keys(edited).length === 0 && !toggled) return current as DeveloperApplication;
    // Keys instead of a secret: the secret stops working with this change.
    const toKeys = edited.token_endpoint_auth_method === 'private_key_jwt';
    const { jwks: editedJwks, ...rest } = edited;
    const row = (await trx
      .updateTable('applications')
      .set({
        ...rest,
        ...(editedJwks !== undefined ? { jwks: editedJwks === null ? null : JSON.stringify(editedJwks) } : {}),
        ...(toKeys ? { client_secret_hash: null } : {}),
        ...(toggled ? { disabled: next.disabled } : {}),
        updated_at: sql`now()`,
      })
      .where('organization_id', '=', current.organization_id)
      .where('id', '=', current.id)
      .returningAll()
      .executeTakeFirstOrThrow()) as DeveloperApplication;
    const audit = (action: string, details: Record<string, unknown>) =>
      recordAuditEvent(trx, { actor: options.actor, organizationId: application.organization_id, action, details: { client_id: current.client_id, ...details } });
    if (Object.keys(edited).length > 0) await audit('application.updated', edited);
    if (toggled) await audit(next.disabled ? 'application.disabled' : 'application.enabled', {});
    const narrowed = edited.scopes !== undefined && current.scopes.some((s) => !next.scopes.includes(s));
    const mode = row.disabled && toggled ? 'disabled' : !row.disabled && narrowed ? 'narrowed' : undefined;
    if (mode) await queueGrantRevocation(trx, row, mode, options.actor);
    return row;
  });
  options.applications?.forget(application.client_id);
  return updated;
}

/**
 * Deletes an application: at once it is disabled and gone from every list and lookup of its
 * organization (audited as deleted), so it gets no new grant and every instance refuses its
 * tokens within the application cache's 500 ms; a job then revokes and publishes its grants. The
 * row stays behind as a tombstone holding those revoked grants (the audit trail of what it was
 * given, as for every revoked grant), and its client_id is never issued again.
 */
export async function deleteApplication(db: DB, application: DeveloperApplication, options: ChangeOptions = {}): Promise<void> {
  await inTransaction(db, async (trx) => {
    // Of two deletions at once, one deletes and audits; the other finds nothing (404).
    const deleted = await trx
      .updateTable('applications')
      .set({ disabled: true, deleted_at: sql`now()`, updated_at: sql`now()` })
      .where('organization_id', '=', application.organization_id)
      .where('id', '=', application.id)
      .where('deleted_at', 'is', null)
      .returningAll()
      .executeTakeFirst();
    if (!deleted) throw new NotFoundError('no such application in this organization');
    await recordAuditEvent(trx, {
      actor: options.actor,
      organizationId: application.organization_id,
      action: 'application.deleted',
      details: { client_id: application.client_id, name: application.name },
    });
    await queueGrantRevocation(trx, deleted as DeveloperApplication, 'deleted', options.actor);
  });
  options.applications?.forget(application.client_id);
}

/** Why an application's grants are being revoked: it was disabled, deleted, or lost scopes. */
type RevocationMode = 'disabled' | 'deleted' | 'narrowed';

interface ApplicationGrantsPayload {
  application_id: number;
  client_id: string;
  mode: RevocationMode;
  actor: Actor;
}

export const APPLICATION_GRANTS_JOB = 'application.revoke_grants';

async function queueGrantRevocation(trx: DB, application: DeveloperApplication, mode: RevocationMode, actor: Actor | undefined): Promise<void> {
  const payload: ApplicationGrantsPayload = { application_id: application.id, client_id: application.client_id, mode, actor: actor ?? {} };
  await enqueueJob(trx, { kind: APPLICATION_GRANTS_JOB, organizationId: application.organization_id, payload: { ...payload } });
}

/**
 * The job that revokes an application's grants, REVOKE_BATCH (300) a step, each published to
 * every instance as it commits (revokeBatch). Each step reads the application as it is now
 * (share-locked): one enabled again stops a `disabled` job, and a `narrowed` job revokes what
 * holds a scope beyond the scopes it has now, so a later change is followed, not undone.
 */
export function applicationGrantsJob(memory?: RevokedGrantsMemory): JobHandler<ApplicationGrantsPayload, { after: number }> {
  return {
    kind: APPLICATION_GRANTS_JOB,
    async step(trx, job, cursor) {
      const { application_id: id, mode } = job.payload;
      const app = await trx.selectFrom('applications').select(['organization_id', 'type', 'scopes', 'disabled', 'deleted_at']).where('id', '=', id).forShare().executeTakeFirst();
      const stillWanted = app !== undefined && (mode === 'narrowed' ? !app.disabled : mode === 'deleted' || app.disabled);
      if (!app || app.organization_id === null || !stillWanted) return { cursor, processed: 0, finished: true };
      const filter = mode === 'narrowed' ? { beyondScopes: app.scopes, declaredBeyond: app.type === 'private' } : {};
      const selection = { organizationId: app.organization_id, applicationId: id, ...filter };
      // Progress: how many it has to revoke, counted once (by the partial index of live grants).
      const total = cursor === null && mode !== 'narrowed' ? await countLiveGrants(trx, { applicationId: id }) : undefined;
      const reason = mode === 'narrowed' ? 'scopes_narrowed' : 'application_disabled';
      const ids = await revokeBatch(trx, selection, reason, job.payload.actor, cursor?.after ?? 0);
      if (ids.length === 0) return { cursor, processed: 0, finished: true, total };
      // RETURNING does not keep the lock order: the cursor is the largest id revoked.
      return { cursor: { after: Math.max(...ids) }, processed: ids.length, finished: false, total, afterCommit: () => memory?.noteRevoked(ids, reason) };
    },
  };
}
