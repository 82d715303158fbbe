/**
 * Grants: one authorization of an application for an organization, by a user or by the
 * application itself. Every token (access or refresh) names its grant; revoking the grant kills
 * them all, on every instance (see revocations.ts).
 */
import { sql, type Transaction } from 'kysely';
import type { DB } from '../db/connect.js';
import type { Database } from '../db/schema.js';
import { inTransaction } from '../db/connect.js';
import { recordAuditEvent } from '../audit/events.js';

/**
 * The channel revocations are published on. The payload is a grant id, or for one access token
 * `jti <jti> <exp>` (see revokeAccessToken).
 */
export const REVOCATION_CHANNEL = 'orgauth_revocations';

export type RevocationReason =
  | 'revoked_by_client'
  | 'revoked_by_user'
  | 'code_replay'
  | 'refresh_token_reuse'
  | 'application_disabled'
  | 'member_removed'
  | 'scopes_narrowed';

export interface NewGrant {
  organizationId: number;
  applicationId: number;
  /** null: the application acting for itself (client_credentials). */
  userId: number | null;
  scopes: readonly string[];
}

/**
 * Creates a grant and its `grant.created` audit event, returning the grant id with the
 * organization's name: one statement, one round trip. Nothing is created, and undefined is
 * returned, when the application is disabled: an instance that read it before it was disabled
 * must not add a grant after the disabling revoked them all.
 */
export async function createGrant(db: DB, grant: NewGrant): Promise<{ id: number; organizationName: string } | undefined> {
  const row = await db
    .with('g', (qb) =>
      qb
        .insertInto('grants')
        .columns(['organization_id', 'application_id', 'user_id', 'scopes', 'last_used_at'])
        .expression((eb) =>
          eb
            .selectFrom('applications')
            .select([
              'organization_id',
              'id',
              sql<number | null>`${grant.userId}::bigint`.as('user_id'),
              sql<string[]>`${[...grant.scopes]}::text[]`.as('scopes'),
              // Created to issue a token at once.
              sql<Date>`now()`.as('last_used_at'),
            ])
            .where('id', '=', grant.applicationId)
            .where('organization_id', '=', grant.organizationId)
            .where('disabled', '=', false),
        )
        .returning(['id', 'organization_id', 'application_id']),
    )
    .with('a', (qb) =>
      qb.insertInto('audit_events').columns(['organization_id', 'actor_user_id', 'action', 'details']).expression((eb) =>
        eb
          .selectFrom('g')
          .select([
            'g.organization_id',
            sql<number | null>`${grant.userId}::bigint`.as('actor_user_id'),
            sql<string>`'grant.created'`.as('action'),
            sql<string>`jsonb_build_object('grant_id', g.id, 'application_id', g.application_id, 'user_id', ${grant.userId}::bigint, 'scopes', ${grant.scopes.join(' ')}::text)`.as('details'),
          ]),
      ),
    )
    .selectFrom('g')
    .innerJoin('organizations', 'organizations.id', 'g.organization_id')
    .select(['g.id', 'organizations.name'])
    .executeTakeFirst();
  return row && { id: row.id, organizationName: row.name };
}

/** Who revoked: a user (dashboard) or a client (/oauth/revoke, reuse detection), or neither (the system). */
export interface Actor {
  actorUserId?: number | null;
  actorClientId?: string | null;
}

/**
 * Records a revocation in the organization's audit log and publishes it to every instance
 * (RevocationList), in the revoking transaction: NOTIFY is delivered when it commits.
 */
async function announceRevocation(
  trx: Transaction<Database>,
  organizationId: number,
  action: 'grant.revoked' | 'access_token.revoked',
  actor: Actor,
  event: { details: Record<string, unknown>; notify: string },
): Promise<void> {
  await recordAuditEvent(trx, {
    organizationId,
    action,
    actorUserId: actor.actorUserId ?? null,
    actorClientId: actor.actorClientId ?? null,
    details: event.details,
  });
  await sql`select pg_notify(${REVOCATION_CHANNEL}, ${event.notify})`.execute(trx);
}

/**
 * Revokes a grant and every refresh token of it, records why, and publishes the revocation so
 * every instance refuses its access tokens (NOTIFY is delivered when the transaction commits).
 * Returns false when the grant was already revoked or does not exist.
 */
export async function revokeGrant(
  db: DB,
  grantId: number,
  reason: RevocationReason,
  actor: Actor = {},
): Promise<boolean> {
  return inTransaction(db, async (trx) => {
    const grant = await trx
      .updateTable('grants')
      .set({ revoked_at: sql`now()`, revoked_reason: reason })
      .where('id', '=', grantId)
      .where('revoked_at', 'is', null)
      .returning(['id', 'organization_id', 'application_id', 'user_id'])
      .executeTakeFirst();
    if (!grant) return false;
    await trx
      .updateTable('refresh_tokens')
      .set({ revoked_at: sql`now()` })
      .where('organization_id', '=', grant.organization_id)
      .where('grant_id', '=', grant.id)
      .where('revoked_at', 'is', null)
      .execute();
    await announceRevocation(trx, grant.organization_id, 'grant.revoked', actor, {
      details: { grant_id: grant.id, application_id: grant.application_id, user_id: grant.user_id, reason },
      notify: String(grant.id),
    });
    return true;
  });
}

/**
 * Revokes one access token and not its grant: for the tokens a private application gets for
 * itself, which share one grant (client-grants.ts). Kept until an hour after the token expires
 * (src/retention.ts deletes it then). Returns false when it was revoked already.
 */
export async function revokeAccessToken(
  db: DB,
  token: { jti: string; organizationId: number; grantId: number; exp: number },
  reason: RevocationReason,
  actor: Actor = {},
): Promise<boolean> {
  return inTransaction(db, async (trx) => {
    const inserted = await trx
      .insertInto('revoked_access_tokens')
      .values({ jti: token.jti, organization_id: token.organizationId, grant_id: token.grantId, expires_at: new Date(token.exp * 1000) })
      .onConflict((oc) => oc.column('jti').doNothing())
      .returning('jti')
      .executeTakeFirst();
    if (!inserted) return false;
    await announceRevocation(trx, token.organizationId, 'access_token.revoked', actor, {
      details: { grant_id: token.grantId, jti: token.jti, reason },
      notify: `jti ${token.jti} ${token.exp}`,
    });
    return true;
  });
}
