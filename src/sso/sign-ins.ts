/**
 * SSO sign-ins in flight (the sso_sign_ins table), between the browser leaving for its identity
 * provider and coming back signed in. Each row is bound to the browser that started it (a hash
 * of its pre-session cookie) and is used once: the statement that reads it also consumes it, so
 * the same state, InResponseTo or finish handle works on one request only, on any instance.
 */
import { sql } from 'kysely';
import type { DB } from '../db/connect.js';
import { inTransaction } from '../db/connect.js';
import { generateSecret, openText, sealText, sha256Hex } from '../lib/crypto.js';
import type { UpstreamIdentity } from './identities.js';
import type { OidcChecks } from './oidc-upstream.js';
import { type AcceptedAssertion, SamlResponseError } from './saml-sp.js';

/** How long a browser may take at its identity provider. */
export const SIGN_IN_TTL_SECONDS = 600;
/** Between a verified response and the account step (a redirect), or a proof of the account (a sign-in). */
const FINISH_TTL_SECONDS = 300;
export const PROOF_TTL_SECONDS = 900;
const VERIFIER_PURPOSE = 'sso-pkce-verifier';

/** What binds a sign-in to a browser: its pre-session cookie, hashed (the cookie itself is never stored). */
export function browserHash(preSession: string): string {
  return sha256Hex(`sso-browser:${preSession}`);
}

/**
 * Whose sign-in it is: an organization's SSO connection's (sso_connections) or a social
 * connection's (social_connections, src/social/): the ids are of different tables, and a handle
 * of one kind is never taken for the other.
 */
export type SignInSource = 'sso' | 'social';

function connectionColumns(source: SignInSource, connectionId: number) {
  return source === 'sso' ? { connection_id: connectionId, social_connection_id: null } : { connection_id: null, social_connection_id: connectionId };
}

function ofSource(source: SignInSource) {
  return source === 'sso' ? sql<boolean>`social_connection_id is null` : sql<boolean>`social_connection_id is not null`;
}

/** Remembers an OIDC sign-in under its state (GitHub's OAuth sign-ins too: its nonce is then unused). */
export async function startOidcSignIn(db: DB, secretKey: string, input: { connectionId: number; source?: SignInSource; browser: string; returnTo: string; checks: OidcChecks }): Promise<void> {
  await db
    .insertInto('sso_sign_ins')
    .values({
      handle_hash: sha256Hex(input.checks.state),
      ...connectionColumns(input.source ?? 'sso', input.connectionId),
      browser_hash: input.browser,
      return_to: input.returnTo,
      oidc_nonce: input.checks.nonce,
      oidc_code_verifier_sealed: sealText(secretKey, VERIFIER_PURPOSE, input.checks.codeVerifier),
      expires_at: sql<Date>`now() + make_interval(secs => ${SIGN_IN_TTL_SECONDS})`,
    })
    .execute();
}

/** Takes (consumes) the OIDC sign-in of `state` at `connectionId`; undefined when unknown, used or expired. */
export async function takeOidcSignIn(
  db: DB,
  secretKey: string,
  connectionId: number,
  state: string,
  browser: string | undefined,
  source: SignInSource = 'sso',
): Promise<{ checks: OidcChecks; returnTo: string } | undefined> {
  // Only by the browser that started it: another one holding a copy of the callback URL neither
  // finishes the sign-in nor uses it up for the browser it belongs to.
  if (browser === undefined) return undefined;
  const row = await db
    .updateTable('sso_sign_ins')
    .set({ consumed_at: sql<Date>`now()` })
    .where('handle_hash', '=', sha256Hex(state))
    .where(source === 'sso' ? 'connection_id' : 'social_connection_id', '=', connectionId)
    .where('browser_hash', '=', browser)
    .where('consumed_at', 'is', null)
    .where('oidc_nonce', 'is not', null)
    .where('expires_at', '>', sql<Date>`now()`)
    .returning(['oidc_nonce', 'oidc_code_verifier_sealed', 'return_to'])
    .executeTakeFirst();
  if (!row || row.oidc_nonce === null || row.oidc_code_verifier_sealed === null) return undefined;
  return { checks: { state, nonce: row.oidc_nonce, codeVerifier: openText(secretKey, VERIFIER_PURPOSE, row.oidc_code_verifier_sealed) }, returnTo: row.return_to };
}

