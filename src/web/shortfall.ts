/**
 * What a page answers when the session lacks what an organization requires of it
 * (accounts/organization-access.ts sessionShortfall): a GET goes to sign in through the
 * organization's identity provider (SS-4) or to take (or set up) a second step, and comes back;
 * a form posted is a 403. The dashboard and a setup link's pages alike.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { SessionShortfall } from '../accounts/organization-access.js';
import { factorSummary, hasSecondFactor } from '../accounts/second-factors.js';
import type { SessionUser } from '../accounts/sessions.js';
import type { DB } from '../db/connect.js';
import { ForbiddenError } from '../errors.js';
import { ssoRequiredMessage } from '../sso/required.js';
import { twoFactorsPath } from './second-step.js';
import { ssoSignInPath } from './sign-in.js';

export async function answerShortfall(
  db: DB,
  req: FastifyRequest,
  reply: FastifyReply,
  shortfall: SessionShortfall,
  organizationName: string,
  session: Pick<SessionUser, 'email' | 'userId'>,
): Promise<FastifyReply> {
  const reading = req.method === 'GET' || req.method === 'HEAD';
  if (shortfall === 'sso') {
    if (!reading) throw new ForbiddenError(ssoRequiredMessage(organizationName));
    return reply.redirect(ssoSignInPath(session.email, req.url), 303);
  }
  if (!reading) throw new ForbiddenError(`${organizationName} requires two-step sign-in.`);
  return reply.redirect(twoFactorsPath(hasSecondFactor(await factorSummary(db, session.userId)), req.url), 303);
}
