/**
 * Signing in with a passkey: the JSON endpoints the page script (assets/passkeys.js) calls.
 * Each ceremony is two requests: options (the challenge, kept server side and used once), then
 * the browser's response to verify (accounts/passkeys.ts).
 *
 * - Without a password (the login page's button, and its autofill): any discoverable passkey of
 *   ours; the challenge lives in a new pending sign-in, bound to that browser's cookie. The
 *   authenticator verified the user, so the session has two factors (RFC 8176: hwk or swk, user,
 *   mfa).
 * - As the second step (the second-step page): only that user's passkeys; the challenge lives in
 *   the pending sign-in after the password, or in the session for a signed-in step-up.
 *
 * Bodies are JSON, validated; the CSRF token comes in the x-csrf-token header (the pre-session
 * binding before sign-in, the session's for a step-up). Every refusal is a 4xx JSON error; on
 * success the answer is `{ redirect }` and the script navigates.
 */
import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { findSsoRoute } from '../sso/domains.js';
import { authenticationOptions, authenticationResponseSchema, type ChallengeSlot, pendingSignInSlot, sessionSlot, verifyPasskeyAssertion } from '../accounts/passkeys.js';
import { endPendingSignIn, findPendingSignIn, PENDING_SIGN_IN_TTL_SECONDS, startPendingSignIn } from '../accounts/pending-sign-ins.js';
import { checkPreSessionCsrf, CSRF_FAILED, csrfTokenMatches, safeReturnTo } from '../accounts/sessions.js';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { isDatabaseUnavailable } from '../db/errors.js';
import { AppError, ConflictError, ForbiddenError, InvalidRequestError } from '../errors.js';
import { FailureThrottle } from '../lib/throttle.js';
import { TooManyAttemptsError } from '../oauth/errors.js';
import type { MailOutbox } from '../mail/outbox.js';
import { beginSession } from './begin-session.js';
import { findSecondStepSubject, finishSecondStep, type SecondStepSubject, secondStepCsrfBinding, SIGN_IN_FINISHED } from './second-step.js';

/** Passwordless sign-ins one address may start (each a pending row) in PENDING_SIGN_IN_TTL_SECONDS. */
const NEW_SIGN_INS_PER_IP = 100;

export const PASSKEY_PATHS = {
  /** The second step (the second-step page's section names these two). */
  secondStepOptions: '/login/passkey/options',
  secondStep: '/login/passkey',
  /** Without a password (the login page). */
  signInOptions: '/login/passkey/sign-in/options',
  signIn: '/login/passkey/sign-in',
};

/** The header the page script sends the CSRF token in. */
export const CSRF_HEADER = 'x-csrf-token';

export function csrfHeader(req: FastifyRequest): string | undefined {
  const value = req.headers[CSRF_HEADER];
  return typeof value === 'string' ? value : undefined;
}

/** A JSON body, validated: a 400 naming the first problem otherwise. */
export function parseBody<T extends z.ZodType>(schema: T, body: unknown): z.infer<T> {
  const parsed = schema.safeParse(body);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new InvalidRequestError(`The request is malformed: ${issue ? `${issue.path.join('.') || 'body'} ${issue.message}` : 'unreadable'}.`);
  }
  return parsed.data;
}

/**
 * Call first in an encapsulated plugin of JSON routes inside a page plugin: errors are
 * `{ error, error_description }` JSON (the page script shows the description), not HTML pages.
 */
export function answerErrorsAsJson(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError | Error, req, reply) => {
    if (err instanceof AppError) {
      req.log.info({ err: { type: err.name, message: err.message, cause: err.cause instanceof Error ? err.cause.message : undefined } }, 'request refused');
      return reply.code(err.statusCode).headers(err.headers).send({ error: err.code, error_description: err.description });
    }
    if (isDatabaseUnavailable(err)) {
      req.log.warn({ err }, 'database unavailable');
      return reply.code(503).header('retry-after', '1').send({ error: 'temporarily_unavailable', error_description: 'The service is temporarily unavailable. Try again shortly.' });
    }
    // Fastify's own refusals: malformed JSON, too large, wrong content type.
    const status = 'statusCode' in err ? err.statusCode : undefined;
    if (typeof status === 'number' && status >= 400 && status < 500) return reply.code(status).send({ error: 'invalid_request', error_description: 'The request could not be read.' });
    req.log.error({ err }, 'unhandled error');
    return reply.code(500).send({ error: 'server_error', error_description: 'An unexpected error occurred.' });
  });
}

const returnToField = z.string().max(8192).optional();
const optionsBody = z.object({ return_to: returnToField });
const verifyBody = z.object({ response: authenticationResponseSchema, return_to: returnToField });

