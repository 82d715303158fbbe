/**
 * What the SAML sign-in tests share: a database (TEST_DATABASE_URL or PGlite), the app (built by
 * buildTestApp, its issuer ISSUER), an organization that verified corp.example through a real DNS
 * TXT lookup (test/helpers/dns-server.ts), and one active SAML connection of it trusting the test
 * IdP (test/helpers/saml-idp.ts, samlify), JIT on with the default role member. Plus the steps of
 * a browser's sign-in and the counts the attack tests compare before and after.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import type { Config } from '../../src/config.js';
import { connectDatabase, type DB } from '../../src/db/connect.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { type ConnectionView, connectionUrls, createConnection, connectionSettings } from '../../src/sso/connections.js';
import { addDomain, txtLookup, verifyDomain } from '../../src/sso/domains.js';
import { Browser } from '../accounts/browser.js';
import { buildTestApp, testConfig } from './app.js';
import { createTestDatabase } from './db.js';
import { startDnsServer } from './dns-server.js';
import { createSamlIdp, parseAuthnRequest, type ParsedAuthnRequest, type TestSamlIdp } from './saml-idp.js';

/** The public base URL of every instance (as behind one load balancer). */
export const ISSUER = 'http://auth.orgauth.test';
export const DOMAIN = 'corp.example';

export interface SamlWorld {
  t: Awaited<ReturnType<typeof createTestDatabase>>;
  db: DB;
  app: FastifyInstance;
  config: Config;
  organizationId: number;
  idp: TestSamlIdp;
  connection: ConnectionView;
  /** entity_id, acs_url, metadata_url of `connection`. */
  urls: ReturnType<typeof connectionUrls>;
  /** An app over the same database, built the same way (on PostgreSQL with its own pool), closed with the world. */
  instance(): Promise<FastifyInstance>;
  close(): Promise<void>;
}

export const settings = connectionSettings;

/** An organization (owned by a fresh user) that verified `domain` through a DNS TXT record. */
export async function orgWithVerifiedDomain(db: DB, domain: string): Promise<number> {
  const owner = await createUser(db, { email: `owner-${domain}-${Date.now()}@owners.example`, password: 'owner-password-1', name: 'Owner' });
  const { id } = await createOrganization(db, { name: `Org of ${domain}`, ownerUserId: owner.id });
  const claim = await addDomain(db, id, { domain });
  const dns = await startDnsServer();
  try {
    dns.setTxt(claim.verification.name, [claim.verification.value]);
    await verifyDomain(db, txtLookup([dns.address]), id, domain);
  } finally {
    await dns.close();
  }
  return id;
}

export async function startSamlWorld(): Promise<SamlWorld> {
  const t = await createTestDatabase();
  const db = t.handle.db;
  const env = { ISSUER };
  const config = testConfig(env);
  await ensureSigningKey(db, { alg: config.signingAlg, secretKey: config.secretKey });
  const app = await buildTestApp(db, { env, listen: t.handle.listen });
  const organizationId = await orgWithVerifiedDomain(db, DOMAIN);
  const idp = createSamlIdp();
  const connection = await createConnection(db, settings(config), organizationId, {
    protocol: 'saml',
    name: 'Corp IdP',
    idp_entity_id: idp.entityId,
    idp_sso_url: idp.ssoUrl,
    idp_certificates: [idp.certificatePem],
    jit: true,
    default_role: 'member',
  });
  const others: (() => Promise<void>)[] = [];
  return {
    t,
    db,
    app,
    config,
    organizationId,
    idp,
    connection,
    urls: connectionUrls(config.issuer, connection.id),
    async instance() {
      const handle = t.target.kind === 'postgres' ? await connectDatabase(t.target) : undefined;
      const other = handle ?? t.handle;
      const second = await buildTestApp(other.db, { env, listen: other.listen });
      others.push(async () => {
        await second.close();
        await handle?.close();
      });
      return second;
    },
    async close() {
      for (const close of others) await close();
      await app.close();
      await t.close();
    },
  };
}

let address = 0;
/** A browser of its own client address (the sign-in throttles count per address). */
export const newBrowser = (app: FastifyInstance): Browser => new Browser(app, `10.25.${Math.floor(++address / 250)}.${(address % 250) + 1}`);

