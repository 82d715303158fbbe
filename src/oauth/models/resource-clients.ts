/**
 * A registered resource's own credentials (issue 44, migration 0029): an applications row of
 * type 'resource', of no organization, through which the resource authenticates at the
 * introspection endpoint (to learn about the tokens issued for it) and at the token endpoint (to
 * exchange them, RFC 8693). It authenticates as any client does: client_secret_basic or _post
 * with a secret shown once, or private_key_jwt with its registered keys. Every grant and
 * endpoint that looks at an application's type refuses this one for anything else.
 */
import { sql } from 'kysely';
import type { Config } from '../../config.js';
import { type DB, inTransaction } from '../../db/connect.js';
import { type Application, type GrantType, TOKEN_EXCHANGE_GRANT } from '../../db/schema.js';
import { ConflictError, InvalidRequestError, NotFoundError } from '../../errors.js';
import { clientKeysProblem, publicJwksSchema } from '../helpers/client-assertion.js';
import { newClientId, newClientSecret } from './applications.js';
import { createResource, getResource, type ResourceCredentials, type ResourceInput, type ResourceRow } from './resources.js';

export interface ResourceWithCredentials {
  resource: ResourceRow;
  credentials: ResourceCredentials & { client_secret: string };
}

const RESOURCE_GRANT_TYPES: GrantType[] = [TOKEN_EXCHANGE_GRANT];

/** The client row of a resource: no organization, no scopes, no redirect URIs, only token exchange. */
function clientValues(resource: Pick<ResourceRow, 'id' | 'name'>, hash: string) {
  return {
    organization_id: null,
    client_id: newClientId(),
    client_secret_hash: hash,
    type: 'resource' as const,
    registration: 'resource' as const,
    name: resource.name,
    scopes: [],
    grant_types: RESOURCE_GRANT_TYPES,
    token_endpoint_auth_method: 'client_secret_basic' as const,
    resource_id: resource.id,
  };
}

/** Registers a resource with its credentials, in one transaction; the secret is returned here and never again. */
export async function registerResource(db: DB, config: Pick<Config, 'issuer'>, input: ResourceInput): Promise<ResourceWithCredentials> {
  return inTransaction(db, async (trx) => {
    const created = await createResource(trx, config, input);
    const { secret, hash } = newClientSecret();
    const client = await trx.insertInto('applications').values(clientValues(created, hash)).returning(['client_id', 'token_endpoint_auth_method']).executeTakeFirstOrThrow();
    return { resource: { ...created, ...client }, credentials: { client_id: client.client_id, client_secret: secret } };
  });
}

/**
 * A new secret for a resource (credentials for one registered before it had any): the old secret,
 * or the registered keys, stop working as soon as this commits; every instance's application
 * cache hears of it by NOTIFY. Returns the client id and the secret, shown once.
 */
export async function rotateResourceSecret(db: DB, uriOrId: string): Promise<ResourceCredentials & { client_secret: string }> {
  const { secret, hash } = newClientSecret();
  return inTransaction(db, async (trx) => {
    const resource = await getResource(trx, uriOrId);
    // Two rotations at once of a resource without credentials: one inserts, the other waits and updates.
    const locked = await trx.selectFrom('resources').select('id').where('id', '=', resource.id).forUpdate().executeTakeFirst();
    if (!locked) throw new NotFoundError(`no resource ${uriOrId.slice(0, 200)}`);
    const updated = await trx
      .updateTable('applications')
      .set({ client_secret_hash: hash, token_endpoint_auth_method: 'client_secret_basic', jwks: null, jwks_uri: null, secret_rotated_at: sql`now()`, updated_at: sql`now()` })
      .where('resource_id', '=', resource.id)
      .returning('client_id')
      .executeTakeFirst();
    const clientId = updated?.client_id ?? (await trx.insertInto('applications').values(clientValues(resource, hash)).returning('client_id').executeTakeFirstOrThrow()).client_id;
    return { client_id: clientId, client_secret: secret };
  });
}

/**
 * Puts a resource on private_key_jwt: its public keys inline (a JWK Set) or at a URL, its secret
 * forgotten (rotateResourceSecret goes back to one). The resource must have credentials already.
 */
export async function setResourceKeys(
  db: DB,
  uriOrId: string,
  keys: { jwks: unknown } | { jwksUri: string },
  options: { allowHttp: boolean },
): Promise<ResourceRow> {
  const jwks = 'jwks' in keys ? publicJwksSchema.safeParse(keys.jwks) : undefined;
  if (jwks && !jwks.success) throw new InvalidRequestError(`jwks: ${jwks.error.issues[0]?.message ?? 'not a JWK Set of public keys'}`, { details: [{ path: 'jwks', message: 'not a JWK Set of public keys' }] });
  const jwksUri = 'jwksUri' in keys ? keys.jwksUri : null;
  const problem = clientKeysProblem('private_key_jwt', jwks?.data ?? null, jwksUri, options);
  if (problem !== null) throw new InvalidRequestError(`${problem.path}: ${problem.message}`, { details: [problem] });
  return inTransaction(db, async (trx) => {
    const resource = await getResource(trx, uriOrId);
    const updated = await trx
      .updateTable('applications')
      .set({ token_endpoint_auth_method: 'private_key_jwt', client_secret_hash: null, jwks: jwks ? JSON.stringify(jwks.data) : null, jwks_uri: jwksUri, updated_at: sql`now()` })
      .where('resource_id', '=', resource.id)
      .returning('client_id')
      .executeTakeFirst();
    if (!updated) throw new ConflictError(`${resource.uri} has no credentials yet: make them with \`orgauth resource rotate-secret\` first`);
    return getResource(trx, String(resource.id));
  });
}

/** Whether an authenticated client is a resource's (introspection and token exchange ask). */
export function isResourceClient(application: Application): application is Application & { type: 'resource'; resource_id: number } {
  return application.type === 'resource' && application.resource_id !== null;
}
