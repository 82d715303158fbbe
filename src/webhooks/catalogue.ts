/**
 * The events an organization's webhook endpoints may subscribe to. Each is an audited change
 * (src/audit/events.ts): a trigger on audit_events turns the audit entry into an event for every
 * enabled endpoint of the organization that wants it, in the change's own transaction
 * (migration 0017). The payload is `{ type, timestamp, data }`: `data` is the audit entry's
 * details plus `organization_id` and `actor` ({ user_id, client_id }); docs/webhooks.md shows
 * each type's data.
 */
export const WEBHOOK_EVENT_TYPES = [
  'member.added',
  'member.role_changed',
  'member.removed',
  'invitation.created',
  'invitation.accepted',
  'invitation.revoked',
  'role.created',
  'role.updated',
  'role.deleted',
  'application.created',
  'application.updated',
  'application.secret_rotated',
  'application.disabled',
  'application.deleted',
  'grant.created',
  'grant.revoked',
  'organization.updated',
  'directory.user.created',
  'directory.user.updated',
  'directory.user.deactivated',
  'directory.user.reactivated',
  'directory.user.deleted',
  'directory.group.created',
  'directory.group.updated',
  'directory.group.deleted',
] as const;

export type WebhookEventType = (typeof WEBHOOK_EVENT_TYPES)[number];

const TYPES: ReadonlySet<string> = new Set(WEBHOOK_EVENT_TYPES);

export function isWebhookEventType(type: string): type is WebhookEventType {
  return TYPES.has(type);
}

/** The event a test ping sends (POST /webhooks/:id/ping): delivered whatever the endpoint subscribes to. */
export const PING_EVENT_TYPE = 'webhook.ping';

/** The channel the dispatcher listens on; the outbox trigger (migration 0017), a ping and a retry notify it. */
export const WEBHOOK_CHANNEL = 'orgauth_webhooks';
