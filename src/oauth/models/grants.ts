/**
 * Grants: one authorization of an application for an organization, by a user or by the
 * application itself. Every token (access or refresh) names its grant; revoking the grant kills
 * them all, on every instance (see revocation-list.ts).
 */
import { type Expression, type RawBuilder, sql, type Transaction } from 'kysely';
import { KNOWN_SCOPES_SQL, knownScopesOf } from '../helpers/scopes.js';
import { isDeclaredScope } from './resources.js';
import type { DB } from '../../db/connect.js';
import type { Database, RevocationReason } from '../../db/schema.js';
import { inTransaction } from '../../db/connect.js';
import { type Actor, recordAuditEvent } from '../../audit/events.js';

/**
 * The channel revocations are published on. The payload is grant ids, comma separated (see
 * revokeGrants), or for one access token `jti <jti> <exp>` (see revokeAccessToken), or a
 * member's removal (memberRemovalPayload).
 */
export const REVOCATION_CHANNEL = 'orgauth_revocations';

/** A member removed from an organization, on REVOCATION_CHANNEL: `member <organization id> <user id> <removed_at, epoch seconds>` (RevocationList). */
export const memberRemovalPayload = (organizationId: number, userId: number, removedAtS: number): string => `member ${organizationId} ${userId} ${removedAtS}`;

/**
 * Seconds after a member's removal in which their access tokens are still taken as from before
 * it: a refresh that read the membership just before the removal committed signs its token just
 * after, and an instance's clock may be a little ahead of the database's. A member added back
 * within these seconds gets tokens that are refused until their next refresh.
 */
export const REMOVAL_MARGIN_S = 2;

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
 * returned, when the application is disabled or no longer has every scope asked for: an
 * instance that read it before it was disabled or narrowed must not add a grant after that
 * change revoked the others.
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
            .where('disabled', '=', false)
            .where(sql<boolean>`${[...grant.scopes]}::text[] <@ scopes`),
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

/**
 * Which live grants to revoke: one by id, or those of an organization, or of an application in
 * every organization (a self-registered client belongs to none), that match every condition given.
 */
export type GrantSelection =
  | { grantId: number }
  | ({
      userId?: number;
      /** Only grants holding a scope outside this list (an application's scopes were narrowed). */
      beyondScopes?: readonly string[];
      /** Whether a resource's declared scopes count too (a private application's own grants); otherwise only orgauth's (a public application's users granted the declared ones). */
      declaredBeyond?: boolean;
      /**
       * Only grants made up to the user's removal from the organization: this time (ISO 8601,
       * microseconds) or their latest removal (removed_members), whichever is later; not those
       * made since they were added back.
       */
      removedAt?: string;
    } & ({ organizationId: number; applicationId?: number } | { organizationId?: undefined; applicationId: number }));

/**
 * This instance's memory of revoked grants (RevocationList), told of revocations made here once
 * they have committed, so its API refuses their tokens at once (other instances hear by NOTIFY
 * within milliseconds, or by polling within a second).
 */
export interface RevokedGrantsMemory {
  noteRevoked(grantIds: readonly number[], reason: RevocationReason): void;
}

/** How many live grants match (an application's, or a member's in an organization): a revocation job's progress total, counted once off the partial indexes of live grants. */
export async function countLiveGrants(
  trx: DB,
  where: { applicationId: number } | { organizationId: number; userId: number },
  options: { cap?: number } = {},
): Promise<number> {
  let rows = trx.selectFrom('grants').select('id').where('revoked_at', 'is', null);
  rows = 'applicationId' in where ? rows.where('application_id', '=', where.applicationId) : rows.where('organization_id', '=', where.organizationId).where('user_id', '=', where.userId);
  // With a cap, at most cap + 1 rows are read: a page says "more than cap" instead of counting millions.
  if (options.cap !== undefined) rows = rows.limit(options.cap + 1);
  const { n } = await trx.selectFrom(rows.as('live')).select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow();
  return Number(n);
}

/** What the dashboard's pages count at most, of grants, members, applications (then "1,000+" / "more than 1,000"): counting a million rows to draw one number is not worth it. */
export const GRANT_COUNT_CAP = 1000;