export async function passkeyPages(app: FastifyInstance, deps: { db: DB; config: Config; mail: MailOutbox }): Promise<void> {
  const { db, config } = deps;
  const passkeyDeps = { issuer: config.issuer, secretKey: config.secretKey, mail: deps.mail };

  /** Who takes the second step, having sent the matching CSRF token. */
  async function secondStepSubject(req: FastifyRequest, returnTo: string | undefined): Promise<SecondStepSubject> {
    const subject = await findSecondStepSubject(db, config, req, returnTo);
    if (!subject) throw new InvalidRequestError('This sign-in has expired. Sign in again.');
    if (!csrfTokenMatches(config, secondStepCsrfBinding(req, config, subject), csrfHeader(req))) throw new ForbiddenError(CSRF_FAILED);
    return subject;
  }

  const slotOf = (subject: SecondStepSubject): ChallengeSlot =>
    subject.kind === 'pending' ? pendingSignInSlot(db, subject.pending.idHash) : sessionSlot(db, subject.session.sessionId);

  const newSignIns = new FailureThrottle(NEW_SIGN_INS_PER_IP, PENDING_SIGN_IN_TTL_SECONDS * 1000);

  await app.register(async (json) => {
    answerErrorsAsJson(json);

    json.post(PASSKEY_PATHS.secondStepOptions, async (req) => {
      const body = parseBody(optionsBody, req.body);
      const subject = await secondStepSubject(req, body.return_to);
      return authenticationOptions(db, passkeyDeps, slotOf(subject), subject.user.id);
    });

    json.post(PASSKEY_PATHS.secondStep, async (req, reply) => {
      const body = parseBody(verifyBody, req.body);
      const subject = await secondStepSubject(req, body.return_to);
      const passkey = await verifyPasskeyAssertion(db, passkeyDeps, slotOf(subject), body.response, subject.user.id);
      req.log.info({ user_id: subject.user.id, passkey_id: passkey.passkeyId }, 'second step taken with a passkey');
      return finishSecondStep(db, config, req, reply, subject, [passkey.backedUp ? 'swk' : 'hwk'], true);
    });

    json.post(PASSKEY_PATHS.signInOptions, async (req, reply) => {
      checkPreSessionCsrf(req, config, csrfHeader(req));
      const body = parseBody(optionsBody, req.body);
      const returnTo = safeReturnTo(body.return_to);
      // A browser asks again (every login page view does, for autofill): its own anonymous
      // pending sign-in takes the new challenge, so one browser keeps one row.
      const existing = await findPendingSignIn(db, config, req);
      if (existing && existing.userId === null) {
        await db.updateTable('pending_sign_ins').set({ return_to: returnTo }).where('id_hash', '=', existing.idHash).execute();
        return authenticationOptions(db, passkeyDeps, pendingSignInSlot(db, existing.idHash));
      }
      // New rows are written by anonymous requests: at most NEW_SIGN_INS_PER_IP per address in the window.
      const wait = newSignIns.retryAfter(req.ip);
      if (wait > 0) throw new TooManyAttemptsError(wait, 'Too many sign-ins started from this address. Please wait and try again.');
      newSignIns.recordFailure(req.ip);
      // Nobody is named yet: the pending sign-in only holds the challenge and where to go.
      const idHash = await startPendingSignIn(db, config, reply, { userId: null, amr: [], returnTo });
      return authenticationOptions(db, passkeyDeps, pendingSignInSlot(db, idHash));
    });

    json.post(PASSKEY_PATHS.signIn, async (req, reply) => {
      checkPreSessionCsrf(req, config, csrfHeader(req));
      const body = parseBody(verifyBody, req.body);
      const pending = await findPendingSignIn(db, config, req);
      if (!pending || pending.userId !== null) throw new InvalidRequestError('This sign-in has expired. Try again.');
      const passkey = await verifyPasskeyAssertion(db, passkeyDeps, pendingSignInSlot(db, pending.idHash), body.response);
      // As for passwords: an organization that requires its SSO for the address decides.
      const user = await db.selectFrom('users').select('email').where('id', '=', passkey.userId).executeTakeFirstOrThrow();
      if ((await findSsoRoute(db, user.email))?.ssoRequired) throw new ForbiddenError('Your organization signs you in through its identity provider. Enter your email address and choose Continue.');
      if (!(await endPendingSignIn(db, config, reply, pending.idHash))) throw new ConflictError(SIGN_IN_FINISHED);
      req.log.info({ user_id: passkey.userId, passkey_id: passkey.passkeyId }, 'signed in with a passkey');
      // The authenticator verified the user (UV): something they have and something they are or know.
      const amr = [passkey.backedUp ? 'swk' : 'hwk', 'user', 'mfa'];
      return beginSession(db, config, req, reply, { userId: passkey.userId, amr, returnTo: pending.returnTo, json: true });
    });
  });
}
