/**
 * Browser sessions and CSRF tokens.
 *
 * A session id is 256 random bits (CD-4) held only by the browser, in an HttpOnly, SameSite=Lax
 * cookie; the `sessions` table keeps its SHA-256. Logging out deletes the row, so a copied
 * cookie dies with it; expired rows are ignored and swept when their user logs in again.
 *
 * CSRF (RFC 6749 §10.12, AZ-8): a form's token is HMAC-SHA256(key, binding) under a key derived
 * from SECRET_KEY for this purpose only. Once signed in, the binding is the session id, so a
 * token is useless in another session. Before sign-in (login and signup, "login CSRF") it is a
 * random pre-session cookie: a signed double-submit cookie. A cross-site form cannot read our
 * page to learn the token, and SameSite=Lax keeps both cookies off cross-site POSTs as well.
 */
import { isWellFormed } from '../lib/validate.js';
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { sql } from 'kysely';
import type { Config } from '../config.js';
import type { DB } from '../db/connect.js';
import { ForbiddenError } from '../errors.js';
import { deriveKey, generateSecret, sha256Hex } from '../lib/crypto.js';

export const SESSION_TTL_SECONDS = 12 * 3600;

/** What a form whose CSRF token does not match is told (every page that posts). */
export const CSRF_FAILED = 'This form has expired or did not come from this site. Go back, reload the page and try again.';
const PRE_SESSION_TTL_SECONDS = 3600;

export interface SessionUser {
  /** The session id as the cookie holds it (needed for the CSRF binding). */
  sessionId: string;
  userId: number;
  email: string;
  name: string;
  /** Whether the user has confirmed their email address. */
  emailVerified: boolean;
  /** When the user signed in for this session: OpenID Connect's auth_time. */
  authTime: Date;
  /** How they signed in (RFC 8176): ['pwd'], ['pwd', 'otp', 'mfa'], ['hwk', 'user', 'mfa'], ['fed'], ... */
  amr: string[];
  /** The active SSO connection the session was signed in through, and its organization; null otherwise. */
  ssoConnectionId: number | null;
  ssoOrganizationId: number | null;
  /** The social connection the session was signed in through (only while it is enabled: a disabled one's sessions are none); null otherwise. */
  socialConnectionId: number | null;
}

/** The amr after a second step: what the first gave, the method, and `mfa` (RFC 8176). */
export function withSecondFactor(amr: readonly string[], method: readonly string[]): string[] {
  return [...new Set([...amr, ...method, 'mfa'])];
}

/**
 * What replaces a session raised by a further factor (a second step it took, a factor just added):
 * the same sign-in one step further. It keeps what the old session was made through, its SSO
 * connection (so disabling the connection still ends it, and SS-4 still knows it) and its amr,
 * plus the method and `mfa`.
 */
export function raisedSession(
  session: Pick<SessionUser, 'userId' | 'amr' | 'ssoConnectionId' | 'socialConnectionId'>,
  method: readonly string[],
): { userId: number; amr: string[]; ssoConnectionId?: number; socialConnectionId?: number } {
  return {
    userId: session.userId,
    amr: withSecondFactor(session.amr, method),
    ...(session.ssoConnectionId !== null ? { ssoConnectionId: session.ssoConnectionId } : {}),
    ...(session.socialConnectionId !== null ? { socialConnectionId: session.socialConnectionId } : {}),
  };
}

/** RFC 8176 `mfa`: the session was signed in with two factors. */
export function signedInWithTwoFactors(session: Pick<SessionUser, 'amr'>): boolean {
  return session.amr.includes('mfa');
}

/**
 * OpenID Connect's sid (the ID token's session id) of `session` for one application: stable for
 * the session, different for each application (as node-oidc-provider does, so two applications
 * cannot correlate sessions by it), telling nothing of the cookie.
 */
export function sessionSid(session: Pick<SessionUser, 'sessionId'>, clientId: string): string {
  return sha256Hex(`oidc-sid:${clientId}:${sha256Hex(session.sessionId)}`).slice(0, 32);
}

export interface CookieNames {
  session: string;
  preSession: string;
  /** A sign-in waiting for its second step (pending-sign-ins.ts): never a session. */
  pendingSignIn: string;
}

/** Whether cookies get `Secure` (and the `__Host-` prefix, which pins them to this host and path /). */
export function cookieSecurity(config: Config): { secure: boolean; names: CookieNames } {
  const secure = config.issuer.startsWith('https:');
  const prefix = secure ? '__Host-' : '';
  return { secure, names: { session: `${prefix}orgauth_session`, preSession: `${prefix}orgauth_csrf`, pendingSignIn: `${prefix}orgauth_signin` } };
}

/** The browser a session was started from, as the account page lists it. */
export interface SessionClient {
  userAgent?: string | undefined;
  ip?: string | undefined;
}