/** Grants revoked per transaction: short locks beside the requests, and NOTIFY payloads under PostgreSQL's 8000 bytes. */
const REVOKE_BATCH = 300;

/**
 * Revokes up to REVOKE_BATCH of the selected live grants and every refresh token of them,
 * records each in the audit log with its reason, and publishes them so every instance refuses
 * their access tokens (one NOTIFY, delivered when `trx` commits; the payload is the grant ids,
 * comma separated). Returns their ids; none when no selected grant is left.
 *
 * The grants are locked in id order (FOR UPDATE, below the LIMIT): a grant that a concurrent
 * transaction is revoking is waited for, then skipped, and the batch fills up with the next
 * live ones, so a batch is empty only when no selected grant is left.
 */
export async function revokeBatch(trx: Transaction<Database>, selection: GrantSelection, reason: RevocationReason, actor: Actor, afterId = 0): Promise<number[]> {
  const grants = await trx
    .updateTable('grants')
    .set({ revoked_at: sql`now()`, revoked_reason: reason })
    .where('revoked_at', 'is', null)
    .where('id', 'in', (eb) => {
      let live = eb.selectFrom('grants').select('id').where('revoked_at', 'is', null);
      if ('grantId' in selection) return live.where('id', '=', selection.grantId).forUpdate();
      if (selection.organizationId !== undefined) live = live.where('organization_id', '=', selection.organizationId);
      if (selection.applicationId !== undefined) live = live.where('application_id', '=', selection.applicationId);
      if (selection.userId !== undefined) live = live.where('user_id', '=', selection.userId);
      if (selection.removedAt !== undefined && selection.organizationId !== undefined && selection.userId !== undefined) {
        const latest = sql<Date>`(select rm.removed_at from removed_members rm where rm.organization_id = ${selection.organizationId} and rm.user_id = ${selection.userId})`;
        live = live.where('created_at', '<=', sql<Date>`greatest(${selection.removedAt}::timestamptz, ${latest})`);
      }
      if (selection.beyondScopes !== undefined) {
        const held = selection.declaredBeyond ? sql<string[]>`scopes` : knownScopesOf(sql`scopes`);
        live = live.where(sql<boolean>`not (${held} <@ ${[...selection.beyondScopes]}::text[])`);
      }
      // Keyset (a job resuming from its cursor): grants already revoked are not walked again.
      if (afterId > 0) live = live.where('id', '>', afterId);
      return live.orderBy('id').limit(REVOKE_BATCH).forUpdate();
    })
    .returning(['id', 'organization_id', 'application_id', 'user_id'])
    .execute();
  if (grants.length === 0) return [];
  const ids = grants.map((g) => g.id);
  const organizations = [...new Set(grants.map((g) => g.organization_id))];
  // Locked after the grants, the order the refresh grant locks them in (no deadlock); found by
  // the (organization_id, grant_id) index, the only one refresh tokens have on their grant.
  await trx
    .updateTable('refresh_tokens')
    .set({ revoked_at: sql`now()` })
    .where('organization_id', '=', sql<number>`any(${organizations}::bigint[])`)
    .where('grant_id', '=', sql<number>`any(${ids}::bigint[])`)
    .where('revoked_at', 'is', null)
    .execute();
  await trx
    .insertInto('audit_events')
    .values(
      grants.map((g) => ({
        organization_id: g.organization_id,
        action: 'grant.revoked',
        actor_user_id: actor.actorUserId ?? null,
        actor_client_id: actor.actorClientId ?? null,
        details: JSON.stringify({ grant_id: g.id, application_id: g.application_id, user_id: g.user_id, reason }),
      })),
    )
    .execute();
  await sql`select pg_notify(${REVOCATION_CHANNEL}, ${ids.join(',')})`.execute(trx);
  return ids;
}

/**
 * Revokes the selected live grants (see revokeBatch), a batch per transaction, until none is
 * left; `memory` (this instance's revoked set) is told of each batch once it has committed.
 * Returns how many were revoked. Inside a transaction of the caller's, use
 * revokeGrantsInTransaction instead.
 */
