import type { DB } from '../db/connect.js';

export interface AuditEventInput {
  organizationId: number;
  /** e.g. 'application.created', 'application.secret_rotated', 'member.added', 'grant.revoked'. */
  action: string;
  actorUserId?: number | null;
  actorClientId?: string | null;
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
      actor_user_id: event.actorUserId ?? null,
      actor_client_id: event.actorClientId ?? null,
      details: JSON.stringify(event.details ?? {}),
    })
    .execute();
}
