/**
 * The email domains an organization claims (SS-3). A claim is pending until a DNS TXT record at
 * `_orgauth-challenge.<domain>` holds its token; only a verified domain routes anyone to the
 * organization's identity provider, provisions users, links accounts or requires SSO.
 *
 * A verified domain belongs to one organization (a partial unique index). Pending claims of one
 * domain by several organizations coexist: whoever proves it first has it, and a claim nobody can
 * prove blocks nobody (no squatting, a complaint against services that reserve on first claim).
 * Consumer mail domains are refused outright: nobody owns gmail.com's users.
 */
import { Resolver } from 'node:dns/promises';
import { domainToASCII } from 'node:url';
import { sql } from 'kysely';
import { type Actor, recordAuditEvent } from '../audit/events.js';
import { type DB, inTransaction } from '../db/connect.js';
import { isUniqueViolation } from '../db/errors.js';
import type { SsoDomain } from '../db/schema.js';
import { ConflictError, InvalidRequestError, NotFoundError } from '../errors.js';
import { generateSecret } from '../lib/crypto.js';

export const CHALLENGE_PREFIX = '_orgauth-challenge';
/** Domains per organization: the dashboard and the API list them on one page. */
export const MAX_DOMAINS = 100;

/** Mail services whose addresses belong to their users, not to any organization. */
export const CONSUMER_DOMAINS: ReadonlySet<string> = new Set([
  'gmail.com', 'googlemail.com', 'outlook.com', 'hotmail.com', 'hotmail.co.uk', 'live.com', 'msn.com',
  'yahoo.com', 'yahoo.co.uk', 'ymail.com', 'aol.com', 'icloud.com', 'me.com', 'mac.com',
  'proton.me', 'protonmail.com', 'pm.me', 'gmx.com', 'gmx.de', 'gmx.net', 'web.de', 'mail.com',
  'zoho.com', 'yandex.com', 'yandex.ru', 'mail.ru', 'qq.com', '163.com', '126.com', 'fastmail.com',
  'hey.com', 'tutanota.com', 'tuta.io',
]);

/** A domain as the dashboard, the API and the CLI show it. */
export interface DomainView {
  id: number;
  domain: string;
  state: 'pending' | 'verified';
  sso_required: boolean;
  /** The record to publish; shown until the domain is verified (and after: removing it changes nothing). */
  verification: { type: 'TXT'; name: string; value: string };
  verified_at: Date | null;
  checked_at: Date | null;
  created_at: Date;
}

export function domainView(row: SsoDomain): DomainView {
  return {
    id: row.id,
    domain: row.domain,
    state: row.state,
    sso_required: row.sso_required,
    verification: { type: 'TXT', name: `${CHALLENGE_PREFIX}.${row.domain}`, value: row.verification_token },
    verified_at: row.verified_at,
    checked_at: row.checked_at,
    created_at: row.created_at,
  };
}

/**
 * The domain in the one form it is stored and compared in: lower case, ASCII (IDNA, so a
 * Unicode look-alike is its xn-- form), no trailing dot; an InvalidRequestError when it is not a
 * registrable-looking host name (two labels at least, no IP address).
 */
export function normalizeDomain(input: string): string {
  const trimmed = input.trim().replace(/\.$/, '');
  const ascii = trimmed.length > 0 && trimmed.length <= 253 ? domainToASCII(trimmed) : '';
  const labels = ascii.split('.');
  const wellFormed =
    ascii !== '' &&
    labels.length >= 2 &&
    labels.every((l) => /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/.test(l)) &&
    !/^[0-9]+$/.test(labels[labels.length - 1] ?? '');
  if (!wellFormed) throw new InvalidRequestError('domain: must be a domain name such as example.com', { details: [{ path: 'domain', message: 'must be a domain name such as example.com' }] });
  return ascii;
}

/** The domain part of an email address, normalized; undefined when there is none. */
export function emailDomain(email: string): string | undefined {
  const at = email.lastIndexOf('@');
  if (at < 1) return undefined;
  try {
    return normalizeDomain(email.slice(at + 1));
  } catch {
    return undefined;
  }
}

function notFound(): NotFoundError {
  return new NotFoundError('no such domain in this organization');
}

export async function listDomains(db: DB, organizationId: number): Promise<DomainView[]> {
  const rows = await db.selectFrom('sso_domains').selectAll().where('organization_id', '=', organizationId).orderBy('domain').limit(MAX_DOMAINS).execute();
  return rows.map(domainView);
}

export async function getDomain(db: DB, organizationId: number, domain: string): Promise<DomainView> {
  const row = await findDomainRow(db, organizationId, domain);
  if (!row) throw notFound();
  return domainView(row);
}

function findDomainRow(db: DB, organizationId: number, domain: string) {
  let name: string;
  try {
    name = normalizeDomain(domain);
  } catch {
    return Promise.resolve(undefined);
  }
  return db.selectFrom('sso_domains').selectAll().where('organization_id', '=', organizationId).where('domain', '=', name).executeTakeFirst();
}

