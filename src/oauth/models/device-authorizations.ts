/**
 * Device authorizations (RFC 8628): what a device without a browser asked for, waiting for a
 * person to enter its user code on /device and decide.
 *
 * The device code is a 256-bit secret held by the device and stored as its SHA-256 (CD-4). The
 * user code is what a person reads off a screen and types: 8 letters from 20 consonants
 * (RFC 8628 §6.1: no vowels, so no words; no look-alikes such as 0/O or 1/I), about 34.6 bits,
 * shown as `BCDF-GHJK`. It is unique among pending authorizations and looked up only among
 * pending, unexpired ones, and only by exact match; guessing is throttled by the page.
 *
 * status: pending → approved or denied (the person, on /device), approved → consumed (the token
 * request that redeems it, src/oauth/grants/device-code.ts), or expired by time.
 */
import { randomInt } from 'node:crypto';
import { sql } from 'kysely';
import type { Transaction, Updateable } from 'kysely';
import type { DB } from '../../db/connect.js';
import { isUniqueViolation } from '../../db/errors.js';
import type { ApplicationRegistration, Database, DeviceAuthorizationsTable } from '../../db/schema.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';
import { TooManyAttemptsError } from '../errors.js';

/** RFC 8628 §6.1: consonants only, none easily mistaken for another. */
export const USER_CODE_ALPHABET = 'BCDFGHJKLMNPQRSTVWXZ';
export const USER_CODE_LENGTH = 8;
const USER_CODE = new RegExp(`^[${USER_CODE_ALPHABET}]{${USER_CODE_LENGTH}}$`);
/** What a person may type around the letters: spaces and dashes, in any case. */
const USER_CODE_DECORATION = /[\s-]+/g;
/** Longer input is not a code however it is decorated (and is not worth normalizing). */
const USER_CODE_INPUT_MAX = 64;
/**
 * Pending authorizations one client may have at once. Each is a row anyone who knows a public
 * client_id can create, and each pending user code is one more a guess could hit.
 */
export const MAX_PENDING_PER_CLIENT = 10_000;

/** The stored form of what a person typed (`bcdf ghjk`, `BCDF-GHJK`), or undefined when it cannot be a user code. */
export function normalizeUserCode(input: string): string | undefined {
  if (input.length > USER_CODE_INPUT_MAX) return undefined;
  const code = input.replace(USER_CODE_DECORATION, '').toUpperCase();
  return USER_CODE.test(code) ? code : undefined;
}

/** How a user code is shown and sent: `BCDF-GHJK`. */
export function formatUserCode(code: string): string {
  return `${code.slice(0, USER_CODE_LENGTH / 2)}-${code.slice(USER_CODE_LENGTH / 2)}`;
}

function newUserCode(): string {
  let code = '';
  for (let i = 0; i < USER_CODE_LENGTH; i++) code += USER_CODE_ALPHABET[randomInt(USER_CODE_ALPHABET.length)];
  return code;
}

export interface NewDeviceAuthorization {
  applicationId: number;
  resourceId: number | null;
  scopes: readonly string[];
  identityScopes: readonly string[];
  ttlSeconds: number;
  intervalSeconds: number;
}