/** Remembers a SAML sign-in; returns the AuthnRequest ID to send (the InResponseTo to expect). */
export async function startSamlSignIn(db: DB, input: { connectionId: number; browser: string; returnTo: string }): Promise<string> {
  // An xs:ID must not start with a digit; 160 random bits.
  const requestId = `_${Buffer.from(generateSecret(20), 'base64url').toString('hex')}`;
  await db
    .insertInto('sso_sign_ins')
    .values({
      handle_hash: sha256Hex(`saml-request:${requestId}`),
      connection_id: input.connectionId,
      browser_hash: input.browser,
      return_to: input.returnTo,
      saml_request_id: requestId,
      expires_at: sql<Date>`now() + make_interval(secs => ${SIGN_IN_TTL_SECONDS})`,
    })
    .execute();
  return requestId;
}

/**
 * The database's part of accepting a SAML response, in one transaction: the assertion ID joins
 * the replay store (a second arrival, on any instance, finds it there), and the request it answers
 * is consumed (an unknown, expired or used InResponseTo is refused). An IdP-initiated response (no
 * InResponseTo) is accepted only when the connection allows it. Returns the handle the browser
 * finishes under; a SamlResponseError says why not.
 */
export async function recordSamlResponse(
  db: DB,
  input: { accepted: AcceptedAssertion; idpInitiatedAllowed: boolean; relayStateReturnTo: string },
): Promise<string> {
  const { accepted } = input;
  const handle = generateSecret(32);
  const result = JSON.stringify(accepted.identity);
  await inTransaction(db, async (trx) => {
    const fresh = await trx
      .insertInto('saml_assertion_ids')
      .values({ connection_id: accepted.identity.connectionId, assertion_id: accepted.assertionId, expires_at: accepted.keepUntil })
      .onConflict((oc) => oc.doNothing())
      .returning('assertion_id')
      .executeTakeFirst();
    if (!fresh) throw new SamlResponseError('replayed: this assertion was accepted before');
    if (accepted.inResponseTo !== null) {
      const request = await trx
        .updateTable('sso_sign_ins')
        .set({ consumed_at: sql<Date>`now()`, result, handle_hash: sha256Hex(handle), expires_at: sql<Date>`now() + make_interval(secs => ${FINISH_TTL_SECONDS})` })
        .where('connection_id', '=', accepted.identity.connectionId)
        .where('saml_request_id', '=', accepted.inResponseTo)
        .where('consumed_at', 'is', null)
        .where('expires_at', '>', sql<Date>`now()`)
        .returning('id')
        .executeTakeFirst();
      if (!request) throw new SamlResponseError('InResponseTo names no request of ours that is still waiting (unknown, expired or used)');
      return;
    }
    if (!input.idpInitiatedAllowed) throw new SamlResponseError('IdP-initiated responses are not accepted by this connection');
    // IdP-initiated: nothing to bind to but the handle; the browser that brings it finishes.
    await trx
      .insertInto('sso_sign_ins')
      .values({
        handle_hash: sha256Hex(handle),
        connection_id: accepted.identity.connectionId,
        browser_hash: null,
        return_to: input.relayStateReturnTo,
        result,
        consumed_at: sql<Date>`now()`,
        expires_at: sql<Date>`now() + make_interval(secs => ${FINISH_TTL_SECONDS})`,
      })
      .execute();
  });
  return handle;
}

