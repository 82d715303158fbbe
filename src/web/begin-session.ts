/** The one way a browser becomes signed in, after whatever steps its sign-in took. */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { createSession, currentUser, deleteSession, setSessionCookie } from '../accounts/sessions.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';

/**
 * Where to go next: a 303 for a form; for a page script's fetch (`json`, the passkey
 * ceremonies) `{ redirect }`, and the script navigates, since fetch would follow a 303 itself.
 */
export function goTo(reply: FastifyReply, path: string, json = false) {
  return json ? reply.code(200).send({ redirect: path }) : reply.redirect(path, 303);
}

/**
 * Starts a new session (never reusing one the browser brought: no session fixation, and a new
 * id when a second step raises what the session proves) and goes on to `returnTo`.
 */
export async function beginSession(db: DB, config: Config, req: FastifyRequest, reply: FastifyReply, input: { userId: number; amr: readonly string[]; returnTo: string; json?: boolean }) {
  const previous = await currentUser(db, config, req);
  if (previous) await deleteSession(db, previous.sessionId);
  setSessionCookie(reply, config, await createSession(db, input.userId, { userAgent: req.headers['user-agent'], ip: req.ip }, undefined, input.amr));
  return goTo(reply, input.returnTo, input.json);
}

