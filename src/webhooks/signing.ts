/**
 * The headers of a webhook request, per Standard Webhooks (standardwebhooks.com, WH-1), made with
 * its reference library so that receivers verifying with any of its libraries agree with us
 * byte for byte.
 *
 * - `webhook-id`: the event's message_id, the same on every attempt, so a receiver can drop a
 *   retry of something it already processed (delivery is at least once).
 * - `webhook-timestamp`: this attempt's time in seconds; receivers refuse stale ones (replays).
 * - `webhook-signature`: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`, once per secret in
 *   use. During the day after a rotation the previous secret signs too, space separated, so a
 *   receiver still holding the old secret keeps verifying until it has switched.
 */
import { Webhook } from 'standardwebhooks';

export const WEBHOOK_USER_AGENT = 'orgauth-webhooks/1';

export interface SignedRequest {
  messageId: string;
  /** The exact bytes sent: the signature covers them, not a re-serialization. */
  body: string;
  /** Current secret first, then the previous one while it still signs. */
  secrets: readonly string[];
  at: Date;
}

export function webhookHeaders(request: SignedRequest): Record<string, string> {
  const signatures = request.secrets.map((secret) => new Webhook(secret).sign(request.messageId, request.at, request.body));
  return {
    'content-type': 'application/json',
    'user-agent': WEBHOOK_USER_AGENT,
    'webhook-id': request.messageId,
    'webhook-timestamp': String(Math.floor(request.at.getTime() / 1000)),
    'webhook-signature': signatures.join(' '),
  };
}
