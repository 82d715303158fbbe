import type { DB } from '../db/connect.js';

/**
 * Who acted: a user (dashboard, consent), a client (/oauth/revoke, reuse detection, the
 * management API), both (a user's token), or neither (the system, the operator's CLI). A user
 * acting through a setup link (accounts/setup-links.ts) is not a member: the link says by what
 * right they acted, and every event they cause carries it in its details (`setup_link_id`), so
 * each domain module records it without knowing of links.
 */
export interface Actor {
  actorUserId?: number | null | undefined;
  actorClientId?: string | null | undefined;
  setupLinkId?: number | null | undefined;
}

export interface AuditEventInput {
  organizationId: number;
  /** e.g. 'application.created', 'application.secret_rotated', 'member.added', 'grant.revoked'. */
  action: string;
  actor?: Actor | undefined;
  /** Never secrets: ids, names, reasons. */
  details?: Record<string, unknown>;
}

/** Appends an event to the organization's audit log; pass a transaction to make it part of the change. */
export async function recordAuditEvent(db: DB, event: AuditEventInput): Promise<void> {
  await db
    .insertInto('audit_events')
    .values({
      organization_id: event.organizationId,
      action: event.action,
      actor_user_id: event.actor?.actorUserId ?? null,
      actor_client_id: event.actor?.actorClientId ?? null,
      details: JSON.stringify(withSetupLink(event.details ?? {}, event.actor)),
    })
    .execute();
}

function withSetupLink(details: Record<string, unknown>, actor: Actor | undefined): Record<string, unknown> {
  const id = actor?.setupLinkId;
  return id === undefined || id === null ? details : { ...details, setup_link_id: id };
}

export interface AuditEventRow {
  id: number;
  action: string;
  actor_user_id: number | null;
  actor_email: string | null;
  actor_client_id: string | null;
  details: Record<string, unknown>;
  created_at: Date;
}

/** An organization's audit log, newest first, a page at a time (keyset on the (organization_id, id desc) index). */
export async function listAuditEvents(db: DB, organizationId: number, page: { beforeId: number | undefined; limit: number }): Promise<AuditEventRow[]> {
  return db
    .selectFrom('audit_events')
    .leftJoin('users', 'users.id', 'audit_events.actor_user_id')
    .select([
      'audit_events.id',
      'audit_events.action',
      'audit_events.actor_user_id',
      'users.email as actor_email',
      'audit_events.actor_client_id',
      'audit_events.details',
      'audit_events.created_at',
    ])
    .where('audit_events.organization_id', '=', organizationId)
    .$if(page.beforeId !== undefined, (qb) => qb.where('audit_events.id', '<', page.beforeId ?? 0))
    .orderBy('audit_events.id', 'desc')
    .limit(page.limit)
    .execute();
}

/**
 * A person's own security log (account_events): how they sign in changed, a recovery code was
 * used, the second step locked. It belongs to the user, whatever organizations they are in; the
 * Account page lists it.
 */
export async function recordAccountEvent(db: DB, event: { userId: number; action: string; details?: Record<string, unknown> }): Promise<void> {
  await db
    .insertInto('account_events')
    .values({ user_id: event.userId, action: event.action, details: JSON.stringify(event.details ?? {}) })
    .execute();
}

/** The user's newest account events (the (user_id, id) index, newest first). */
export async function listAccountEvents(db: DB, userId: number, limit = 20) {
  return db
    .selectFrom('account_events')
    .select(['id', 'action', 'details', 'created_at'])
    .where('user_id', '=', userId)
    .orderBy('id', 'desc')
    .limit(limit)
    .execute();
}