export async function revokeGrants(
  db: DB,
  selection: GrantSelection,
  reason: RevocationReason,
  actor: Actor = {},
  memory?: RevokedGrantsMemory,
): Promise<number> {
  let count = 0;
  for (;;) {
    const ids = await db.transaction().execute((trx) => revokeBatch(trx, selection, reason, actor));
    if (ids.length > 0) memory?.noteRevoked(ids, reason);
    count += ids.length;
    if (ids.length === 0 || 'grantId' in selection) return count;
  }
}

/**
 * The same within the caller's transaction (removing a member revokes their grants with it);
 * returns the ids, for the caller to tell its memory once the transaction has committed.
 */
export async function revokeGrantsInTransaction(trx: Transaction<Database>, selection: GrantSelection, reason: RevocationReason, actor: Actor = {}): Promise<number[]> {
  const revoked: number[] = [];
  for (;;) {
    const ids = await revokeBatch(trx, selection, reason, actor);
    revoked.push(...ids);
    if (ids.length === 0 || 'grantId' in selection) return revoked;
  }
}

/**
 * What a role lets its members keep when their grants are narrowed: orgauth's permissions it lists,
 * and, when `declared`, every scope a resource declares (roles.ts DECLARED_SCOPE_HOLDERS).
 */
export interface GrantAllowance {
  permissions: readonly string[];
  declared: boolean;
}

/** Whose grants a role change narrows: one member's, some members', or those of every member holding a custom role. */
export type NarrowSelection = { organizationId: number; userId: number } | { organizationId: number; userIds: readonly number[] } | { organizationId: number; roleId: number };

/**
 * Narrows up to REVOKE_BATCH of the selected users' live grants that hold a scope outside
 * `allowed` (their role no longer allows it), by re-issue: each is replaced by a successor grant
 * holding only the allowed scopes, which takes over its refresh tokens (narrowed the same way;
 * a replayed code follows the successors: liveSuccessor); the old grant is then
 * revoked with reason role_changed and published like any revocation, so every instance refuses
 * its access tokens within a second (RevocationList), and the next refresh returns the narrower
 * scope. A grant left with no scope is simply revoked. Audited as grant.narrowed (or
 * grant.revoked). Returns the ids of the grants revoked; none when no selected grant is left.
 *
 * Why re-issue rather than a per-token scope check: access tokens are verified without a query,
 * against the revoked set that already reaches every instance within a second and stays compact
 * at a million entries; re-issue reuses that path, so the API's hot path gains nothing, and the
 * refresh token (the user's consent) survives with the scope the role now allows.
 */
