/**
 * What the single sign-on tests share (issue 25): a database (TEST_DATABASE_URL or PGlite), an
 * organization's upstream OpenID provider (upstream-oidc.ts, on 127.0.0.1), a DNS server holding
 * the organizations' TXT records (dns-server.ts), and orgauth listening on a loopback port with
 * DNS_SERVERS pointing at that DNS server and OUTBOUND_ALLOW_NETWORKS=127.0.0.0/8 (the guarded
 * outbound client refuses loopback otherwise, and the upstream lives there).
 *
 * ssoOrganization() sets one organization up as its admin would: an owner, a domain claimed and
 * proved through the DNS server and verifyDomain, and OIDC connections whose redirect URIs are
 * registered at the upstream. signInThroughSso() drives a Browser (inject, cookies) through the
 * email-first login, the upstream's sign-in and back to orgauth's callback.
 */
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { expect } from 'vitest';
import { createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { buildApp } from '../../src/app.js';
import { type Config, parseConfig } from '../../src/config.js';
import type { DB } from '../../src/db/connect.js';
import { createLogger } from '../../src/logger.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { type ConnectionSettings, createConnection } from '../../src/sso/connections.js';
import { addDomain, txtLookup, verifyDomain } from '../../src/sso/domains.js';
import { Browser, csrfTokenIn } from '../accounts/browser.js';
import { TEST_SECRET_KEY } from './app.js';
import { createTestDatabase } from './db.js';
import { startDnsServer, type TestDnsServer } from './dns-server.js';
import { freePort } from './process.js';
import { type SignInOptions, startUpstreamOidc, type UpstreamOidc } from './upstream-oidc.js';

export interface SsoWorld {
  t: Awaited<ReturnType<typeof createTestDatabase>>;
  db: DB;
  app: FastifyInstance;
  config: Config;
  /** orgauth's issuer, `http://127.0.0.1:PORT`. */
  issuer: string;
  upstream: UpstreamOidc;
  dns: TestDnsServer;
  /** What createConnection / updateConnection take, from this world's configuration. */
  settings: ConnectionSettings;
  /** The environment the app was built with (for a second app over the same database). */
  env: Record<string, string>;
  close(): Promise<void>;
}

export async function startSsoWorld(options: { env?: Record<string, string> } = {}): Promise<SsoWorld> {
  const t = await createTestDatabase();
  const [upstream, dns] = await Promise.all([startUpstreamOidc(), startDnsServer()]);
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const env = {
    SECRET_KEY: TEST_SECRET_KEY,
    LOG_LEVEL: 'silent',
    PORT: String(port),
    ISSUER: issuer,
    DATA_DIR: '/nonexistent-orgauth-test',
    DNS_SERVERS: dns.address,
    OUTBOUND_ALLOW_NETWORKS: '127.0.0.0/8',
    ...options.env,
  };
  const config = parseConfig(env);
  await ensureSigningKey(t.handle.db, { alg: config.signingAlg, secretKey: config.secretKey });
  const app = await buildApp(config, { db: t.handle.db, logger: createLogger(config), listen: t.handle.listen });
  await app.listen({ host: '127.0.0.1', port });
  return {
    t,
    db: t.handle.db,
    app,
    config,
    issuer,
    upstream,
    dns,
    settings: { issuer, secretKey: config.secretKey, allowHttp: config.outbound.allowHttp },
    env,
    close: async () => {
      await app.close();
      await Promise.all([upstream.close(), dns.close()]);
      await t.close();
    },
  };
}

/** Another app over the world's database, not listening, with `env` changed (undefined: removed). */
export async function buildSecondApp(world: SsoWorld, env: Record<string, string | undefined>): Promise<FastifyInstance> {
  const merged = Object.fromEntries(Object.entries({ ...world.env, ...env }).filter((e): e is [string, string] => e[1] !== undefined));
  const config = parseConfig(merged);
  return buildApp(config, { db: world.db, logger: createLogger(config), listen: world.t.handle.listen });
}

export interface SsoOrganization {
  organizationId: number;
  organizationName: string;
  ownerId: number;
  domain: string;
  /** The OIDC connections, oldest first; their clients are registered at the world's upstream. */
  connectionIds: number[];
  connectionId: number;
  /** Each connection's client_id at the upstream. */
  clientIds: string[];
}

let orgs = 0;

/**
 * An organization with `domain` claimed (and, unless `verify: false`, proved: the TXT record
 * published on the DNS server, verifyDomain through DNS_SERVERS), and `connections` OIDC
 * connections to the world's upstream (default one; `jit`, `state` for each).
 */
export async function ssoOrganization(
  world: SsoWorld,
  options: { domain: string; verify?: boolean; connections?: number; jit?: boolean; ssoRequired?: boolean; name?: string; claimDomain?: boolean },
): Promise<SsoOrganization> {
  const i = ++orgs;
  const owner = await createUser(world.db, { email: `owner-${i}-${Date.now()}@owners.example.org`, password: 'owner password 123' });
  const organization = await createOrganization(world.db, { name: options.name ?? `SSO Org ${i}`, ownerUserId: owner.id });
  if (options.claimDomain !== false) {
    const claimed = await addDomain(world.db, organization.id, { domain: options.domain });
    if (options.verify !== false) {
      world.dns.setTxt(claimed.verification.name, ['v=spf1 -all', claimed.verification.value]);
      const verified = await verifyDomain(world.db, txtLookup(world.config.dnsServers), organization.id, options.domain);
      expect(verified.state).toBe('verified');
    }
    if (options.ssoRequired) {
      await world.db.updateTable('sso_domains').set({ sso_required: true }).where('organization_id', '=', organization.id).execute();
    }
  }
  const connectionIds: number[] = [];
  const clientIds: string[] = [];
  for (let c = 0; c < (options.connections ?? 1); c++) {
    const clientId = `orgauth-${i}-${c}`;
    const clientSecret = `upstream-secret-${i}-${c}-0123456789abcdef`;
    const view = await createConnection(world.db, world.settings, organization.id, {
      protocol: 'oidc',
      name: c === 0 ? 'Corp IdP' : `Corp IdP ${c + 1}`,
      issuer: world.upstream.issuer,
      client_id: clientId,
      client_secret: clientSecret,
      jit: options.jit ?? true,
      default_role: 'member',
    });
    world.upstream.registerClient({ client_id: clientId, client_secret: clientSecret, redirect_uris: [view.redirect_uri!] });
    connectionIds.push(view.id);
    clientIds.push(clientId);
  }
  return { organizationId: organization.id, organizationName: organization.name, ownerId: owner.id, domain: options.domain, connectionIds, connectionId: connectionIds[0]!, clientIds };
}

/** A path and query of a URL on orgauth (what a Browser, which injects, can request). */
export function pathOf(world: Pick<SsoWorld, 'issuer'>, url: string | URL): string {
  const u = new URL(url, world.issuer);
  expect(u.origin).toBe(world.issuer);
  return `${u.pathname}${u.search}`;
}

/** The email step of the login page: GET /login (for its CSRF token), POST only the email. */
export async function postEmail(browser: Browser, email: string, returnTo?: string): Promise<LightMyRequestResponse> {
  const csrf_token = await browser.csrf(returnTo === undefined ? '/login' : `/login?${new URLSearchParams({ return_to: returnTo }).toString()}`);
  return browser.post('/login', { csrf_token, email, ...(returnTo === undefined ? {} : { return_to: returnTo }) });
}

/** Leaves for connection `id`'s provider directly (the chooser's form): POST /sso/:id/start. */
export async function startAt(browser: Browser, connectionId: number, returnTo = '/dashboard'): Promise<LightMyRequestResponse> {
  const page = await browser.get('/login');
  return browser.post(`/sso/${connectionId}/start`, { csrf_token: csrfTokenIn(page.body), return_to: returnTo });
}

/** The upstream's redirect back to orgauth for `login`, from orgauth's redirect to the upstream. */
export async function upstreamCallback(world: SsoWorld, leaving: LightMyRequestResponse, login: string, options: SignInOptions = {}): Promise<string> {
  expect(leaving.statusCode, leaving.body).toBe(303);
  const authorize = new URL(leaving.headers.location as string);
  expect(authorize.origin).toBe(world.upstream.issuer);
  return pathOf(world, await world.upstream.signIn(authorize, login, options));
}

/**
 * The whole SSO sign-in of `browser` as `email` (the upstream's account `login`): the email
 * step, the upstream, and orgauth's callback; returns the callback's response.
 */
export async function signInThroughSso(world: SsoWorld, browser: Browser, email: string, login: string, options: SignInOptions & { returnTo?: string } = {}): Promise<LightMyRequestResponse> {
  const leaving = await postEmail(browser, email, options.returnTo);
  return browser.get(await upstreamCallback(world, leaving, login, options));
}

/** The audit events of `organizationId` with `action`, oldest first. */
export function auditEvents(world: Pick<SsoWorld, 'db'>, organizationId: number, action: string) {
  return world.db.selectFrom('audit_events').select(['action', 'details']).where('organization_id', '=', organizationId).where('action', '=', action).orderBy('id').execute();
}

/** The visible text of a page: inline tags dropped, other tags a space, the templates' entities undone, whitespace collapsed. */
export function pageText(html: string): string {
  return unescapeHtml(html.replace(/<\/?(?:strong|em|code|a|span)(?:\s[^>]*)?>/g, '').replace(/<[^>]*>/g, ' ')).replace(/\s+/g, ' ').trim();
}

export function unescapeHtml(s: string): string {
  return s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
}
