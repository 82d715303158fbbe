/** Refresh tokens: 256-bit random values stored as SHA-256, each bound to a grant (and so a client). */
import { sql } from 'kysely';
import type { DB } from '../../db/connect.js';
import { sha256Hex } from '../../lib/crypto.js';

/** A refresh token with what checking it needs: its grant's client, user, organization and state (ended_by_removal: its user was removed since the grant was made). */
export async function findRefreshToken(db: DB, token: string) {
  return db
    .selectFrom('refresh_tokens as r')
    .innerJoin('grants as g', (j) => j.onRef('g.id', '=', 'r.grant_id').onRef('g.organization_id', '=', 'r.organization_id'))
    .innerJoin('organizations as o', 'o.id', 'r.organization_id')
    .select([
      'r.id',
      'r.grant_id',
      'r.organization_id',
      'o.name as organization_name',
      'r.scopes',
      'g.identity_scopes',
      'g.amr',
      'g.sso_connection_id',
      'r.expires_at',
      'r.rotated_at',
      'r.revoked_at',
      'r.created_at',
      'g.application_id',
      'g.user_id',
      'g.revoked_at as grant_revoked_at',
      'g.dpop_jkt',
      sql<boolean>`r.expires_at <= now()`.as('expired'),
      // Its user was removed from the organization after the grant was made (the grant is being revoked).
      sql<boolean>`exists (select 1 from removed_members rm where rm.organization_id = r.organization_id and rm.user_id = g.user_id and rm.removed_at >= g.created_at)`.as('ended_by_removal'),
      sql<number | null>`extract(epoch from now() - r.rotated_at)::float8`.as('seconds_since_rotation'),
    ])
    .where('r.token_hash', '=', sha256Hex(token))
    .executeTakeFirst();
}
