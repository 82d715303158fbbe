/**
 * The dashboard's "current organization": kept on the browser session
 * (sessions.current_organization_id) and re-checked against memberships on every request, so a
 * user removed from an organization (or demoted) loses it, or the role, at their next click.
 */
import type { DB } from '../db/connect.js';
import type { UserOrganization } from './organizations.js';
import { sha256Hex } from '../lib/crypto.js';

export type CurrentOrganization = UserOrganization;

/**
 * The session's organization, while the user is still a member of it. Otherwise (none chosen
 * yet, or membership gone) the first of `memberships` becomes current and is remembered.
 */
export async function resolveCurrentOrganization(
  db: DB,
  sessionId: string,
  memberships: readonly CurrentOrganization[],
): Promise<CurrentOrganization | undefined> {
  const session = await db
    .selectFrom('sessions')
    .select('current_organization_id')
    .where('id_hash', '=', sha256Hex(sessionId))
    .executeTakeFirst();
  const chosen = memberships.find((m) => m.id === session?.current_organization_id);
  if (chosen) return chosen;
  const fallback = memberships[0];
  await db
    .updateTable('sessions')
    .set({ current_organization_id: fallback?.id ?? null })
    .where('id_hash', '=', sha256Hex(sessionId))
    .execute();
  return fallback;
}

/** Makes `organizationId` current for the session; false (and nothing changed) when the user is not a member. */
export async function selectOrganization(db: DB, input: { sessionId: string; userId: number; organizationId: number }): Promise<boolean> {
  const result = await db
    .updateTable('sessions')
    .set({ current_organization_id: input.organizationId })
    .where('id_hash', '=', sha256Hex(input.sessionId))
    .where('user_id', '=', input.userId)
    .where((eb) =>
      eb.exists(
        eb
          .selectFrom('memberships')
          .select('memberships.user_id')
          .where('memberships.organization_id', '=', input.organizationId)
          .where('memberships.user_id', '=', input.userId),
      ),
    )
    .executeTakeFirst();
  return result.numUpdatedRows > 0n;
}
