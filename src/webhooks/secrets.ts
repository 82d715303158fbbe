/**
 * Webhook signing secrets: `whsec_` and 32 random bytes in base64, as Standard Webhooks
 * (standardwebhooks.com) and its libraries expect them. Stored sealed with SECRET_KEY (the
 * sender needs the secret itself to sign, so a digest will not do); shown once, when created or
 * rotated.
 */
import { randomBytes } from 'node:crypto';
import { openText, sealText } from '../lib/crypto.js';

const SEAL_PURPOSE = 'webhook-secret';
export const WEBHOOK_SECRET_PREFIX = 'whsec_';

export function newWebhookSecret(): string {
  return WEBHOOK_SECRET_PREFIX + randomBytes(32).toString('base64');
}

export function sealWebhookSecret(secretKey: string, secret: string): string {
  return sealText(secretKey, SEAL_PURPOSE, secret);
}

export function openWebhookSecret(secretKey: string, sealed: string): string {
  return openText(secretKey, SEAL_PURPOSE, sealed);
}

/** How long a rotated-out secret keeps signing beside the new one. */
export const PREVIOUS_SECRET_SECONDS = 24 * 3600;
