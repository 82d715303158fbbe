/**
 * Passkeys: WebAuthn (Level 2, with Level 3's passkey flags) public key credentials, through
 * @simplewebauthn/server. A passkey signs in without a password (it is discoverable, and the
 * authenticator verifies the user: two factors in one), or is the second step after one.
 *
 * - Relying party: its ID is ISSUER's hostname and the only origin accepted is ISSUER's origin.
 * - User handle (the `user.id` an authenticator keeps with a discoverable credential):
 *   HMAC-SHA256 of the user's id under a key derived from SECRET_KEY. Stable, so every passkey
 *   of a user carries the same handle and a sign-in can check it names the credential's owner
 *   (§7.2 step 6) without another column; and not the bare user id, which the WebAuthn spec
 *   asks never to put there (§14.6.1, the handle must not identify the user to others).
 * - Challenges are single use and bound to one browser: a signed-in session's lives in
 *   sessions.webauthn_challenge, a sign-in's in its pending_sign_ins row; reading one clears it
 *   in the same statement (ChallengeSlot).
 * - The signature counter (§6.1.1): a response whose counter does not move forward (unless the
 *   authenticator keeps none: both zero) is refused and recorded as passkey.counter_regression
 *   on the account, as a sign that the credential may have been copied.
 */
import { createHmac } from 'node:crypto';
import type {
  AuthenticationResponseJSON,
  PublicKeyCredentialCreationOptionsJSON,
  PublicKeyCredentialRequestOptionsJSON,
  RegistrationResponseJSON,
} from '@simplewebauthn/server';
import { sql } from 'kysely';
import { z } from 'zod';
import { recordAccountEvent } from '../audit/events.js';
import type { DB } from '../db/connect.js';
import { ConflictError, InvalidRequestError, NotFoundError } from '../errors.js';
import { deriveKey, sha256Hex } from '../lib/crypto.js';
import { lazyImport } from '../lib/lazy.js';
import { setChallenge, takeChallenge } from './pending-sign-ins.js';
import { changeSignInMethods, dropRecoveryCodesWithoutFactor, type FactorDeps, type FactorUser, recoveryCodesForNewFactor } from './second-factors.js';

/** @simplewebauthn/server, loaded at the first ceremony (a third of a second of a start otherwise). */
const webauthn = lazyImport(() => import('@simplewebauthn/server'));

export const PASSKEYS_PER_USER = 20;
export const PASSKEY_NAME_MAX = 100;
const RP_NAME = 'orgauth';
/** §15.1 recommends 5 to 10 minutes when user verification is required; a pending sign-in lasts 10. */
const CEREMONY_TIMEOUT_MS = 5 * 60_000;
const TRANSPORTS = new Set(['ble', 'cable', 'hybrid', 'internal', 'nfc', 'smart-card', 'usb']);

export type PasskeyDeps = Pick<FactorDeps, 'issuer' | 'secretKey' | 'mail'>;

/** The relying party: ISSUER's hostname (an IP address cannot be one) and origin. */
export function relyingParty(issuer: string): { id: string; origin: string } {
  const url = new URL(issuer);
  return { id: url.hostname, origin: url.origin };
}

/** The user handle of `userId`'s passkeys (see the top of this file): 32 bytes. */
export function userHandle(secretKey: string, userId: number): Uint8Array<ArrayBuffer> {
  return new Uint8Array(createHmac('sha256', deriveKey(secretKey, 'webauthn-user-handle')).update(`webauthn-user:${userId}`, 'utf8').digest());
}

/** Where a ceremony's challenge waits for its response: `take` clears it in the statement that reads it. */
export interface ChallengeSlot {
  put(challenge: string): Promise<void>;
  take(): Promise<string | undefined>;
}

/** A sign-in's challenge: its pending_sign_ins row (the browser's pending cookie). */
export function pendingSignInSlot(db: DB, idHash: string): ChallengeSlot {
  return { put: (challenge) => setChallenge(db, idHash, challenge), take: () => takeChallenge(db, idHash) };
}

