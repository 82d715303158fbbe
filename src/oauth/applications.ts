import { randomBytes } from 'node:crypto';
import { z } from 'zod';
import { recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isForeignKeyViolation } from '../db/errors.js';
import type { Application, ApplicationType } from '../db/schema.js';
import { InvalidRequestError, NotFoundError } from '../errors.js';
import { generateSecret, sha256Hex } from '../lib/crypto.js';
import { parseInput } from '../lib/validate.js';
import { redirectUriSchema } from './redirect-uris.js';
import { KNOWN_SCOPES, parseScopes, type Scope } from './scopes.js';

const newApplicationSchema = z
  .object({
    organizationId: z.number().int().positive(),
    type: z.enum(['public', 'private'], { error: 'must be public or private' }),
    name: z.string().trim().min(1, 'must not be empty').max(200, 'must be at most 200 characters'),
    redirectUris: z.array(redirectUriSchema).max(20, 'at most 20 redirect URIs').default([]),
    requirePkce: z.boolean().default(false),
  })
  .superRefine((app, ctx) => {
    if (app.type === 'public' && app.redirectUris.length === 0) {
      ctx.addIssue({ code: 'custom', path: ['redirectUris'], message: 'a public application needs at least one redirect URI' });
    }
    if (app.type === 'private' && app.redirectUris.length > 0) {
      ctx.addIssue({ code: 'custom', path: ['redirectUris'], message: 'a private application has no redirect URIs (it uses client_credentials)' });
    }
  });

export interface NewApplicationInput {
  organizationId: number;
  type: ApplicationType;
  name: string;
  redirectUris?: string[];
  /** Space-separated or a list; all known scopes when omitted. */
  scopes?: string | string[];
  requirePkce?: boolean;
  actorUserId?: number | null;
}

/** What leaves the server about an application, plus its secret the one time it is known. */
export interface ApplicationWithSecret {
  client_id: string;
  client_secret: string;
  type: ApplicationType;
  organization_id: number;
  name: string;
  redirect_uris: string[];
  scopes: string[];
}

/** What every client id looks like (see newClientId): anything else is no client of ours. */
export const CLIENT_ID_PATTERN = /^[0-9a-f]{32}$/;

/**
 * 128 random bits in hex: public, but unguessable, and safe wherever it goes (a URL, a Basic
 * header, a shell argument: base64url could start with "-" and read as an option).
 */
function newClientId(): string {
  return randomBytes(16).toString('hex');
}

function newClientSecret(): { secret: string; hash: string } {
  const secret = generateSecret(32);
  return { secret, hash: sha256Hex(secret) };
}

/**
 * Registers an application. The client secret is returned here and never again: the database
 * keeps only its SHA-256 digest.
 */
export async function createApplication(db: DB, input: NewApplicationInput): Promise<ApplicationWithSecret> {
  const app = parseInput(newApplicationSchema, input);
  const scopes: Scope[] = input.scopes === undefined ? [...KNOWN_SCOPES] : parseScopes(input.scopes);
  if (scopes.length === 0) throw new InvalidRequestError('scopes: at least one scope is required');
  const { secret, hash } = newClientSecret();
  try {
    return await inTransaction(db, async (trx) => {
      const row = await trx
        .insertInto('applications')
        .values({
          organization_id: app.organizationId,
          client_id: newClientId(),
          client_secret_hash: hash,
          type: app.type,
          name: app.name,
          redirect_uris: app.redirectUris,
          scopes,
          require_pkce: app.requirePkce,
        })
        .returning(['client_id', 'type', 'organization_id', 'name', 'redirect_uris', 'scopes'])
        .executeTakeFirstOrThrow();
      await recordAuditEvent(trx, {
        organizationId: row.organization_id,
        action: 'application.created',
        actorUserId: input.actorUserId ?? null,
        details: { client_id: row.client_id, type: row.type, name: row.name },
      });
      return { ...row, client_secret: secret };
    });
  } catch (err) {
    if (isForeignKeyViolation(err)) throw new NotFoundError(`organization ${app.organizationId} not found`);
    throw err;
  }
}

export async function findApplicationByClientId(db: DB, clientId: string): Promise<Application | undefined> {
  return db.selectFrom('applications').selectAll().where('client_id', '=', clientId).executeTakeFirst();
}

/** Replaces an application's secret; the old one stops working as soon as this commits. */
export async function rotateClientSecret(
  db: DB,
  clientId: string,
  actor: { actorUserId?: number | null } = {},
): Promise<{ client_id: string; client_secret: string }> {
  const { secret, hash } = newClientSecret();
  return inTransaction(db, async (trx) => {
    const row = await trx
      .updateTable('applications')
      .set({ client_secret_hash: hash, secret_rotated_at: new Date(), updated_at: new Date() })
      .where('client_id', '=', clientId)
      .returning(['client_id', 'organization_id'])
      .executeTakeFirst();
    if (!row) throw new NotFoundError(`no application with client_id ${clientId}`);
    await recordAuditEvent(trx, {
      organizationId: row.organization_id,
      action: 'application.secret_rotated',
      actorUserId: actor.actorUserId ?? null,
      details: { client_id: row.client_id },
    });
    return { client_id: row.client_id, client_secret: secret };
  });
}