async function narrowBatch(trx: Transaction<Database>, selection: NarrowSelection, allowance: GrantAllowance, actor: Actor, afterId: number): Promise<number[]> {
  const allowedArray = sql<string[]>`${[...allowance.permissions]}::text[]`;
  // Whether scope `s` (SQL) is kept: listed, or a declared scope of a role that holds them.
  const keeps = (s: RawBuilder<string>) => sql<boolean>`(${s} = any(${allowedArray}) or (${allowance.declared} and not (${s} = any(${KNOWN_SCOPES_SQL}))))`;
  const kept = (s: string) => allowance.permissions.includes(s) || (allowance.declared && isDeclaredScope(s));
  const old = await trx
    .selectFrom('grants')
    .select(['id', 'organization_id', 'application_id', 'user_id', 'scopes', 'identity_scopes', 'auth_time', 'sid', 'amr', 'sso_connection_id', 'created_at', 'last_used_at', 'resource_id', 'dpop_jkt'])
    .where('organization_id', '=', selection.organizationId)
    .where('revoked_at', 'is', null)
    .$if('userId' in selection, (qb) => qb.where('user_id', '=', 'userId' in selection ? selection.userId : 0))
    .$if('userIds' in selection, (qb) => qb.where('user_id', '=', sql<number>`any(${'userIds' in selection ? [...selection.userIds] : []}::bigint[])`))
    .$if('roleId' in selection, (qb) =>
      qb.where('user_id', 'in', (eb) =>
        eb
          .selectFrom('memberships')
          .select('user_id')
          .where('organization_id', '=', selection.organizationId)
          .where('role_id', '=', 'roleId' in selection ? selection.roleId : 0),
      ),
    )
    .where('user_id', 'is not', null)
    .where(sql<boolean>`exists (select 1 from unnest(scopes) s where not ${keeps(sql`s`)})`)
    // Keyset: the grants already narrowed (revoked, before the cursor) are not read again.
    .where('id', '>', afterId)
    .orderBy('id')
    .limit(REVOKE_BATCH)
    .forUpdate()
    .execute();
  if (old.length === 0) return [];
  // A grant keeps its OpenID scopes (signing in is every member's): one left with only those
  // lives on for sign-in, and its refresh tokens with it.
  const narrowed = old.map((g) => ({ ...g, kept: g.scopes.filter(kept), lives: g.identity_scopes.length > 0 || g.scopes.some(kept) }));
  const replaced = narrowed.filter((g) => g.lives);
  const successors =
    replaced.length === 0
      ? []
      : await trx
          .insertInto('grants')
          .values(
            replaced.map((g) => ({
              organization_id: g.organization_id,
              application_id: g.application_id,
              user_id: g.user_id,
              scopes: g.kept,
              // The sign-in the grant came from stays with it (a refresh's ID token keeps auth_time and sid).
              identity_scopes: g.identity_scopes,
              auth_time: g.auth_time,
              amr: g.amr,
              sso_connection_id: g.sso_connection_id,
              sid: g.sid,
              created_at: g.created_at,
              last_used_at: g.last_used_at,
              narrowed_from_grant_id: g.id,
              resource_id: g.resource_id,
              // Still bound to the key its tokens were (RFC 9449 §5): narrowing is no way out of DPoP.
              dpop_jkt: g.dpop_jkt,
            })),
          )
          .returning(['id', 'narrowed_from_grant_id'])
          .execute();
  const oldIds = old.map((g) => g.id);
  const moves = successors.map((s) => ({ from: s.narrowed_from_grant_id!, to: s.id }));
  if (moves.length > 0) {
    const signIn = new Set(replaced.filter((g) => g.identity_scopes.length > 0).map((g) => g.id));
    const pairs = sql`unnest(${moves.map((m) => m.from)}::bigint[], ${moves.map((m) => m.to)}::bigint[], ${moves.map((m) => signIn.has(m.from))}::boolean[]) as m(from_id, to_id, sign_in)`;
    // Every refresh token of the grant, used ones too: a retired token replayed later still
    // revokes the family. By (organization_id, grant_id), the index refresh tokens have. One
    // left with no scope of data lives on only for a grant that signs in (OpenID scopes).
    await sql`update refresh_tokens r set grant_id = m.to_id,
        scopes = array(select s from unnest(r.scopes) s where ${keeps(sql`s`)}),
        revoked_at = case when exists (select 1 from unnest(r.scopes) s where ${keeps(sql`s`)}) or m.sign_in then r.revoked_at else coalesce(r.revoked_at, now()) end
      from ${pairs} where r.organization_id = ${selection.organizationId} and r.grant_id = m.from_id`.execute(trx);
  }
  await trx.updateTable('grants').set({ revoked_at: sql`now()`, revoked_reason: 'role_changed' }).where('id', '=', sql<number>`any(${oldIds}::bigint[])`).execute();
  // Grants left with nothing: their refresh tokens end with them.
  const emptied = narrowed.filter((g) => !g.lives).map((g) => g.id);
  if (emptied.length > 0) {
    await trx
      .updateTable('refresh_tokens')
      .set({ revoked_at: sql`now()` })
      .where('organization_id', '=', selection.organizationId)
      .where('grant_id', '=', sql<number>`any(${emptied}::bigint[])`)
      .where('revoked_at', 'is', null)
      .execute();
  }
  const successorOf = new Map(moves.map((m) => [m.from, m.to]));
  await trx
    .insertInto('audit_events')
    .values(
      narrowed.map((g) => ({
        organization_id: g.organization_id,
        action: g.lives ? 'grant.narrowed' : 'grant.revoked',
        actor_user_id: actor.actorUserId ?? null,
        actor_client_id: actor.actorClientId ?? null,
        details: JSON.stringify(
          g.lives
            ? { grant_id: successorOf.get(g.id), replaced_grant_id: g.id, application_id: g.application_id, user_id: g.user_id, scopes: g.kept.join(' '), removed_scopes: g.scopes.filter((s) => !kept(s)).join(' '), reason: 'role_changed' }
            : { grant_id: g.id, application_id: g.application_id, user_id: g.user_id, reason: 'role_changed' },
        ),
      })),
    )
    .execute();
  await sql`select pg_notify(${REVOCATION_CHANNEL}, ${oldIds.join(',')})`.execute(trx);
  return oldIds;
}