const USER_AGENT_MAX = 512;
/** last_seen_at is written at most this often per session: a page view is not a write. */
const TOUCH_EVERY_MS = 60_000;

export interface NewSession {
  client?: SessionClient;
  ttlSeconds?: number;
  /** How the user signed in (RFC 8176); a password by default. */
  amr?: readonly string[];
  /** The dashboard's organization to start in (a session replacing another keeps its choice). */
  currentOrganizationId?: number | null;
  /** The SSO connection the user signed in through: the session ends when it is disabled. */
  ssoConnectionId?: number | null;
  /** The social connection the user signed in through: the session lasts while it is enabled. */
  socialConnectionId?: number | null;
}

export async function createSession(db: DB, userId: number, options: NewSession = {}): Promise<string> {
  const { client = {}, ttlSeconds = SESSION_TTL_SECONDS, amr = ['pwd'] } = options;
  const id = generateSecret(32);
  await db
    .insertInto('sessions')
    .values({
      id_hash: sha256Hex(id),
      user_id: userId,
      // The application's clock, not the database's: auth_time and the re-authentication checks
      // (max_age, signed_in_after) compare it with Date.now().
      created_at: new Date(),
      expires_at: new Date(Date.now() + ttlSeconds * 1000),
      user_agent: client.userAgent ? [...client.userAgent].slice(0, USER_AGENT_MAX).join('').replace(/[\u0000-\u001f\u007f]/g, ' ') : null,
      ip: client.ip ? client.ip.slice(0, 64) : null,
      amr: [...amr],
      current_organization_id: options.currentOrganizationId ?? null,
      sso_connection_id: options.ssoConnectionId ?? null,
      social_connection_id: options.socialConnectionId ?? null,
    })
    .execute();
  // Housekeeping: this user's expired sessions are of no use to anyone.
  await db.deleteFrom('sessions').where('user_id', '=', userId).where('expires_at', '<=', new Date()).execute();
  return id;
}

/** The signed-in user for a session id, or undefined when it is unknown or expired. */
export async function findSession(db: DB, sessionId: string | undefined): Promise<SessionUser | undefined> {
  if (sessionId === undefined || sessionId === '' || sessionId.length > 100) return undefined;
  const idHash = sha256Hex(sessionId);
  const row = await db
    .selectFrom('sessions')
    .innerJoin('users', 'users.id', 'sessions.user_id')
    .leftJoin('sso_connections', (join) => join.onRef('sso_connections.id', '=', 'sessions.sso_connection_id').on('sso_connections.state', '=', 'active'))
    .leftJoin('social_connections', 'social_connections.id', 'sessions.social_connection_id')
    .select([
      'users.id as userId',
      'users.email',
      'users.name',
      'users.email_verified_at',
      'sessions.last_seen_at',
      'sessions.created_at as authTime',
      'sessions.amr',
      'sso_connections.id as ssoConnectionId',
      'sso_connections.organization_id as ssoOrganizationId',
      'sessions.social_connection_id as socialConnectionId',
    ])
    .where('sessions.id_hash', '=', idHash)
    .where('sessions.expires_at', '>', new Date())
    // A session made through a social connection lasts while the connection is enabled: checked
    // here too, so a sign-in that finished while the connection was being disabled ends with it.
    .where((eb) => eb.or([eb('sessions.social_connection_id', 'is', null), eb('social_connections.state', '=', 'enabled')]))
    .executeTakeFirst();
  if (!row) return undefined;
  const { last_seen_at: lastSeen, email_verified_at: verifiedAt, ...user } = row;
  if (Date.now() - lastSeen.getTime() >= TOUCH_EVERY_MS) {
    await db.updateTable('sessions').set({ last_seen_at: sql`now()` }).where('id_hash', '=', idHash).execute();
  }
  return { sessionId, ...user, emailVerified: verifiedAt !== null };
}

/** A user's live sessions, most recently used first (the account page shows the newest SESSIONS_LISTED). */
export const SESSIONS_LISTED = 100;

export async function listSessions(db: DB, userId: number) {
  return db
    .selectFrom('sessions')
    .select(['id', 'id_hash', 'created_at', 'last_seen_at', 'user_agent', 'ip'])
    .where('user_id', '=', userId)
    .where('expires_at', '>', new Date())
    .orderBy('last_seen_at', 'desc')
    .orderBy('id', 'desc')
    .limit(SESSIONS_LISTED)
    .execute();
}

/** Ends one of the user's sessions by its number: the ended session's id_hash, or undefined when the user has no such session. */
export async function endSession(db: DB, userId: number, id: number): Promise<string | undefined> {
  const ended = await db.deleteFrom('sessions').where('user_id', '=', userId).where('id', '=', id).returning('id_hash').executeTakeFirst();
  return ended?.id_hash;
}

