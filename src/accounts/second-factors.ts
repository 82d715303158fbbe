/**
 * Second factors: an authenticator app (TOTP, RFC 6238) and single-use recovery codes, and the
 * second step's count of wrong codes. Passkeys are passkeys.ts; both count as a second factor.
 *
 * - TOTP: SHA-1, 6 digits, 30 s, one step of drift either way (otplib). The secret is sealed
 *   under a key derived from SECRET_KEY (lib/crypto.ts), as the outbox's bodies are. Enrolment
 *   completes only with one correct code. A code signs in once: the newest step accepted is
 *   kept, and the statement that accepts a code also moves it forward, so a replay (or two
 *   requests racing with one code) finds the step taken (MF-1).
 * - Recovery codes: ten, 60 random bits each, shown once; stored as HMAC-SHA256 under a key
 *   derived from SECRET_KEY; one statement marks a code used, so of two racing uses exactly one
 *   wins (MF-3).
 * - Wrong codes count per user in the database, so across instances: MAX_FAILURES in the window
 *   lock the second step for LOCK_MS, recorded on the account and mailed to the user once.
 */
import { createHmac, randomInt } from 'node:crypto';
import { sql } from 'kysely';
import { recordAccountEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { ConflictError, NotFoundError } from '../errors.js';
import { deriveKey, openText, sealText, sha256Hex } from '../lib/crypto.js';
import { lazyImport } from '../lib/lazy.js';
import type { MailQueue } from '../mail/outbox.js';
import { securityNoticeMessage } from '../mail/messages.js';
import { TooManyAttemptsError } from '../oauth/errors.js';

/** otplib and qrcode, loaded when an authenticator app is first set up or checked. */
const otplib = lazyImport(() => import('otplib'));
const qrcode = lazyImport(() => import('qrcode'));

export const TOTP_PERIOD_S = 30;
export const TOTP_DIGITS = 6;
/** RFC 6238 §5.2: one step of drift either way. */
const TOTP_TOLERANCE_S = TOTP_PERIOD_S;
/** A started enrolment not confirmed in this long is started again with a new secret. */
const ENROLMENT_TTL_MS = 60 * 60 * 1000;
export const RECOVERY_CODE_COUNT = 10;
/** Crockford's base32 without I, L, O, U: 12 characters are 60 bits. */
const RECOVERY_ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz';
const RECOVERY_CODE_LENGTH = 12;
export const SECOND_STEP_MAX_FAILURES = 10;
export const SECOND_STEP_WINDOW_MS = 15 * 60 * 1000;
export const SECOND_STEP_LOCK_MS = 15 * 60 * 1000;
const SEAL_PURPOSE = 'totp-secret';

export interface FactorDeps {
  secretKey: string;
  issuer: string;
  mail: MailQueue;
}

export interface FactorUser {
  id: number;
  email: string;
  name: string;
}

/** How the user can take a second step: what the Account page and the second-step page show. */
export interface FactorSummary {
  totp: boolean;
  recoveryCodesLeft: number;
  passkeys: number;
}

export async function factorSummary(db: DB, userId: number): Promise<FactorSummary> {
  const row = await db
    .selectNoFrom((eb) => [
      eb.exists(eb.selectFrom('totp_factors').select('user_id').where('user_id', '=', userId).where('confirmed_at', 'is not', null)).as('totp'),
      eb.selectFrom('recovery_codes').select((e) => e.fn.countAll<string>().as('n')).where('user_id', '=', userId).where('used_at', 'is', null).as('codes'),
      eb.selectFrom('passkeys').select((e) => e.fn.countAll<string>().as('n')).where('user_id', '=', userId).as('passkeys'),
    ])
    .executeTakeFirstOrThrow();
  return { totp: Boolean(row.totp), recoveryCodesLeft: Number(row.codes ?? 0), passkeys: Number(row.passkeys ?? 0) };
}

/** Whether the user has a second factor (a confirmed authenticator app or a passkey): then a password alone never signs them in. */
export function hasSecondFactor(summary: FactorSummary): boolean {
  return summary.totp || summary.passkeys > 0;
}

/** A change to how the user signs in, as the account's log records it and the user's mail says it. */
export interface AccountNotice {
  action: string;
  subject: string;
  what: string;
  details?: Record<string, unknown>;
}

/**
 * Runs `work` in one transaction with the notices it gives (`note`), and wakes the outbox once
 * that has committed: every change to how a user signs in goes through here. The transaction
 * first locks the user's row, so changes and second-step attempts of one user are taken one at
 * a time on every instance (two racing "new recovery codes" leave one set; concurrent wrong
 * codes get no more tries than the lock allows).
 */
export async function changeSignInMethods<T>(
  db: DB,
  deps: Pick<FactorDeps, 'issuer' | 'mail'>,
  user: FactorUser,
  work: (trx: DB, note: (event: AccountNotice) => Promise<void>) => Promise<T>,
): Promise<T> {
  let noted = false;
  const result = await inTransaction(db, async (trx) => {
    await trx.selectFrom('users').select('id').where('id', '=', user.id).forUpdate().execute();
    // A notice is recorded on the account and mailed, in this transaction.
    return work(trx, async (event) => {
      await recordAccountEvent(trx, { userId: user.id, action: event.action, ...(event.details ? { details: event.details } : {}) });
      await deps.mail.queue(trx, securityNoticeMessage({ issuer: deps.issuer, to: user.email, name: user.name, subject: event.subject, what: event.what, at: new Date() }));
      noted = true;
    });
  });
  if (noted) deps.mail.wake();
  return result;
}

export interface TotpEnrolment {
  /** Base32, as authenticator apps take it typed in. */
  secret: string;
  /** otpauth://totp/... (Key Uri Format), what the QR code holds. */
  uri: string;
  /** The QR code as inline SVG markup (made here, from the URI: no third party sees the secret). */
  qrSvg: string;
}

/** The label and issuer an authenticator app shows: this server's host, and the user's email. */
async function totpUri(deps: Pick<FactorDeps, 'issuer'>, email: string, secret: string): Promise<string> {
  return (await otplib()).generateURI({ issuer: new URL(deps.issuer).host, label: email, secret, period: TOTP_PERIOD_S, digits: TOTP_DIGITS, algorithm: 'sha1' });
}

/**
 * Starts (or shows again) adding an authenticator app from the session `sessionId`: a secret
 * kept sealed and unconfirmed until confirmTotp sees a correct code from that same session. Only
 * the session that started it sees the key (a copied cookie of another session does not).
 * Conflict when the user already has one.
 */
export async function startTotpEnrolment(db: DB, deps: FactorDeps, user: FactorUser, sessionId: string): Promise<TotpEnrolment> {
  const session = sha256Hex(sessionId);
  const existing = await db.selectFrom('totp_factors').select(['secret_sealed', 'confirmed_at', 'created_at', 'started_session_hash']).where('user_id', '=', user.id).executeTakeFirst();
  if (existing?.confirmed_at) throw new ConflictError('An authenticator app is already set up. Remove it first to set up another.');
  if (existing && existing.started_session_hash === session && Date.now() - existing.created_at.getTime() < ENROLMENT_TTL_MS) {
    return enrolmentFor(deps, user, openText(deps.secretKey, SEAL_PURPOSE, existing.secret_sealed));
  }
  const secret = (await otplib()).generateSecret({ length: 20 });
  const sealed = sealText(deps.secretKey, SEAL_PURPOSE, secret);
  const values = { secret_sealed: sealed, created_at: new Date(), started_session_hash: session, last_step: null };
  await db
    .insertInto('totp_factors')
    .values({ user_id: user.id, ...values })
    .onConflict((oc) => oc.column('user_id').where('confirmed_at', 'is', null).doUpdateSet(values))
    .execute();
  return enrolmentFor(deps, user, secret);
}

/** The unconfirmed enrolment this session started, while it lasts (the Account page shows it again). */
export async function pendingTotpEnrolment(db: DB, deps: FactorDeps, user: FactorUser, sessionId: string): Promise<TotpEnrolment | undefined> {
  const row = await db
    .selectFrom('totp_factors')
    .select(['secret_sealed', 'created_at'])
    .where('user_id', '=', user.id)
    .where('confirmed_at', 'is', null)
    .where('started_session_hash', '=', sha256Hex(sessionId))
    .executeTakeFirst();
  if (!row || Date.now() - row.created_at.getTime() >= ENROLMENT_TTL_MS) return undefined;
  return enrolmentFor(deps, user, openText(deps.secretKey, SEAL_PURPOSE, row.secret_sealed));
}

async function enrolmentFor(deps: Pick<FactorDeps, 'issuer'>, user: FactorUser, secret: string): Promise<TotpEnrolment> {
  const uri = await totpUri(deps, user.email, secret);
  return { secret, uri, qrSvg: await (await qrcode()).default.toString(uri, { type: 'svg', errorCorrectionLevel: 'M', margin: 2 }) };
}

/** The RFC 6238 step a 6-digit code matches now (± one step), or undefined. ASCII digits only. */
async function matchingStep(secret: string, code: string): Promise<number | undefined> {
  if (!/^[0-9]{6}$/.test(code)) return undefined;
  const result = await (await otplib()).verify({ secret, token: code, epochTolerance: TOTP_TOLERANCE_S, period: TOTP_PERIOD_S, digits: TOTP_DIGITS, algorithm: 'sha1' });
  return result.valid && 'timeStep' in result ? result.timeStep : undefined;
}

/**
 * Confirms the enrolment this session started with one correct code. Returns the recovery codes
 * to show once when the user had none left (a first factor), or [] when they keep theirs;
 * undefined when the code is wrong. A wrong code counts toward the second step's lock (and is
 * refused while it is locked), so the confirmation is no way around it.
 */
export async function confirmTotp(db: DB, deps: FactorDeps, user: FactorUser, sessionId: string, code: string): Promise<string[] | undefined> {
  const outcome = await changeSignInMethods(db, deps, user, async (trx, note): Promise<{ codes?: string[]; lockedFor?: number }> => {
    const lockedFor = await secondStepLockedFor(trx, user.id);
    if (lockedFor !== undefined) return { lockedFor };
    const pending = await trx
      .selectFrom('totp_factors')
      .select(['secret_sealed', 'confirmed_at', 'created_at', 'started_session_hash'])
      .where('user_id', '=', user.id)
      .executeTakeFirst();
    if (!pending || pending.confirmed_at || pending.started_session_hash !== sha256Hex(sessionId)) throw new ConflictError('Start setting up the authenticator app again.');
    if (Date.now() - pending.created_at.getTime() >= ENROLMENT_TTL_MS) throw new ConflictError('That setup took too long. Start again with a new code.');
    const typed = code.trim();
    const step = typed.length <= CODE_MAX_LENGTH ? await matchingStep(openText(deps.secretKey, SEAL_PURPOSE, pending.secret_sealed), typed) : undefined;
    if (step === undefined) return (await recordSecondStepFailure(trx, user, note)) ? { lockedFor: Math.ceil(SECOND_STEP_LOCK_MS / 1000) } : {};
    // The confirming code proves the app works; it is not a sign-in, so the first sign-in may
    // use the same code (a person who signs out at once and back in types what the app still
    // shows). Codes of earlier steps stay refused.
    await trx.updateTable('totp_factors').set({ confirmed_at: new Date(), last_step: step - 1 }).where('user_id', '=', user.id).execute();
    const fresh = await recoveryCodesForNewFactor(trx, deps, user.id);
    await note({
      action: 'second_factor.totp_added',
      subject: 'An authenticator app was added to your account',
      what: 'An authenticator app was set up for two-step sign-in on your account.',
    });
    return { codes: fresh };
  });
  if (outcome.lockedFor !== undefined) throw new TooManyAttemptsError(outcome.lockedFor, LOCKED);
  return outcome.codes;
}

/** Removes the authenticator app (the caller has checked the password or a fresh passkey). */
export async function removeTotp(db: DB, deps: FactorDeps, user: FactorUser): Promise<void> {
  await changeSignInMethods(db, deps, user, async (trx, note) => {
    const removed = await trx.deleteFrom('totp_factors').where('user_id', '=', user.id).where('confirmed_at', 'is not', null).executeTakeFirst();
    if (removed.numDeletedRows === 0n) throw new NotFoundError('No authenticator app is set up.');
    await dropRecoveryCodesWithoutFactor(trx, user.id);
    await note({
      action: 'second_factor.totp_removed',
      subject: 'An authenticator app was removed from your account',
      what: 'The authenticator app was removed from your account.',
    });
  });
}

/** With no second factor left, recovery codes recover nothing: they go too. */
export async function dropRecoveryCodesWithoutFactor(trx: DB, userId: number): Promise<void> {
  await trx
    .deleteFrom('recovery_codes')
    .where('user_id', '=', userId)
    .where((eb) =>
      eb.and([
        eb.not(eb.exists(eb.selectFrom('totp_factors').select('user_id').where('user_id', '=', userId).where('confirmed_at', 'is not', null))),
        eb.not(eb.exists(eb.selectFrom('passkeys').select('id').where('user_id', '=', userId))),
      ]),
    )
    .execute();
}

function recoveryCodeHash(deps: Pick<FactorDeps, 'secretKey'>, userId: number, normalized: string): string {
  return createHmac('sha256', deriveKey(deps.secretKey, 'recovery-codes')).update(`${userId}:${normalized}`, 'utf8').digest('hex');
}

/** A code as typed: case, spaces and dashes do not matter; undefined when it cannot be one. */
function normalizeRecoveryCode(code: string): string | undefined {
  const normalized = code.toLowerCase().replace(/[\s-]/g, '');
  return normalized.length === RECOVERY_CODE_LENGTH && [...normalized].every((c) => RECOVERY_ALPHABET.includes(c)) ? normalized : undefined;
}

/**
 * For a factor just added: ten recovery codes, to show once, when the user has none left (a
 * first factor, or all used); [] when they keep the ones they have.
 */
export async function recoveryCodesForNewFactor(trx: DB, deps: Pick<FactorDeps, 'secretKey'>, userId: number): Promise<string[]> {
  const left = await trx.selectFrom('recovery_codes').select('id').where('user_id', '=', userId).where('used_at', 'is', null).limit(1).execute();
  return left.length === 0 ? replaceRecoveryCodes(trx, deps, userId) : [];
}

/** Ten new codes (the old ones stop working), returned once in `xxxx-xxxx-xxxx` form. */
async function replaceRecoveryCodes(trx: DB, deps: Pick<FactorDeps, 'secretKey'>, userId: number): Promise<string[]> {
  await trx.deleteFrom('recovery_codes').where('user_id', '=', userId).execute();
  const codes = Array.from({ length: RECOVERY_CODE_COUNT }, () => Array.from({ length: RECOVERY_CODE_LENGTH }, () => RECOVERY_ALPHABET[randomInt(RECOVERY_ALPHABET.length)]).join(''));
  await trx
    .insertInto('recovery_codes')
    .values(codes.map((code) => ({ user_id: userId, code_hash: recoveryCodeHash(deps, userId, code) })))
    .execute();
  return codes.map((code) => code.match(/.{4}/g)!.join('-'));
}

/** New recovery codes for a user who has a second factor (the caller has checked the password). */
export async function regenerateRecoveryCodes(db: DB, deps: FactorDeps, user: FactorUser): Promise<string[]> {
  return changeSignInMethods(db, deps, user, async (trx, note) => {
    if (!hasSecondFactor(await factorSummary(trx, user.id))) throw new ConflictError('Set up an authenticator app or a passkey first.');
    const fresh = await replaceRecoveryCodes(trx, deps, user.id);
    await note({
      action: 'second_factor.recovery_codes_regenerated',
      subject: 'New recovery codes were made for your account',
      what: 'New recovery codes were made for your account; the old ones no longer work.',
    });
    return fresh;
  });
}

export type SecondStepMethod = 'otp' | 'recovery_code';

/** Seconds the user's second step stays locked, or undefined when it is open (read under changeSignInMethods's lock). */
async function secondStepLockedFor(trx: DB, userId: number): Promise<number | undefined> {
  const row = await trx.selectFrom('users').select('second_step_locked_until').where('id', '=', userId).executeTakeFirst();
  const until = row?.second_step_locked_until;
  return until && until.getTime() > Date.now() ? Math.ceil((until.getTime() - Date.now()) / 1000) : undefined;
}

const LOCKED = 'Too many wrong codes. Two-step sign-in is locked for a while; try again later.';
/** Longer than any code: refused (and counted) without being looked at. */
const CODE_MAX_LENGTH = 64;

/**
 * The second step with a code: a current authenticator-app code, or one unused recovery code.
 * The method on success; undefined on a wrong, used, malformed or over-long code, which counts
 * toward the lock. Throws TooManyAttemptsError while locked, and on the failure that locks it.
 *
 * One transaction per attempt, holding the user's row (changeSignInMethods) from the lock check
 * to the failure count: attempts of one user are taken one at a time, on every instance, so
 * concurrent wrong codes get no more than SECOND_STEP_MAX_FAILURES tries between them.
 */
export async function verifySecondStepCode(db: DB, deps: FactorDeps, user: FactorUser, code: string): Promise<SecondStepMethod | undefined> {
  const outcome = await changeSignInMethods(db, deps, user, async (trx, note): Promise<{ method?: SecondStepMethod; lockedFor?: number }> => {
    const lockedFor = await secondStepLockedFor(trx, user.id);
    if (lockedFor !== undefined) return { lockedFor };
    const typed = code.trim();
    const method = typed.length <= CODE_MAX_LENGTH ? await acceptCode(trx, deps, user, typed, note) : undefined;
    if (method !== undefined) return { method };
    return (await recordSecondStepFailure(trx, user, note)) ? { lockedFor: Math.ceil(SECOND_STEP_LOCK_MS / 1000) } : {};
  });
  // Thrown after the commit: the failure that locks the step is counted, recorded and mailed.
  if (outcome.lockedFor !== undefined) throw new TooManyAttemptsError(outcome.lockedFor, LOCKED);
  return outcome.method;
}

/** The code, accepted (and used up) in `trx`: 'otp', 'recovery_code', or undefined. */
async function acceptCode(trx: DB, deps: FactorDeps, user: FactorUser, typed: string, note: (event: AccountNotice) => Promise<void>): Promise<SecondStepMethod | undefined> {
  if (/^[0-9]{6}$/.test(typed)) {
    const factor = await trx.selectFrom('totp_factors').select('secret_sealed').where('user_id', '=', user.id).where('confirmed_at', 'is not', null).executeTakeFirst();
    if (!factor) return undefined;
    const step = await matchingStep(openText(deps.secretKey, SEAL_PURPOSE, factor.secret_sealed), typed);
    if (step === undefined) return undefined;
    // MF-1: the step moves forward in the statement that accepts the code, so it is used once.
    const taken = await trx
      .updateTable('totp_factors')
      .set({ last_step: step })
      .where('user_id', '=', user.id)
      .where('confirmed_at', 'is not', null)
      .where((eb) => eb.or([eb('last_step', 'is', null), eb('last_step', '<', step)]))
      .executeTakeFirst();
    return taken.numUpdatedRows > 0n ? 'otp' : undefined;
  }
  const normalized = normalizeRecoveryCode(typed);
  if (normalized === undefined) return undefined;
  // MF-3: one statement marks the code used; of two racing uses exactly one gets a row back.
  const used = await trx
    .updateTable('recovery_codes')
    .set({ used_at: sql`now()` })
    .where('user_id', '=', user.id)
    .where('code_hash', '=', recoveryCodeHash(deps, user.id, normalized))
    .where('used_at', 'is', null)
    .returning('id')
    .executeTakeFirst();
  if (!used) return undefined;
  const left = await trx.selectFrom('recovery_codes').select((e) => e.fn.countAll<string>().as('n')).where('user_id', '=', user.id).where('used_at', 'is', null).executeTakeFirstOrThrow();
  await note({
    action: 'second_factor.recovery_code_used',
    subject: 'A recovery code was used to sign in to your account',
    what: `A recovery code was used to sign in to your account. ${Number(left.n)} unused recovery codes are left.`,
    details: { left: Number(left.n) },
  });
  return 'recovery_code';
}

/**
 * A wrong code, counted in `trx` (which holds the user's row); true when it is the one that
 * makes MAX_FAILURES in the window and starts the lock (recorded and mailed once).
 */
async function recordSecondStepFailure(trx: DB, user: FactorUser, note: (event: AccountNotice) => Promise<void>): Promise<boolean> {
  const now = new Date();
  await trx.insertInto('second_step_failures').values({ user_id: user.id, failed_at: now }).execute();
  const { n } = await trx
    .selectFrom('second_step_failures')
    .select((e) => e.fn.countAll<string>().as('n'))
    .where('user_id', '=', user.id)
    .where('failed_at', '>', new Date(now.getTime() - SECOND_STEP_WINDOW_MS))
    .executeTakeFirstOrThrow();
  if (Number(n) < SECOND_STEP_MAX_FAILURES) return false;
  await trx.updateTable('users').set({ second_step_locked_until: new Date(now.getTime() + SECOND_STEP_LOCK_MS) }).where('id', '=', user.id).execute();
  // The lock starts a new count: the failures that caused it do not lock again when it ends.
  await trx.deleteFrom('second_step_failures').where('user_id', '=', user.id).execute();
  await note({
    action: 'second_factor.locked',
    subject: 'Two-step sign-in to your account was locked',
    what: `Someone typed ${SECOND_STEP_MAX_FAILURES} wrong codes at the second step of signing in to your account, after your password. The second step is locked for ${SECOND_STEP_LOCK_MS / 60_000} minutes. If this was not you, your password is known to someone else: change it.`,
  });
  return true;
}

/**
 * An administrator's account recovery (`orgauth user reset-mfa`): every second factor of the
 * user goes (authenticator app, recovery codes, passkeys), recorded and mailed, and their
 * sessions and pending sign-ins end (a reset may follow a takeover). The next sign-in is with
 * the password alone until they set a factor up again. Their grants stay (revoke them from
 * Connected apps if the account was taken over).
 */
export async function resetSecondFactors(db: DB, deps: Pick<FactorDeps, 'issuer' | 'mail'>, user: FactorUser): Promise<{ totp: boolean; recoveryCodes: number; passkeys: number }> {
  return changeSignInMethods(db, deps, user, async (trx, note) => {
    const totp = await trx.deleteFrom('totp_factors').where('user_id', '=', user.id).executeTakeFirst();
    const codes = await trx.deleteFrom('recovery_codes').where('user_id', '=', user.id).executeTakeFirst();
    const passkeys = await trx.deleteFrom('passkeys').where('user_id', '=', user.id).executeTakeFirst();
    await trx.updateTable('users').set({ second_step_locked_until: null }).where('id', '=', user.id).execute();
    await trx.deleteFrom('second_step_failures').where('user_id', '=', user.id).execute();
    // A reset may follow a takeover: whatever was signed in (with the factors now gone) ends too.
    await trx.deleteFrom('sessions').where('user_id', '=', user.id).execute();
    await trx.deleteFrom('pending_sign_ins').where('user_id', '=', user.id).execute();
    const result = { totp: totp.numDeletedRows > 0n, recoveryCodes: Number(codes.numDeletedRows), passkeys: Number(passkeys.numDeletedRows) };
    await note({
      action: 'second_factor.reset_by_administrator',
      subject: 'Two-step sign-in was turned off for your account',
      what: 'An administrator removed the second factors of your account (authenticator app, recovery codes and passkeys). Sign in with your password and set up two-step sign-in again.',
      details: { totp: result.totp, recovery_codes: result.recoveryCodes, passkeys: result.passkeys },
    });
    return result;
  });
}
