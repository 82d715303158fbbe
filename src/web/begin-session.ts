/** The one way a browser becomes signed in, after whatever steps its sign-in took. */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { createSession, currentUser, deleteSession, setSessionCookie } from '../accounts/sessions.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { sha256Hex } from '../lib/crypto.js';

/**
 * Where to go next: a 303 for a form; for a page script's fetch (`json`, the passkey
 * ceremonies) `{ redirect }`, and the script navigates, since fetch would follow a 303 itself.
 */
export function goTo(reply: FastifyReply, path: string, json = false) {
  return json ? reply.code(200).send({ redirect: path }) : reply.redirect(path, 303);
}

/**
 * Starts a new session and sets its cookie; returns its id. Never reuses the one the browser
 * brought (no session fixation), and a session raised by a second step gets a new id too, so a
 * copy of the old cookie stays what it was (one step) and then ends. A new session of the same
 * user keeps the dashboard's current organization.
 */
export async function replaceSession(
  db: DB,
  config: Config,
  req: FastifyRequest,
  reply: FastifyReply,
  input: { userId: number; amr: readonly string[]; currentOrganizationId?: number; ssoConnectionId?: number; socialConnectionId?: number },
): Promise<string> {
  const previous = await currentUser(db, config, req);
  let currentOrganizationId = input.currentOrganizationId ?? null;
  if (previous) {
    if (previous.userId === input.userId && currentOrganizationId === null) {
      const row = await db.selectFrom('sessions').select('current_organization_id').where('id_hash', '=', sha256Hex(previous.sessionId)).executeTakeFirst();
      currentOrganizationId = row?.current_organization_id ?? null;
    }
    await deleteSession(db, previous.sessionId);
  }
  const sessionId = await createSession(db, input.userId, { client: { userAgent: req.headers['user-agent'], ip: req.ip }, amr: input.amr, currentOrganizationId, ssoConnectionId: input.ssoConnectionId ?? null, socialConnectionId: input.socialConnectionId ?? null });
  setSessionCookie(reply, config, sessionId);
  return sessionId;
}

/** Organizations a sign-in is counted for, at most: a person in more sees it counted in the first ones. */
const SIGN_IN_COUNTED_ORGANIZATIONS = 1000;

/** A completed sign-in counts once in each organization the user is a member of (the Overview's "sign-ins"). */
async function countSignIn(db: DB, req: FastifyRequest, userId: number): Promise<void> {
  try {
    const rows = await db.selectFrom('memberships').select('organization_id').where('user_id', '=', userId).orderBy('organization_id').limit(SIGN_IN_COUNTED_ORGANIZATIONS).execute();
    for (const row of rows) req.server.activity.count(row.organization_id, 'sign_ins');
  } catch (err) {
    // The person is signed in (the cookie is set): a count is not worth an error page.
    req.log.warn({ err }, 'could not count a sign-in');
  }
}

/** Signs the browser in (replaceSession) and goes on to `returnTo`, counting the sign-in. */
export async function beginSession(
  db: DB,
  config: Config,
  req: FastifyRequest,
  reply: FastifyReply,
  input: { userId: number; amr: readonly string[]; returnTo: string; json?: boolean; currentOrganizationId?: number; ssoConnectionId?: number; socialConnectionId?: number },
) {
  await replaceSession(db, config, req, reply, input);
  await countSignIn(db, req, input.userId);
  return goTo(reply, input.returnTo, input.json);
}