/** A verified identity waiting for its account step, or for the account's proof. */
export interface ParkedSignIn<T = UpstreamIdentity> {
  /** What the provider said (an SSO connection's UpstreamIdentity, or a social connection's identity). */
  identity: T;
  /** The existing account to be proved (needs_proof), when that is what waits. */
  userId?: number;
  returnTo: string;
  /** When it was parked: a proof must be a sign-in made after it. */
  createdAt: Date;
}

function parked<T>(row: { result: unknown; return_to: string; created_at: Date }): ParkedSignIn<T> | undefined {
  const result = row.result as (T & { userId?: number }) | null;
  if (result === null || typeof result !== 'object') return undefined;
  const { userId, ...identity } = result;
  return { identity: identity as T, ...(typeof userId === 'number' ? { userId } : {}), returnTo: row.return_to, createdAt: row.created_at };
}

/**
 * Which parked sign-in a page may take: a verified response waiting for its account step, bound
 * to the browser that started it (`kind: 'bound'`) or to none (`'unsolicited'`: IdP-initiated),
 * or a link waiting for its account's proof (`'proof'`: bound to the browser's link cookie).
 * Another browser's handle matches nothing, so it cannot use up someone else's sign-in either.
 */
export interface ParkedFor {
  kind: 'bound' | 'unsolicited' | 'proof';
  browser?: string | undefined;
  /** Whose: an SSO connection's (the default) or a social connection's. */
  source?: SignInSource;
}

function parkedFor(handle: string, expect: ParkedFor) {
  const browser = expect.kind === 'unsolicited' ? sql`browser_hash is null` : sql`browser_hash = ${expect.browser ?? null}`;
  return sql<boolean>`handle_hash = ${sha256Hex(handle)} and result is not null and expires_at > now()
    and ((result -> 'userId') is not null) = ${expect.kind === 'proof'} and ${browser} and ${ofSource(expect.source ?? 'sso')}`;
}

/** Takes (deletes) what waits under `handle` for this browser; undefined when unknown, used, expired or another browser's. */
export async function takeParkedSignIn<T = UpstreamIdentity>(db: DB, handle: string, expect: ParkedFor): Promise<ParkedSignIn<T> | undefined> {
  if (handle.length === 0 || handle.length > 100) return undefined;
  const row = await db.deleteFrom('sso_sign_ins').where(parkedFor(handle, expect)).returning(['result', 'return_to', 'created_at']).executeTakeFirst();
  return row && parked<T>(row);
}

/** Reads what waits under `handle` for this browser without taking it (the page that asks to confirm a link). */
export async function peekParkedSignIn<T = UpstreamIdentity>(db: DB, handle: string, expect: ParkedFor): Promise<ParkedSignIn<T> | undefined> {
  if (handle.length === 0 || handle.length > 100) return undefined;
  const row = await db.selectFrom('sso_sign_ins').select(['result', 'return_to', 'created_at']).where(parkedFor(handle, expect)).executeTakeFirst();
  return row && parked<T>(row);
}

/** Parks an identity whose account must be proved first (needs_proof); returns its handle. */
export async function parkForProof<T extends { connectionId: number } = UpstreamIdentity>(
  db: DB,
  input: { identity: T; userId: number; browser: string; returnTo: string; source?: SignInSource },
): Promise<string> {
  const handle = generateSecret(32);
  await db
    .insertInto('sso_sign_ins')
    .values({
      handle_hash: sha256Hex(handle),
      ...connectionColumns(input.source ?? 'sso', input.identity.connectionId),
      browser_hash: input.browser,
      return_to: input.returnTo,
      result: JSON.stringify({ ...input.identity, userId: input.userId }),
      // The application's clock, as the session's auth_time it is compared with (provedSince).
      created_at: new Date(),
      consumed_at: sql<Date>`now()`,
      expires_at: sql<Date>`now() + make_interval(secs => ${PROOF_TTL_SECONDS})`,
    })
    .execute();
  return handle;
}