/** Ends every session of the user but `keep` (the one asking). Returns how many ended. */
export async function endOtherSessions(db: DB, userId: number, keep: string): Promise<number> {
  const ended = await db.deleteFrom('sessions').where('user_id', '=', userId).where('id_hash', '!=', sha256Hex(keep)).executeTakeFirst();
  return Number(ended.numDeletedRows);
}

/**
 * Changing how the account signs in (adding or removing a factor, new recovery codes) needs the
 * password again, unless the session signed in this recently ("sudo mode", as GitHub does).
 */
export const RECENT_SIGN_IN_MS = 10 * 60 * 1000;

export function signedInRecently(session: Pick<SessionUser, 'authTime'>): boolean {
  return Date.now() - session.authTime.getTime() < RECENT_SIGN_IN_MS;
}

export async function deleteSession(db: DB, sessionId: string): Promise<void> {
  await db.deleteFrom('sessions').where('id_hash', '=', sha256Hex(sessionId)).execute();
}

/** Reads the session cookie and returns the signed-in user, if any. */
export function currentUser(db: DB, config: Config, req: FastifyRequest): Promise<SessionUser | undefined> {
  return findSession(db, req.cookies[cookieSecurity(config).names.session]);
}

export function setSessionCookie(reply: FastifyReply, config: Config, sessionId: string): void {
  const { secure, names } = cookieSecurity(config);
  reply.setCookie(names.session, sessionId, { httpOnly: true, sameSite: 'lax', path: '/', secure, maxAge: SESSION_TTL_SECONDS });
  // The pre-session CSRF cookie has done its job.
  reply.clearCookie(names.preSession, { httpOnly: true, sameSite: 'lax', path: '/', secure });
}

export function clearSessionCookie(reply: FastifyReply, config: Config): void {
  const { secure, names } = cookieSecurity(config);
  reply.clearCookie(names.session, { httpOnly: true, sameSite: 'lax', path: '/', secure });
}

/** The pre-session value from the request, or a new one set on the reply. */
export function ensurePreSession(req: FastifyRequest, reply: FastifyReply, config: Config): string {
  const { secure, names } = cookieSecurity(config);
  const existing = req.cookies[names.preSession];
  if (existing !== undefined && /^[A-Za-z0-9_-]{43}$/.test(existing)) return existing;
  const value = generateSecret(32);
  reply.setCookie(names.preSession, value, { httpOnly: true, sameSite: 'lax', path: '/', secure, maxAge: PRE_SESSION_TTL_SECONDS });
  return value;
}

export type CsrfBinding = { session: string } | { preSession: string };

function bindingString(binding: CsrfBinding): string {
  return 'session' in binding ? `session:${binding.session}` : `pre-session:${binding.preSession}`;
}

export function csrfToken(config: Config, binding: CsrfBinding): string {
  return createHmac('sha256', deriveKey(config.secretKey, 'csrf')).update(bindingString(binding), 'utf8').digest('base64url');
}

/** Whether `token` is the CSRF token for `binding`, compared in constant time. */
export function csrfTokenMatches(config: Config, binding: CsrfBinding | undefined, token: unknown): boolean {
  if (binding === undefined || typeof token !== 'string') return false;
  const expected = Buffer.from(csrfToken(config, binding), 'utf8');
  const actual = Buffer.from(token, 'utf8');
  return actual.length === expected.length && timingSafeEqual(actual, expected);
}

/** Login CSRF: a form posted before sign-in must carry the token bound to the pre-session cookie (403 otherwise). */
export function checkPreSessionCsrf(req: FastifyRequest, config: Config, token: string | undefined): void {
  if (!csrfTokenMatches(config, preSessionBinding(req, config), token)) throw new ForbiddenError(CSRF_FAILED);
}

/** The pre-session binding from the request's cookie, if it sent one. */
export function preSessionBinding(req: FastifyRequest, config: Config): CsrfBinding | undefined {
  const value = req.cookies[cookieSecurity(config).names.preSession];
  return value === undefined || value === '' ? undefined : { preSession: value };
}

/**
 * AZ-9: where to go after signing in. Only a same-origin path: one leading `/`, not `//` or
 * `/\` (browsers read both as another host), no backslashes or control characters at all.
 */
export function safeReturnTo(value: unknown, fallback = '/dashboard'): string {
  // 8 kB: an authorization request with a long nonce and an id_token_hint still comes back.
  if (typeof value !== 'string' || value.length > 8192) return fallback;
  if (!value.startsWith('/') || value.startsWith('//') || /[\\\x00-\x1f\x7f]/.test(value) || !isWellFormed(value)) return fallback;
  // Belt and braces: resolved against a dummy origin, it must stay on that origin.
  const base = 'http://orgauth.invalid';
  if (!URL.canParse(value, base) || new URL(value, base).origin !== base) return fallback;
  // A Location header must be ASCII: anything else is percent-encoded (UTF-8), as a browser would send it (found by fuzzing: a 500).
  return value.replace(/[^\x21-\x7e]/gu, (c) => encodeURIComponent(c));
}