/**
 * Narrows the selected users' grants to `allowed` (see narrowBatch), a batch at a time, within
 * the caller's transaction (the role change that causes it). Returns the revoked grant ids, for
 * the caller to tell its memory once the transaction has committed.
 */
export async function narrowGrantsInTransaction(trx: Transaction<Database>, selection: NarrowSelection, allowed: GrantAllowance, actor: Actor = {}): Promise<number[]> {
  const revoked: number[] = [];
  for (;;) {
    const ids = await narrowBatch(trx, selection, allowed, actor, revoked.at(-1) ?? 0);
    revoked.push(...ids);
    if (ids.length === 0) return revoked;
  }
}

/**
 * Narrows the selected users' grants a batch at a time, each batch in a transaction of its own
 * (short locks: code redemptions and refreshes of the same members go on between batches), and
 * tells `memory` of each batch once it has committed. `allowed` is read again inside each batch
 * (it share-locks the role it reads), so a role changed again meanwhile is followed; undefined
 * (the role is gone) ends the narrowing. For a role held by many members: the role's own change
 * commits first, and refreshes and redemptions check the role from then on, so no new token
 * carries a removed scope while the batches run. Returns the number of grants narrowed.
 */
export async function narrowGrantsInBatches(
  db: DB,
  selection: NarrowSelection,
  allowed: (trx: Transaction<Database>) => Promise<GrantAllowance | undefined>,
  actor: Actor = {},
  memory?: RevokedGrantsMemory,
): Promise<number> {
  let count = 0;
  let cursor = 0;
  for (;;) {
    const ids = await db.transaction().execute(async (trx) => {
      const now = await allowed(trx);
      return now === undefined ? [] : narrowBatch(trx, selection, now, actor, cursor);
    });
    if (ids.length === 0) return count;
    memory?.noteRevoked(ids, 'role_changed');
    count += ids.length;
    cursor = ids.at(-1)!;
  }
}

/**
 * The live grant that `grantId` became: itself while live, else the successor a narrowing
 * replaced it with (narrowBatch), followed as far as it goes; undefined when none is live. A
 * replayed authorization code revokes this one, as RFC 6749 §4.1.2 wants the tokens it led to.
 */
export async function liveSuccessor(db: DB, grantId: number): Promise<number | undefined> {
  const { rows } = await sql<{ id: number }>`
    with recursive chain(id, depth) as (
      select id, 0 from grants where id = ${grantId}
      union all
      select g.id, chain.depth + 1 from grants g join chain on g.narrowed_from_grant_id = chain.id where chain.depth < 100
    )
    select chain.id from chain join grants using (id) where grants.revoked_at is null order by chain.depth desc limit 1`.execute(db);
  return rows[0]?.id;
}

/** Revokes one grant (see revokeBatch). Returns false when it was already revoked or does not exist. */
export async function revokeGrant(db: DB, grantId: number, reason: RevocationReason, actor: Actor = {}): Promise<boolean> {
  return (await inTransaction(db, (trx) => revokeBatch(trx, { grantId }, reason, actor))).length > 0;
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
    await recordAuditEvent(trx, {
      organizationId: token.organizationId,
      action: 'access_token.revoked',
      actor,
      details: { grant_id: token.grantId, jti: token.jti, reason },
    });
    // Delivered to every instance (RevocationList) when the transaction commits.
    await sql`select pg_notify(${REVOCATION_CHANNEL}, ${`jti ${token.jti} ${token.exp}`})`.execute(trx);
    return true;
  });
}