/** A signed-in session's challenge (adding a passkey, or a step-up): sessions.webauthn_challenge. */
export function sessionSlot(db: DB, sessionId: string): ChallengeSlot {
  const idHash = sha256Hex(sessionId);
  return {
    put: async (challenge) => {
      await db.updateTable('sessions').set({ webauthn_challenge: challenge }).where('id_hash', '=', idHash).execute();
    },
    take: async () => {
      // As pending-sign-ins.ts takeChallenge: RETURNING sees the row as updated, so the old
      // value comes from a subquery that locks the row (a racing second take then finds none).
      const row = await db
        .updateTable('sessions as s')
        .from((eb) => eb.selectFrom('sessions').select(['id', 'webauthn_challenge']).where('id_hash', '=', idHash).where('webauthn_challenge', 'is not', null).forUpdate().as('old'))
        .set({ webauthn_challenge: null })
        .whereRef('s.id', '=', 'old.id')
        .where('s.webauthn_challenge', 'is not', null)
        .returning('old.webauthn_challenge')
        .executeTakeFirst();
      return row?.webauthn_challenge ?? undefined;
    },
  };
}

// What a browser sends back (PublicKeyCredential.toJSON(), as @simplewebauthn/browser makes it),
// bounded: base64url only, and no longer than any real authenticator needs.
const base64url = (max: number) => z.string().min(1).max(max).regex(/^[A-Za-z0-9_-]+$/, 'must be base64url');
/** A credential id is at most 1023 bytes (§4, Credential ID): 1364 base64url characters. */
const credentialId = base64url(1400);

/** What every PublicKeyCredential carries besides its response. */
const credential = {
  id: credentialId,
  rawId: credentialId,
  type: z.literal('public-key'),
  authenticatorAttachment: z.enum(['platform', 'cross-platform']).optional(),
  clientExtensionResults: z.record(z.string(), z.unknown()).default({}),
};

export const registrationResponseSchema = z.object({
  ...credential,
  response: z.object({
    clientDataJSON: base64url(4096),
    attestationObject: base64url(32_768),
    transports: z.array(z.string().max(32)).max(16).optional(),
  }),
});

export const authenticationResponseSchema = z.object({
  ...credential,
  response: z.object({
    clientDataJSON: base64url(4096),
    authenticatorData: base64url(4096),
    signature: base64url(8192),
    userHandle: base64url(128).optional(),
  }),
});

/** A passkey's name as typed: trimmed, 1 to 100 characters, "Passkey" when left empty. */
export const passkeyNameSchema = z
  .string()
  .max(1000)
  .transform((name) => name.trim() || 'Passkey')
  .pipe(z.string().max(PASSKEY_NAME_MAX, `must be at most ${PASSKEY_NAME_MAX} characters`));

const START_AGAIN = 'This passkey request has expired or was used already. Try again.';
const NOT_VERIFIED = 'The passkey could not be verified. Try again.';
const NOT_RECOGNISED = 'This passkey is not registered for this account.';

/**
 * §7.1 steps 1-2 (registration): options for navigator.credentials.create(), the challenge kept
 * in the session. A discoverable credential with user verification, so that the passkey alone
 * signs in; excludeCredentials (§5.4) stops an authenticator registering twice.
 */
export async function registrationOptions(db: DB, deps: PasskeyDeps, user: FactorUser, sessionId: string): Promise<PublicKeyCredentialCreationOptionsJSON> {
  const existing = await db.selectFrom('passkeys').select(['credential_id', 'transports']).where('user_id', '=', user.id).execute();
  if (existing.length >= PASSKEYS_PER_USER) throw new ConflictError(`You have ${PASSKEYS_PER_USER} passkeys, the most an account can have. Remove one first.`);
  const options = await (await webauthn()).generateRegistrationOptions({
    rpName: RP_NAME,
    rpID: relyingParty(deps.issuer).id,
    userID: userHandle(deps.secretKey, user.id),
    userName: user.email,
    userDisplayName: user.name || user.email,
    timeout: CEREMONY_TIMEOUT_MS,
    attestationType: 'none',
    excludeCredentials: existing.map((p) => ({ id: p.credential_id, transports: p.transports })),
    authenticatorSelection: { residentKey: 'required', requireResidentKey: true, userVerification: 'required' },
  });
  await sessionSlot(db, sessionId).put(options.challenge);
  return options;
}

