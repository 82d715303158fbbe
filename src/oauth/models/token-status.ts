/**
 * Whether an access token this server signed is live now, asked of the database (not the
 * in-memory lists): what introspection answers (RFC 7662) and what token exchange (RFC 8693)
 * requires of its subject and actor tokens. Live: not expired, not revoked, its grant not
 * revoked, its user not removed from the organization since it was issued, its application (the
 * one the grant is for, and the one it was issued to) enabled and not deleted, and a bearer
 * token only while its application does not require DPoP.
 */
import { sql } from 'kysely';
import type { DB } from '../../db/connect.js';
import type { FindApplication } from './application-cache.js';
import type { AccessTokenClaims } from './access-tokens.js';
import { REMOVAL_MARGIN_S } from './grants.js';
import { requiresDpop } from '../helpers/fapi.js';

export type TokenStatus = { live: false } | { live: true; organizationName: string; userId: number | null };

export async function accessTokenStatus(db: DB, findApplication: FindApplication, c: AccessTokenClaims): Promise<TokenStatus> {
  if (c.exp <= Math.floor(Date.now() / 1000)) return { live: false };
  // Its application as it is now: disabled or deleted, its tokens are refused at once (as the API does).
  const issuedTo = await findApplication(c.client_id);
  if (!issuedTo || issuedTo.disabled || issuedTo.deleted_at !== null) return { live: false };
  // A bearer token of an application that now requires DPoP: the API refuses it (access-tokens.ts).
  if (c.cnf === undefined && requiresDpop(issuedTo)) return { live: false };
  const grant = await db
    .selectFrom('grants')
    .innerJoin('organizations', 'organizations.id', 'grants.organization_id')
    .innerJoin('applications', 'applications.id', 'grants.application_id')
    .select([
      'grants.revoked_at',
      'grants.user_id',
      'organizations.name as organization_name',
      // The application the grant is for: a token exchanged from it (issued to another client) ends with it too.
      sql<boolean>`applications.disabled or applications.deleted_at is not null`.as('application_off'),
      (eb) => eb.exists(eb.selectFrom('revoked_access_tokens').select('jti').where('jti', '=', c.jti)).as('token_revoked'),
      // Issued up to its user's removal from the organization (iat in whole seconds, and
      // REMOVAL_MARGIN_S more, as the API compares it), whose grants a job may still be revoking.
      (eb) =>
        eb
          .exists(
            eb
              .selectFrom('removed_members as rm')
              .select('rm.user_id')
              .whereRef('rm.organization_id', '=', 'grants.organization_id')
              .whereRef('rm.user_id', '=', 'grants.user_id')
              .where(sql<boolean>`rm.removed_at >= to_timestamp(${c.iat - REMOVAL_MARGIN_S})`),
          )
          .as('ended_by_removal'),
    ])
    .where('grants.id', '=', c.grant_id)
    .where('grants.organization_id', '=', c.organization_id)
    .executeTakeFirst();
  if (!grant || grant.revoked_at !== null || grant.application_off || grant.token_revoked || grant.ended_by_removal) return { live: false };
  return { live: true, organizationName: grant.organization_name, userId: grant.user_id };
}