/** A live grant as the connected-apps lists show it (dashboard, management API, CLI). */
export interface LiveGrant {
  id: number;
  scopes: string[];
  created_at: Date;
  last_used_at: Date | null;
  application_client_id: string;
  application_name: string;
  application_type: 'public' | 'private';
  /** null: the application acting for itself. */
  user_id: number | null;
  user_email: string | null;
}

function liveGrants(db: DB, organizationId: number) {
  return db
    .selectFrom('grants')
    .innerJoin('applications', 'applications.id', 'grants.application_id')
    .leftJoin('users', 'users.id', 'grants.user_id')
    .select([
      'grants.id',
      // Everything granted, as its tokens carry it: the OpenID scopes, then the data scopes.
      sql<string[]>`grants.identity_scopes || grants.scopes`.as('scopes'),
      'grants.created_at',
      'grants.last_used_at',
      'applications.client_id as application_client_id',
      'applications.name as application_name',
      // A resource's credentials hold no grant (migration 0029): an organization's grants are its applications'.
      sql<'public' | 'private'>`applications.type`.as('application_type'),
      'grants.user_id',
      'users.email as user_email',
    ])
    .where('grants.organization_id', '=', organizationId)
    .where('grants.revoked_at', 'is', null);
}

/**
 * The organization's connected apps (live grants), newest first, a page at a time: keyset on
 * the partial index of live grants, so a page costs the same however many were revoked.
 */
export async function listLiveGrants(
  db: DB,
  organizationId: number,
  page: { beforeId: number | undefined; limit: number; /** Only the grants this user gave. */ userId?: number | undefined },
): Promise<LiveGrant[]> {
  return liveGrants(db, organizationId)
    .$if(page.userId !== undefined, (qb) => qb.where('grants.user_id', '=', page.userId ?? 0))
    .$if(page.beforeId !== undefined, (qb) => qb.where('grants.id', '<', page.beforeId ?? 0))
    .orderBy('grants.id', 'desc')
    .limit(page.limit)
    .execute();
}

/** A live grant of the organization, or undefined (revoked, missing, or another organization's). */
export async function findLiveGrant(db: DB, organizationId: number, grantId: number): Promise<LiveGrant | undefined> {
  return liveGrants(db, organizationId).where('grants.id', '=', grantId).executeTakeFirst();
}

/**
 * The end of a statement that redeems a code (an authorization code, an approved device code):
 * from its `consumed` CTE (grant_id, organization_id, user_id, scopes, identity_scopes,
 * auth_time, sid, amr, sso_connection_id, resource_id) the grant and its first refresh token, in the same statement,
 * so all or nothing (R-5). The caller's final select reads `consumed` where exists `refresh`.
 */
export function grantWithRefreshTokenSql(v: {
  applicationId: Expression<number>;
  /** sha256Hex of the refresh token. */
  refreshTokenHash: Expression<string>;
  ttlSeconds: Expression<number>;
  dpopJkt: Expression<string | null>;
}): RawBuilder<unknown> {
  return sql`grant_row as (
      insert into grants (id, organization_id, application_id, user_id, scopes, identity_scopes, auth_time, sid, amr, sso_connection_id, resource_id, last_used_at, dpop_jkt) overriding system value
      select grant_id, organization_id, ${v.applicationId}, user_id, scopes, identity_scopes, auth_time, sid, amr, sso_connection_id, resource_id, now(), ${v.dpopJkt}::text from consumed
      returning id
    ),
    refresh as (
      insert into refresh_tokens (token_hash, organization_id, grant_id, scopes, expires_at)
      select ${v.refreshTokenHash}, c.organization_id, c.grant_id, c.scopes, now() + make_interval(secs => ${v.ttlSeconds})
      from consumed c join grant_row g on g.id = c.grant_id
      returning id
    )`;
}