/** Creates a pending authorization; returns the device code and the user code (stored form), each shown once. */
export async function createDeviceAuthorization(db: DB, input: NewDeviceAuthorization): Promise<{ deviceCode: string; userCode: string }> {
  const pending = await db
    .selectFrom((eb) =>
      eb
        .selectFrom('device_authorizations')
        .select('id')
        .where('application_id', '=', input.applicationId)
        .where('status', '=', 'pending')
        .where('expires_at', '>', sql<Date>`now()`)
        .limit(MAX_PENDING_PER_CLIENT)
        .as('p'),
    )
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .executeTakeFirstOrThrow();
  if (Number(pending.n) >= MAX_PENDING_PER_CLIENT) throw new TooManyAttemptsError(60, 'too many device authorizations of this client are waiting for their users; retry later');
  // A user code is unique among pending ones: on the rare collision, draw again.
  for (let attempt = 1; ; attempt++) {
    const deviceCode = generateSecret(32);
    const userCode = newUserCode();
    try {
      await db
        .insertInto('device_authorizations')
        .values({
          device_code_hash: sha256Hex(deviceCode),
          user_code: userCode,
          application_id: input.applicationId,
          resource_id: input.resourceId,
          scopes: [...input.scopes],
          identity_scopes: [...input.identityScopes],
          interval_s: input.intervalSeconds,
          expires_at: sql<Date>`now() + make_interval(secs => ${input.ttlSeconds})`,
        })
        .execute();
      return { deviceCode, userCode };
    } catch (err) {
      if (attempt >= 5 || !isUniqueViolation(err)) throw err;
    }
  }
}

/** A pending authorization as /device shows it, with its client. */
export interface PendingDeviceAuthorization {
  id: number;
  userCode: string;
  resourceId: number | null;
  scopes: string[];
  identityScopes: string[];
  application: { id: number; clientId: string; name: string; registration: ApplicationRegistration };
}

/** The pending, unexpired authorization with exactly this user code (stored form), of an enabled client. */
export async function findPendingDeviceAuthorization(db: DB, userCode: string): Promise<PendingDeviceAuthorization | undefined> {
  const row = await db
    .selectFrom('device_authorizations as d')
    .innerJoin('applications as a', 'a.id', 'd.application_id')
    .select(['d.id', 'd.user_code', 'd.resource_id', 'd.scopes', 'd.identity_scopes', 'a.id as application_id', 'a.client_id', 'a.name', 'a.registration'])
    .where('d.user_code', '=', userCode)
    .where('d.status', '=', 'pending')
    .where('d.expires_at', '>', sql<Date>`now()`)
    .where('a.disabled', '=', false)
    .executeTakeFirst();
  if (!row) return undefined;
  return {
    id: row.id,
    userCode: row.user_code,
    resourceId: row.resource_id,
    scopes: row.scopes,
    identityScopes: row.identity_scopes,
    application: { id: row.application_id, clientId: row.client_id, name: row.name, registration: row.registration },
  };
}

export interface DeviceApproval {
  userId: number;
  organizationId: number;
  /** The scopes asked for that the user's role in the organization allows. */
  grantedScopes: readonly string[];
  authTime: Date;
  amr: readonly string[];
  /** The SSO connection the approving session was signed in through (SS-4); null: not through SSO. */
  ssoConnectionId: number | null;
}

/**
 * Records the user's approval, if the authorization is still pending and unexpired (of two
 * decisions at once, the first wins). Takes a transaction: the caller audits it in the same one.
 */
export function approveDeviceAuthorization(trx: Transaction<Database>, id: number, approval: DeviceApproval): Promise<boolean> {
  return recordDecision(trx, id, {
    status: 'approved',
    user_id: approval.userId,
    organization_id: approval.organizationId,
    granted_scopes: [...approval.grantedScopes],
    auth_time: approval.authTime,
    amr: [...approval.amr],
    sso_connection_id: approval.ssoConnectionId,
  });
}

/** Records the user's refusal, if the authorization is still pending and unexpired: the device's next poll gets access_denied. */
export function denyDeviceAuthorization(db: DB, id: number, userId: number): Promise<boolean> {
  return recordDecision(db, id, { status: 'denied', user_id: userId });
}

/** A decision on a pending, unexpired authorization; false when it was decided already or expired. */
async function recordDecision(db: DB, id: number, decision: Updateable<DeviceAuthorizationsTable>): Promise<boolean> {
  const row = await db
    .updateTable('device_authorizations')
    .set(decision)
    .where('id', '=', id)
    .where('status', '=', 'pending')
    .where('expires_at', '>', sql<Date>`now()`)
    .returning('id')
    .executeTakeFirst();
  return row !== undefined;
}
