/**
 * The grant a private application's own tokens are issued under (client_credentials, the
 * dashboard's "Generate Token", `orgauth token create`): one live grant per application, shown
 * as "the application itself" under Connected apps, and reused by every such token, so issuing
 * one writes nothing to the database.
 *
 * Revoking one of its tokens revokes this grant and so every token of it (RFC 7009 §2.1 lets a
 * revocation take the underlying grant along; it is what a leaked token calls for); the next
 * request starts a new grant. `last_used_at` is updated when the grant is read again, at most
 * once per MAX_AGE_MS per instance, not once per token.
 */
import { sql } from 'kysely';
import type { DB } from '../../db/connect.js';
import type { DeveloperApplication } from '../../db/schema.js';
import { InvalidClientError } from '../errors.js';
import { createGrant } from './grants.js';

const MAX_AGE_MS = 1000;
const MAX_ENTRIES = 10_000;

export interface ClientGrant {
  id: number;
  organizationName: string;
  scopes: readonly string[];
}

/** The newest live grant of the application for itself that covers `scopes`, or a new one. */
async function liveClientGrant(db: DB, application: DeveloperApplication, scopes: readonly string[]): Promise<ClientGrant> {
  const live = await db
    .updateTable('grants')
    .set({ last_used_at: sql`now()` })
    .where('revoked_at', 'is', null)
    .where('id', '=', (eb) =>
      eb
        .selectFrom('grants')
        .select('id')
        .where('application_id', '=', application.id)
        .where('organization_id', '=', application.organization_id)
        .where('user_id', 'is', null)
        .where('revoked_at', 'is', null)
        .where('scopes', '@>', sql<string[]>`${[...scopes]}::text[]`)
        .orderBy('id', 'desc')
        .limit(1),
    )
    .returning(['id', 'scopes', (eb) => eb.selectFrom('organizations').select('name').whereRef('organizations.id', '=', 'grants.organization_id').as('organization_name')])
    .executeTakeFirst();
  if (live) return { id: live.id, scopes: live.scopes, organizationName: live.organization_name ?? '' };
  // The grant covers everything the application may ask for, so narrower requests reuse it.
  const created = await createGrant(db, { organizationId: application.organization_id, applicationId: application.id, userId: null, scopes: application.scopes });
  if (!created) throw new InvalidClientError({ cause: new Error('application disabled') });
  return { id: created.id, organizationName: created.organizationName, scopes: application.scopes };
}

export class ClientGrants {
  private readonly entries = new Map<number, { grant: ClientGrant; loadedAt: number }>();
  private readonly loading = new Map<number, Promise<ClientGrant>>();

  /**
   * Without `revocations` (the CLI) nothing is cached. With it, a cached grant is dropped the
   * moment this instance learns it was revoked (here, by NOTIFY or by its poll).
   */
  constructor(
    private readonly db: DB,
    private readonly revocations?: { isRevoked(grantId: number): boolean },
  ) {}

  async forApplication(application: DeveloperApplication, scopes: readonly string[]): Promise<ClientGrant> {
    if (!this.revocations) return liveClientGrant(this.db, application, scopes);
    const usable = (grant: ClientGrant) => !this.revocations!.isRevoked(grant.id) && scopes.every((s) => grant.scopes.includes(s));
    const entry = this.entries.get(application.id);
    if (entry && performance.now() - entry.loadedAt < MAX_AGE_MS && usable(entry.grant)) return entry.grant;
    let pending = this.loading.get(application.id);
    if (!pending) {
      const loadedAt = performance.now();
      const loading = liveClientGrant(this.db, application, scopes)
        .then((grant) => {
          this.entries.delete(application.id);
          if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
          this.entries.set(application.id, { grant, loadedAt });
          return grant;
        })
        .finally(() => {
          if (this.loading.get(application.id) === loading) this.loading.delete(application.id);
        });
      this.loading.set(application.id, loading);
      pending = loading;
    }
    const grant = await pending;
    // Another request's read may have been for narrower scopes, or raced a revocation.
    return usable(grant) ? grant : liveClientGrant(this.db, application, scopes);
  }
}
