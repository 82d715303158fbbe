/** Grants: one authorization of an application for an organization, by a user or by itself. */
import type { DB } from '../db/connect.js';

export interface NewGrant {
  organizationId: number;
  applicationId: number;
  /** null: the application acting for itself (client_credentials). */
  userId: number | null;
  scopes: readonly string[];
}

/** Creates a grant and returns its id with the organization's name, in one statement. */
export async function createGrant(db: DB, grant: NewGrant): Promise<{ id: number; organizationName: string }> {
  const row = await db
    .with('g', (qb) =>
      qb
        .insertInto('grants')
        .values({
          organization_id: grant.organizationId,
          application_id: grant.applicationId,
          user_id: grant.userId,
          scopes: [...grant.scopes],
        })
        .returning(['id', 'organization_id']),
    )
    .selectFrom('g')
    .innerJoin('organizations', 'organizations.id', 'g.organization_id')
    .select(['g.id', 'organizations.name'])
    .executeTakeFirstOrThrow();
  return { id: row.id, organizationName: row.name };
}
