/**
 * Pushed authorization requests (RFC 9126): the parameters a client posted to /oauth/par, kept
 * under a request_uri the browser then carries to /oauth/authorize instead of them.
 *
 * - The request_uri is 256 random bits; only its SHA-256 is stored.
 * - It is usable 60 seconds (expires_in) until first used at /oauth/authorize, only with the
 *   client_id it was pushed by (§4).
 * - Single use (§4, "one-time use"): it makes one authorization code, or one denial; the first
 *   code consumes it in the transaction that issues the code. Between its first use and that,
 *   the same browser's sign-in and consent pages carry it (the sign-in may take longer than a
 *   minute), for at most SIGN_IN_WINDOW_S; RFC 9126 §4 allows such repeats ("a user reloading").
 * - expires_at is always when the row stops being usable: 60 s after the push, moved to the end of
 *   the sign-in window at first use, and to the moment it is used up. The retention sweep
 *   (src/retention.ts) deletes rows past it, so nothing outlives its use (DO-1).
 * - At most MAX_PENDING_PER_CLIENT usable ones per client, counted in the database so every
 *   instance agrees: each is a row anyone who knows a public client_id could make.
 */
import { sql } from 'kysely';
import type { DB } from '../../db/connect.js';
import { generateSecret, sha256Hex } from '../../lib/crypto.js';
import { TooManyAttemptsError } from '../errors.js';

export const REQUEST_URI_PREFIX = 'urn:ietf:params:oauth:request_uri:';
/** RFC 9126 §2.2 expires_in: a minute to reach the authorization endpoint. */
export const PUSHED_REQUEST_TTL_S = 60;
/** From its first use, how long its sign-in and consent may take. */
const SIGN_IN_WINDOW_S = 15 * 60;
/**
 * Usable pushed requests (neither used up nor expired) one client may have at once: a minute of
 * pushes its users have not reached yet, and the sign-ins under way. Beyond it a push is refused
 * (429) until some are used or expire.
 */
export const MAX_PENDING_PER_CLIENT = 1000;

export interface PushedRequest {
  id: number;
  params: Record<string, string>;
  /** The key of the DPoP proof that came with the push, or its dpop_jkt (RFC 9449 §10.1). */
  dpopJkt: string | null;
}

/** Keeps a pushed request of `applicationId`, unless it has MAX_PENDING_PER_CLIENT usable ones already (429). */
export async function pushAuthorizationRequest(db: DB, input: { applicationId: number; params: Record<string, string>; dpopJkt: string | null }): Promise<{ requestUri: string; expiresIn: number }> {
  // Counted without a lock, as device authorizations are: pushes at the same moment may pass the
  // cap by as many as are in flight, which the per-client rate limit of /oauth/par bounds.
  const pending = await db
    .selectFrom((eb) =>
      eb
        .selectFrom('pushed_authorization_requests')
        .select('id')
        .where('application_id', '=', input.applicationId)
        .where('expires_at', '>', sql<Date>`now()`)
        .where('consumed_at', 'is', null)
        .limit(MAX_PENDING_PER_CLIENT)
        .as('p'),
    )
    .select((eb) => eb.fn.countAll<string>().as('n'))
    .executeTakeFirstOrThrow();
  if (Number(pending.n) >= MAX_PENDING_PER_CLIENT) {
    throw new TooManyAttemptsError(PUSHED_REQUEST_TTL_S, 'too many pushed authorization requests of this client are waiting for their users; retry later');
  }
  const requestUri = `${REQUEST_URI_PREFIX}${generateSecret(32)}`;
  await db
    .insertInto('pushed_authorization_requests')
    .values({
      request_uri_hash: sha256Hex(requestUri),
      application_id: input.applicationId,
      params: JSON.stringify(input.params),
      dpop_jkt: input.dpopJkt,
      expires_at: sql<Date>`now() + make_interval(secs => ${PUSHED_REQUEST_TTL_S})`,
    })
    .execute();
  return { requestUri, expiresIn: PUSHED_REQUEST_TTL_S };
}

/**
 * The pushed request `requestUri` names, for `applicationId`, while usable (marking its first
 * use); undefined when unknown, another client's, expired, or already used for a code.
 */
export async function usePushedRequest(db: DB, requestUri: string, applicationId: number): Promise<PushedRequest | undefined> {
  if (!requestUri.startsWith(REQUEST_URI_PREFIX) || requestUri.length > 200) return undefined;
  const row = await db
    .updateTable('pushed_authorization_requests')
    // First use: the sign-in window starts, and with it the row's new expiry.
    .set({
      first_used_at: sql`coalesce(first_used_at, now())`,
      expires_at: sql`case when first_used_at is null then now() + make_interval(secs => ${SIGN_IN_WINDOW_S}) else expires_at end`,
    })
    .where('request_uri_hash', '=', sha256Hex(requestUri))
    .where('application_id', '=', applicationId)
    .where('consumed_at', 'is', null)
    .where('expires_at', '>', sql<Date>`now()`)
    .returning(['id', 'params', 'dpop_jkt'])
    .executeTakeFirst();
  return row ? { id: row.id, params: row.params, dpopJkt: row.dpop_jkt } : undefined;
}

/**
 * Uses the pushed request up, in the transaction that issues its code (or records its denial);
 * false when another did first. It expires with it: the next retention sweep deletes it.
 */
export async function consumePushedRequest(trx: DB, id: number): Promise<boolean> {
  const row = await trx.updateTable('pushed_authorization_requests').set({ consumed_at: sql`now()`, expires_at: sql`now()` }).where('id', '=', id).where('consumed_at', 'is', null).returning('id').executeTakeFirst();
  return row !== undefined;
}
