/**
 * Custom roles' permissions by role id, cached for the API. A user's access token names their
 * custom role (its `role_id` claim, src/oauth/models/access-tokens.ts), and the API holds the
 * token's scopes to that role as it is now: when a role loses a permission, every instance
 * refuses the tokens carrying it within MAX_AGE_MS, while the job that narrows its members'
 * grants (roles.ts roleGrantsJob) may still be walking through a million of them. Refreshes and
 * code redemptions check the role in the database already, so no new token carries the
 * permission either.
 *
 * Kept current by age alone (an entry older than MAX_AGE_MS is read again): one primary-key
 * read per role in use per half second per instance, and no LISTEN connection of its own. A role
 * that no longer exists is remembered as such: deleting a role moves its members, narrowing their
 * grants as it goes, so their tokens are already what the role they moved to allows.
 */
import type { DB } from '../db/connect.js';

const MAX_AGE_MS = 500;
/** Role ids come from tokens we signed, so they are real roles; the bound is for memory all the same. */
const MAX_ENTRIES = 10_000;

export interface RoleScopesEntry {
  organizationId: number;
  permissions: ReadonlySet<string>;
}

export class RoleScopes {
  /** loadedAt: ms since the epoch (compared with tokens' iat). */
  private readonly entries = new Map<number, { role: RoleScopesEntry | null; loadedAt: number }>();
  private readonly loading = new Map<number, Promise<RoleScopesEntry | null>>();

  constructor(private readonly db: DB) {}

  /**
   * The role's organization and permissions; null when it no longer exists. `notBefore` (ms
   * since the epoch): an entry read before then is read again (a token that seems beyond the
   * role may have been issued after it was widened).
   */
  find(roleId: number, notBefore = 0): Promise<RoleScopesEntry | null> {
    const entry = this.entries.get(roleId);
    if (entry && Date.now() - entry.loadedAt < MAX_AGE_MS && entry.loadedAt >= notBefore) return Promise.resolve(entry.role);
    let pending = this.loading.get(roleId);
    if (!pending) {
      const loading = this.load(roleId).finally(() => this.loading.delete(roleId));
      this.loading.set(roleId, loading);
      pending = loading;
    }
    return pending;
  }

  private async load(roleId: number): Promise<RoleScopesEntry | null> {
    const loadedAt = Date.now();
    const row = await this.db.selectFrom('roles').select(['organization_id', 'permissions']).where('id', '=', roleId).executeTakeFirst();
    const role = row ? { organizationId: row.organization_id, permissions: new Set(row.permissions) } : null;
    this.entries.delete(roleId);
    if (this.entries.size >= MAX_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
    this.entries.set(roleId, { role, loadedAt });
    return role;
  }
}