/** Claims a domain for the organization, pending until its TXT record is found (verifyDomain). */
export async function addDomain(db: DB, organizationId: number, input: { domain: string }, actor?: Actor): Promise<DomainView> {
  const domain = normalizeDomain(input.domain);
  if (CONSUMER_DOMAINS.has(domain)) {
    throw new InvalidRequestError(`domain: ${domain} is a public mail service; its addresses belong to their users, not to an organization`, { details: [{ path: 'domain', message: 'a public mail service cannot be claimed' }] });
  }
  return inTransaction(db, async (trx) => {
    const taken = await trx.selectFrom('sso_domains').select('organization_id').where('domain', '=', domain).where('state', '=', 'verified').executeTakeFirst();
    if (taken) throw new ConflictError(taken.organization_id === organizationId ? `${domain} is already verified for this organization` : `${domain} is verified by another organization`);
    // A lock on the organization's row so two concurrent adds cannot both pass the count.
    const organization = await trx.selectFrom('organizations').select('id').where('id', '=', organizationId).forNoKeyUpdate().executeTakeFirst();
    if (!organization) throw new NotFoundError('organization not found');
    const { count } = await trx.selectFrom('sso_domains').select((eb) => eb.fn.countAll<number>().as('count')).where('organization_id', '=', organizationId).executeTakeFirstOrThrow();
    if (Number(count) >= MAX_DOMAINS) throw new ConflictError(`an organization may claim at most ${MAX_DOMAINS} domains`);
    let row: SsoDomain;
    try {
      row = await trx
        .insertInto('sso_domains')
        .values({ organization_id: organizationId, domain, verification_token: `orgauth-domain-verification=${generateSecret(24)}` })
        .returningAll()
        .executeTakeFirstOrThrow();
    } catch (err) {
      if (isUniqueViolation(err)) throw new ConflictError(`${domain} is already claimed by this organization`);
      throw err;
    }
    await recordAuditEvent(trx, { actor, organizationId, action: 'domain.added', details: { domain } });
    return domainView(row);
  });
}

/** Where verifyDomain looks TXT records up: the system's resolvers, or DNS_SERVERS. */
export interface TxtLookup {
  (name: string): Promise<string[]>;
}

/**
 * A TXT lookup through `servers` (`host:port` or `host`; empty: the system's resolvers), with a
 * short timeout and one retry: a verification is a button someone is waiting on.
 */
export function txtLookup(servers: readonly string[]): TxtLookup {
  return async (name) => {
    const resolver = new Resolver({ timeout: 2000, tries: 2 });
    if (servers.length > 0) resolver.setServers([...servers]);
    try {
      // A TXT record is one or more strings that are one value (RFC 7208 §3.3 joins them so).
      return (await resolver.resolveTxt(name)).map((chunks) => chunks.join(''));
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOTFOUND' || code === 'ENODATA') return [];
      throw err;
    }
  };
}

export class DomainVerificationFailedError extends InvalidRequestError {}

/**
 * Looks the domain's TXT record up now; when it holds the token, the domain is verified. A
 * domain another organization verified first stays pending here (ConflictError). A failed
 * lookup is an InvalidRequestError that says what was looked for, and is audited.
 */
export async function verifyDomain(db: DB, lookup: TxtLookup, organizationId: number, domain: string, actor?: Actor): Promise<DomainView> {
  const row = await findDomainRow(db, organizationId, domain);
  if (!row) throw notFound();
  if (row.state === 'verified') return domainView(row);
  const name = `${CHALLENGE_PREFIX}.${row.domain}`;
  let values: string[];
  try {
    values = await lookup(name);
  } catch (err) {
    await db.updateTable('sso_domains').set({ checked_at: sql<Date>`now()` }).where('id', '=', row.id).execute();
    throw new DomainVerificationFailedError(`the DNS lookup of ${name} failed (${(err as NodeJS.ErrnoException).code ?? 'error'}); try again in a minute`, { cause: err });
  }
  const found = values.some((v) => v.trim() === row.verification_token);
  if (!found) {
    await inTransaction(db, async (trx) => {
      await trx.updateTable('sso_domains').set({ checked_at: sql<Date>`now()` }).where('id', '=', row.id).execute();
      await recordAuditEvent(trx, { actor, organizationId, action: 'domain.verification_failed', details: { domain: row.domain, records_found: values.length } });
    });
    throw new DomainVerificationFailedError(
      values.length === 0
        ? `no TXT record found at ${name}; publish one holding ${row.verification_token} (DNS changes can take a few minutes)`
        : `the TXT records at ${name} do not hold this domain's token ${row.verification_token}`,
    );
  }
  try {
    return await inTransaction(db, async (trx) => {
      const verified = await trx
        .updateTable('sso_domains')
        .set({ state: 'verified', verified_at: sql<Date>`now()`, checked_at: sql<Date>`now()` })
        .where('id', '=', row.id)
        .returningAll()
        .executeTakeFirstOrThrow();
      // A domain that already required SSO requires it from now on.
      const sessionsEnded = verified.sso_required ? await enforceSsoRequired(trx, organizationId, [row.domain]) : undefined;
      await recordAuditEvent(trx, { actor, organizationId, action: 'domain.verified', details: { domain: row.domain, ...(sessionsEnded !== undefined ? { sessions_ended: sessionsEnded } : {}) } });
      return domainView(verified);
    });
  } catch (err) {
    if (isUniqueViolation(err)) throw new ConflictError(`${row.domain} is verified by another organization`);
    throw err;
  }
}