/** The email step of the sign-in page: an address of a verified domain leaves for the IdP (303). */
export async function startAtLogin(browser: Browser, email: string, returnTo = '/dashboard'): Promise<{ res: LightMyRequestResponse; request: ParsedAuthnRequest }> {
  const csrf_token = await browser.csrf('/login');
  const res = await browser.post('/login', { csrf_token, return_to: returnTo, email });
  if (res.statusCode !== 303) throw new Error(`POST /login answered ${res.statusCode}: ${res.body.slice(0, 300)}`);
  return { res, request: parseAuthnRequest(String(res.headers.location)) };
}

/** POST /sso/:id/start (the chooser's form): for a connection that is not its domain's only one. */
export async function startAtConnection(browser: Browser, connectionId: number, returnTo = '/dashboard'): Promise<ParsedAuthnRequest> {
  const csrf_token = await browser.csrf('/login');
  const res = await browser.post(`/sso/${connectionId}/start`, { csrf_token, return_to: returnTo });
  if (res.statusCode !== 303) throw new Error(`POST /sso/${connectionId}/start answered ${res.statusCode}: ${res.body.slice(0, 300)}`);
  return parseAuthnRequest(String(res.headers.location));
}

/** What the IdP's page does: POSTs the SAMLResponse (and RelayState) to the ACS, from the browser. */
export function postToAcs(browser: Browser, connectionId: number, samlResponse: string, relayState?: string): Promise<LightMyRequestResponse> {
  return browser.post(`/sso/${connectionId}/saml/acs`, { SAMLResponse: samlResponse, ...(relayState === undefined ? {} : { RelayState: relayState }) });
}

/** Posts the response, follows the 303 to /sso/finish; throws if the ACS does not accept it. */
export async function acsThenFinish(browser: Browser, connectionId: number, samlResponse: string, relayState?: string): Promise<LightMyRequestResponse> {
  const acs = await postToAcs(browser, connectionId, samlResponse, relayState);
  if (acs.statusCode !== 303 || !String(acs.headers.location).startsWith('/sso/finish?handle=')) throw new Error(`the ACS answered ${acs.statusCode} ${String(acs.headers.location)}: ${acs.body.slice(0, 300)}`);
  return browser.get(String(acs.headers.location));
}

/**
 * The confirmation an IdP-initiated (unsolicited) response needs: GET /sso/finish?handle=... of a
 * handle bound to no browser shows the "Continue as <email>" page (view sso-continue), which
 * signs nobody in (the caller checks that with `page`); its form POSTs csrf_token and handle back
 * to /sso/finish. Returns the page and the POST's response.
 */
export async function confirmUnsolicited(browser: Browser, finishUrl: string): Promise<{ page: LightMyRequestResponse; done: LightMyRequestResponse }> {
  const page = await browser.get(finishUrl);
  if (page.statusCode !== 200) throw new Error(`GET ${finishUrl} answered ${page.statusCode}: ${page.body.slice(0, 300)}`);
  const field = (name: string) => new RegExp(`name="${name}" value="([^"]*)"`).exec(page.body)?.[1];
  const csrf_token = field('csrf_token');
  const handle = field('handle');
  if (!csrf_token || !handle) throw new Error(`no confirmation form on ${finishUrl}: ${page.body.slice(0, 300)}`);
  const done = await browser.post('/sso/finish', { csrf_token, handle });
  return { page, done };
}

/** What the database holds of sign-ins: compared before and after a refused response. */
export async function counts(db: DB): Promise<{ users: number; identities: number; sessions: number; memberships: number }> {
  const count = async (table: 'users' | 'sso_identities' | 'sessions' | 'memberships') =>
    Number((await db.selectFrom(table).select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow()).n);
  return { users: await count('users'), identities: await count('sso_identities'), sessions: await count('sessions'), memberships: await count('memberships') };
}

/** The reasons of the `action` audit events of the organization, oldest first. */
export async function auditReasons(db: DB, organizationId: number, action: string): Promise<string[]> {
  const rows = await db.selectFrom('audit_events').select('details').where('organization_id', '=', organizationId).where('action', '=', action).orderBy('id').execute();
  return rows.map((r) => String((r.details as { reason?: unknown }).reason ?? ''));
}

/** The sessions of the user with `email` (none: an empty list). */
export async function sessionsOf(db: DB, email: string) {
  return db.selectFrom('sessions').innerJoin('users', 'users.id', 'sessions.user_id').select(['sessions.amr', 'sessions.sso_connection_id', 'sessions.user_id', 'sessions.current_organization_id']).where('users.email', '=', email).execute();
}