/**
 * §7.1 (registration) steps 3-26, by verifyRegistrationResponse: the challenge this session was
 * given (used up whatever the outcome), our origin, the SHA-256 of our RP ID, user presence and
 * verification, a supported algorithm. Then step 22 (the credential id is new to this server:
 * the unique index) and storing it. Recorded on the account and mailed.
 */
export async function addPasskey(db: DB, deps: PasskeyDeps, user: FactorUser, sessionId: string, response: RegistrationResponseJSON, name: string): Promise<{ id: number; backedUp: boolean; recoveryCodes: string[] }> {
  const expectedChallenge = await sessionSlot(db, sessionId).take();
  if (expectedChallenge === undefined) throw new InvalidRequestError(START_AGAIN);
  const rp = relyingParty(deps.issuer);
  let info;
  try {
    const verification = await (await webauthn()).verifyRegistrationResponse({ response, expectedChallenge, expectedOrigin: rp.origin, expectedRPID: rp.id, requireUserPresence: true, requireUserVerification: true });
    if (!verification.verified) throw new Error('registration not verified');
    info = verification.registrationInfo;
  } catch (err) {
    throw new InvalidRequestError(NOT_VERIFIED, { cause: err });
  }
  const { credential, credentialBackedUp } = info;
  // changeSignInMethods takes one change of the user's at a time, so the limit holds against two racing additions.
  const added = await changeSignInMethods(db, deps, user, async (trx, note) => {
    const { n } = await trx.selectFrom('passkeys').select((e) => e.fn.countAll<string>().as('n')).where('user_id', '=', user.id).executeTakeFirstOrThrow();
    if (Number(n) >= PASSKEYS_PER_USER) throw new ConflictError(`You have ${PASSKEYS_PER_USER} passkeys, the most an account can have. Remove one first.`);
    const row = await trx
      .insertInto('passkeys')
      .values({
        user_id: user.id,
        credential_id: credential.id,
        public_key: credential.publicKey,
        sign_count: credential.counter,
        transports: [...new Set(credential.transports ?? [])].filter((t) => TRANSPORTS.has(t)),
        backed_up: credentialBackedUp,
        name,
      })
      .onConflict((oc) => oc.column('credential_id').doNothing())
      .returning('id')
      .executeTakeFirst();
    if (!row) throw new ConflictError('This passkey is registered already.');
    const recoveryCodes = await recoveryCodesForNewFactor(trx, deps, user.id);
    await note({
      action: 'passkey.added',
      subject: 'A passkey was added to your account',
      what: `A passkey named "${name}" was added to your account. It signs you in without your password.`,
      details: { passkey_id: row.id, name },
    });
    return { id: row.id, recoveryCodes };
  });
  return { ...added, backedUp: credentialBackedUp };
}

/**
 * Removes one of the user's passkeys (the caller has checked the password); NotFound for
 * anyone else's. The last second factor gone, recovery codes go too.
 */
export async function removePasskey(db: DB, deps: PasskeyDeps, user: FactorUser, passkeyId: number): Promise<string> {
  return changeSignInMethods(db, deps, user, async (trx, note) => {
    const removed = await trx.deleteFrom('passkeys').where('id', '=', passkeyId).where('user_id', '=', user.id).returning('name').executeTakeFirst();
    if (!removed) throw new NotFoundError('There is no such passkey on your account.');
    await dropRecoveryCodesWithoutFactor(trx, user.id);
    await note({
      action: 'passkey.removed',
      subject: 'A passkey was removed from your account',
      what: `The passkey named "${removed.name}" was removed from your account; it no longer signs you in.`,
      details: { passkey_id: passkeyId, name: removed.name },
    });
    return removed.name;
  });
}

/**
 * §7.2 steps 1-2 (authentication): options for navigator.credentials.get(), the challenge kept in
 * `slot`. Without `userId` (no password yet) any discoverable passkey of ours may answer;
 * with it (the second step), only that user's.
 */
