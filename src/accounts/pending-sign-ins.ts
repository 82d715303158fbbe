/**
 * A sign-in that has not finished: the browser gave its password (or nothing yet, for a
 * passkey) and has a second step to take. It is its own table and its own cookie, never a
 * session: nothing that accepts a session (the dashboard, consent, /oauth/authorize) reads it,
 * so a password alone reaches nothing while a second factor is due (MF-2).
 *
 * The row also holds the WebAuthn challenge this browser was given, so a challenge is single
 * use and bound to the browser that asked for it (MF-4): takeChallenge clears it in the
 * statement that reads it.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { generateSecret, sha256Hex } from '../lib/crypto.js';
import { cookieSecurity } from './sessions.js';

/** Ten minutes to take the second step (or to finish a passkey ceremony). */
export const PENDING_SIGN_IN_TTL_SECONDS = 10 * 60;

export interface PendingSignIn {
  idHash: string;
  /** Null for a passwordless passkey sign-in: the passkey says who it is when it finishes. */
  userId: number | null;
  /** The factors already given (RFC 8176 values): ['pwd'] after the password. */
  amr: string[];
  returnTo: string;
  /** The social connection the first step was made through, if it was. */
  socialConnectionId: number | null;
}

/** Starts a pending sign-in and sets its cookie; returns its id_hash (to give it a challenge). */
export async function startPendingSignIn(
  db: DB,
  config: Config,
  reply: FastifyReply,
  input: { userId: number | null; amr: readonly string[]; returnTo: string; socialConnectionId?: number },
): Promise<string> {
  const id = generateSecret(32);
  const idHash = sha256Hex(id);
  await db
    .insertInto('pending_sign_ins')
    .values({
      id_hash: idHash,
      user_id: input.userId,
      amr: [...input.amr],
      social_connection_id: input.socialConnectionId ?? null,
      return_to: input.returnTo,
      expires_at: new Date(Date.now() + PENDING_SIGN_IN_TTL_SECONDS * 1000),
    })
    .execute();
  // Housekeeping: this user's expired ones are of no use (retention sweeps the rest).
  if (input.userId !== null) await db.deleteFrom('pending_sign_ins').where('user_id', '=', input.userId).where('expires_at', '<=', new Date()).execute();
  const { secure, names } = cookieSecurity(config);
  reply.setCookie(names.pendingSignIn, id, { httpOnly: true, sameSite: 'lax', path: '/', secure, maxAge: PENDING_SIGN_IN_TTL_SECONDS });
  return idHash;
}

function pendingCookie(req: FastifyRequest, config: Config): string | undefined {
  const value = req.cookies[cookieSecurity(config).names.pendingSignIn];
  return value !== undefined && /^[A-Za-z0-9_-]{43}$/.test(value) ? value : undefined;
}

/** The browser's pending sign-in, while it has not expired. */
export async function findPendingSignIn(db: DB, config: Config, req: FastifyRequest): Promise<PendingSignIn | undefined> {
  const id = pendingCookie(req, config);
  if (id === undefined) return undefined;
  const row = await db
    .selectFrom('pending_sign_ins')
    .select(['id_hash', 'user_id', 'amr', 'return_to', 'social_connection_id'])
    .where('id_hash', '=', sha256Hex(id))
    .where('expires_at', '>', new Date())
    .executeTakeFirst();
  return row ? { idHash: row.id_hash, userId: row.user_id, amr: row.amr, returnTo: row.return_to, socialConnectionId: row.social_connection_id } : undefined;
}

/** Gives the pending sign-in a new WebAuthn challenge (the last one given is the only one that counts). */
export async function setChallenge(db: DB, idHash: string, challenge: string): Promise<void> {
  await db.updateTable('pending_sign_ins').set({ challenge }).where('id_hash', '=', idHash).execute();
}

/**
 * The challenge, used up by this read: a second response to it finds none. RETURNING gives the
 * row as updated (the challenge already null: PostgreSQL before 18 has no RETURNING OLD), so the
 * old value comes from a subquery that locks the row; of two racing takes, the second re-reads
 * the row after the first commits, finds no challenge, and gets nothing.
 */
export async function takeChallenge(db: DB, idHash: string): Promise<string | undefined> {
  const row = await db
    .updateTable('pending_sign_ins as p')
    .from((eb) =>
      eb
        .selectFrom('pending_sign_ins')
        .select(['id_hash', 'challenge'])
        .where('id_hash', '=', idHash)
        .where('challenge', 'is not', null)
        .where('expires_at', '>', new Date())
        .forUpdate()
        .as('old'),
    )
    .set({ challenge: null })
    .whereRef('p.id_hash', '=', 'old.id_hash')
    .where('p.challenge', 'is not', null)
    .returning('old.challenge')
    .executeTakeFirst();
  return row?.challenge ?? undefined;
}

/** Ends the pending sign-in (done, or abandoned): true when this call ended it (one of two racing finishes wins). */
export async function endPendingSignIn(db: DB, config: Config, reply: FastifyReply, idHash: string): Promise<boolean> {
  const ended = await db.deleteFrom('pending_sign_ins').where('id_hash', '=', idHash).executeTakeFirst();
  const { secure, names } = cookieSecurity(config);
  reply.clearCookie(names.pendingSignIn, { httpOnly: true, sameSite: 'lax', path: '/', secure });
  return ended.numDeletedRows > 0n;
}