/**
 * Changes what a domain requires: `sso_required` keeps its people from signing in with a password.
 * Turned on for a verified domain while the organization has an active connection, it takes
 * effect at once (enforceSsoRequired).
 */
export async function updateDomain(db: DB, organizationId: number, domain: string, input: { sso_required?: boolean | undefined }, actor?: Actor): Promise<DomainView> {
  return inTransaction(db, async (trx) => {
    const row = await findDomainRow(trx, organizationId, domain);
    if (!row) throw notFound();
    if (input.sso_required === undefined || input.sso_required === row.sso_required) return domainView(row);
    const updated = await trx.updateTable('sso_domains').set({ sso_required: input.sso_required }).where('id', '=', row.id).returningAll().executeTakeFirstOrThrow();
    let sessionsEnded: number | undefined;
    if (input.sso_required && row.state === 'verified') sessionsEnded = await enforceSsoRequired(trx, organizationId, [row.domain]);
    await recordAuditEvent(trx, {
      actor,
      organizationId,
      action: 'domain.updated',
      details: { domain: row.domain, sso_required: input.sso_required, ...(sessionsEnded !== undefined ? { sessions_ended: sessionsEnded } : {}) },
    });
    return domainView(updated);
  });
}

/**
 * Makes SSO required hold at once: while the organization has an active connection, ends the
 * sessions of people with addresses at `domains` (its verified, SSO-required ones by default)
 * that were not signed in through one of its connections, and their sign-ins waiting for a second
 * step. Called when SSO required is turned on, when such a domain is verified, and when a
 * connection becomes active. Returns the sessions ended; undefined when nothing applies.
 */
export async function enforceSsoRequired(trx: DB, organizationId: number, domains?: string[]): Promise<number | undefined> {
  const active = await trx.selectFrom('sso_connections').select('id').where('organization_id', '=', organizationId).where('state', '=', 'active').limit(1).executeTakeFirst();
  if (!active) return undefined;
  const names =
    domains ??
    (await trx.selectFrom('sso_domains').select('domain').where('organization_id', '=', organizationId).where('state', '=', 'verified').where('sso_required', '=', true).execute()).map((d) => d.domain);
  if (names.length === 0) return undefined;
  // Through the index on the addresses' domain part (users_email_domain).
  const people = trx.selectFrom('users').select('id').where(sql<string>`split_part(lower(email), '@', 2)`, 'in', names);
  const ended = await trx
    .deleteFrom('sessions')
    .where('user_id', 'in', people)
    .where((eb) => eb.or([eb('sso_connection_id', 'is', null), eb('sso_connection_id', 'not in', eb.selectFrom('sso_connections').select('id').where('organization_id', '=', organizationId))]))
    .executeTakeFirst();
  await trx.deleteFrom('pending_sign_ins').where('user_id', 'in', people).execute();
  return Number(ended.numDeletedRows);
}

export async function deleteDomain(db: DB, organizationId: number, domain: string, actor?: Actor): Promise<void> {
  await inTransaction(db, async (trx) => {
    const row = await findDomainRow(trx, organizationId, domain);
    if (!row) throw notFound();
    await trx.deleteFrom('sso_domains').where('id', '=', row.id).execute();
    await recordAuditEvent(trx, { actor, organizationId, action: 'domain.deleted', details: { domain: row.domain } });
  });
}

/** Whether the organization has verified `domain` (which must be normalized). */
export async function hasVerifiedDomain(db: DB, organizationId: number, domain: string): Promise<boolean> {
  const row = await db.selectFrom('sso_domains').select('id').where('organization_id', '=', organizationId).where('domain', '=', domain).where('state', '=', 'verified').executeTakeFirst();
  return row !== undefined;
}

/**
 * Where an email address signs in: the organization that verified its domain, whether that
 * organization requires SSO for it, and its active connections (oldest first). Undefined when
 * no organization verified the domain, or the one that did has no active connection: then the
 * address signs in as any other (SSO required cannot lock people out of a connection-less
 * organization, its own admins included).
 */
export async function findSsoRoute(db: DB, email: string): Promise<{ organizationId: number; domain: string; ssoRequired: boolean; connections: { id: number; name: string }[] } | undefined> {
  const domain = emailDomain(email);
  if (domain === undefined) return undefined;
  const row = await db.selectFrom('sso_domains').select(['organization_id', 'sso_required']).where('domain', '=', domain).where('state', '=', 'verified').executeTakeFirst();
  if (!row) return undefined;
  const connections = await db
    .selectFrom('sso_connections')
    .select(['id', 'name'])
    .where('organization_id', '=', row.organization_id)
    .where('state', '=', 'active')
    .orderBy('id')
    .limit(20)
    .execute();
  if (connections.length === 0) return undefined;
  return { organizationId: row.organization_id, domain, ssoRequired: row.sso_required, connections };
}