export async function authenticationOptions(db: DB, deps: PasskeyDeps, slot: ChallengeSlot, userId?: number): Promise<PublicKeyCredentialRequestOptionsJSON> {
  const allowCredentials =
    userId === undefined
      ? undefined
      : (await db.selectFrom('passkeys').select(['credential_id', 'transports']).where('user_id', '=', userId).execute()).map((p) => ({ id: p.credential_id, transports: p.transports }));
  const options = await (await webauthn()).generateAuthenticationOptions({ rpID: relyingParty(deps.issuer).id, allowCredentials, userVerification: 'required', timeout: CEREMONY_TIMEOUT_MS });
  await slot.put(options.challenge);
  return options;
}

export interface PasskeyAssertion {
  userId: number;
  passkeyId: number;
  /** BS: a synced passkey (RFC 8176 `swk`), or one bound to its device (`hwk`). */
  backedUp: boolean;
}

/**
 * §7.2 (authentication) steps 3-21. Any failure is an InvalidRequestError (400) and the
 * challenge is used up either way, so a response is good once at most.
 */
export async function verifyPasskeyAssertion(db: DB, deps: PasskeyDeps, slot: ChallengeSlot, response: AuthenticationResponseJSON, expectedUserId?: number): Promise<PasskeyAssertion> {
  const expectedChallenge = await slot.take();
  if (expectedChallenge === undefined) throw new InvalidRequestError(START_AGAIN);
  // Steps 5-6: a credential registered here; when the user was known before (the second step),
  // one of theirs. The user handle, which a discoverable credential must return, names its owner.
  const passkey = await db
    .selectFrom('passkeys')
    .select(['id', 'user_id', 'credential_id', 'public_key', 'sign_count', 'transports'])
    .where('credential_id', '=', response.id)
    .executeTakeFirst();
  if (!passkey || (expectedUserId !== undefined && passkey.user_id !== expectedUserId)) throw new InvalidRequestError(NOT_RECOGNISED);
  const handle = response.response.userHandle;
  const owner = Buffer.from(userHandle(deps.secretKey, passkey.user_id)).toString('base64url');
  if (handle === undefined ? expectedUserId === undefined : handle !== owner) throw new InvalidRequestError(NOT_RECOGNISED);
  // Steps 7-20: client data type, challenge, origin; RP ID hash; UP and UV flags; the signature.
  const rp = relyingParty(deps.issuer);
  let info;
  try {
    const verification = await (await webauthn()).verifyAuthenticationResponse({
      response,
      expectedChallenge,
      expectedOrigin: rp.origin,
      expectedRPID: rp.id,
      requireUserVerification: true,
      // Counter 0: the library would refuse a regression before checking the signature; step 21
      // is below, once the signature is known good, so a regression recorded is a real one.
      credential: { id: passkey.credential_id, publicKey: new Uint8Array(passkey.public_key), counter: 0, transports: passkey.transports },
    });
    if (!verification.verified) throw new Error('authentication not verified');
    info = verification.authenticationInfo;
  } catch (err) {
    throw new InvalidRequestError(NOT_VERIFIED, { cause: err });
  }
  // Step 21: the counter must move forward unless the authenticator keeps none (both zero). The
  // statement that stores the new counter also checks it, so two racing uses cannot both pass.
  const counter = info.newCounter;
  const used = await db
    .updateTable('passkeys')
    .set({ sign_count: counter, last_used_at: sql<Date>`now()`, backed_up: info.credentialBackedUp })
    .where('id', '=', passkey.id)
    .where('sign_count', counter === 0 ? '=' : '<', counter)
    .executeTakeFirst();
  if (used.numUpdatedRows === 0n) {
    await recordAccountEvent(db, { userId: passkey.user_id, action: 'passkey.counter_regression', details: { passkey_id: passkey.id, stored: passkey.sign_count, received: counter } });
    throw new InvalidRequestError('This passkey gave a signature counter that went backwards, a sign it may have been copied. It was refused; use another passkey or your password.');
  }
  return { userId: passkey.user_id, passkeyId: passkey.id, backedUp: info.credentialBackedUp };
}
