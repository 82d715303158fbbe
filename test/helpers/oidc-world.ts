/**
 * What the OpenID Connect tests share: a database (TEST_DATABASE_URL or PGlite), the app
 * listening on a loopback port with that address as its issuer (openid-client and oauth4webapi
 * talk to it over real HTTP), an organization, and its members, each with a browser of their own.
 */
import type { FastifyInstance } from 'fastify';
import * as client from 'openid-client';
import { addMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { buildApp } from '../../src/app.js';
import { type Config, parseConfig } from '../../src/config.js';
import { createLogger } from '../../src/logger.js';
import { type ApplicationWithSecret, createApplication } from '../../src/oauth/models/applications.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { Browser } from '../accounts/browser.js';
import { TEST_SECRET_KEY } from './app.js';
import { createTestDatabase } from './db.js';
import { createOrgFixture, type OrgFixture } from './oauth.js';
import { freePort } from './process.js';

export interface OidcWorld {
  t: Awaited<ReturnType<typeof createTestDatabase>>;
  app: FastifyInstance;
  config: Config;
  issuer: string;
  org: OrgFixture;
  close(): Promise<void>;
}

/** `env`: more configuration, on top of the world's (OUTBOUND_CA_FILE, OUTBOUND_ALLOW_NETWORKS, ...). */
export async function startOidcWorld(env: Record<string, string> = {}): Promise<OidcWorld> {
  const t = await createTestDatabase();
  const port = await freePort();
  const issuer = `http://127.0.0.1:${port}`;
  const config = parseConfig({ SECRET_KEY: TEST_SECRET_KEY, LOG_LEVEL: 'silent', DATA_DIR: '/nonexistent-orgauth-test', ...env, PORT: String(port), ISSUER: issuer });
  await ensureSigningKey(t.handle.db, { alg: config.signingAlg, secretKey: config.secretKey });
  const app = await buildApp(config, { db: t.handle.db, logger: createLogger(config), listen: t.handle.listen });
  await app.listen({ host: '127.0.0.1', port });
  const org = await createOrgFixture(t.handle.db);
  return {
    t,
    app,
    config,
    issuer,
    org,
    close: async () => {
      await app.close();
      await t.close();
    },
  };
}

export const RP_REDIRECT = 'https://rp.example.com/callback';

/** The relying party of the tests: a public application of the world's organization, signing users in at RP_REDIRECT. */
export function createRelyingParty(world: Pick<OidcWorld, 't' | 'org'>, postLogoutRedirectUris: string[]): Promise<ApplicationWithSecret> {
  return createApplication(world.t.handle.db, {
    organizationId: world.org.organizationId,
    type: 'public',
    name: 'Relying Party',
    redirectUris: [RP_REDIRECT],
    postLogoutRedirectUris,
    scopes: 'contacts.read contacts.write tasks.read',
  });
}

/** openid-client configured for `application` from the discovery document only (http allowed for the loopback issuer). */
export function discover(world: Pick<OidcWorld, 'issuer'>, application: ApplicationWithSecret): Promise<client.Configuration> {
  return client.discovery(new URL(world.issuer), application.client_id, application.client_secret, undefined, { execute: [client.allowInsecureRequests] });
}

/** An authorization request as openid-client builds it (PKCE, nonce, state), with the checks for its response. */
export async function authorizationRequest(oidc: client.Configuration, scope: string, extra: Record<string, string> = {}, redirectUri = RP_REDIRECT) {
  const verifier = client.randomPKCECodeVerifier();
  const nonce = client.randomNonce();
  const state = client.randomState();
  const url = client.buildAuthorizationUrl(oidc, {
    redirect_uri: redirectUri,
    scope,
    state,
    nonce,
    code_challenge: await client.calculatePKCECodeChallenge(verifier),
    code_challenge_method: 'S256',
    ...extra,
  });
  return { url, checks: { pkceCodeVerifier: verifier, expectedNonce: nonce, expectedState: state }, nonce, state };
}

export interface Person {
  id: number;
  email: string;
  name: string;
  browser: Browser;
}

let n = 0;
/** A member of the world's organization with a name, not yet signed in, with a browser of their own address. */
export async function oidcPerson(world: Pick<OidcWorld, 't' | 'app' | 'org'>, password: string, role: 'member' | 'viewer' = 'member'): Promise<Person> {
  const i = ++n;
  const email = `oidc-${i}-${process.pid}-${Date.now()}@example.com`;
  const name = `Grace Hopper ${i}`;
  const user = await createUser(world.t.handle.db, { email, password, name });
  await addMember(world.t.handle.db, { organizationId: world.org.organizationId, userId: user.id, role });
  return { id: user.id, email, name, browser: new Browser(world.app, `10.16.${Math.floor(i / 250)}.${(i % 250) + 1}`) };
}

/** The hidden fields of a page's form, unescaped. */
export function hiddenFields(html: string): Record<string, string> {
  const fields: Record<string, string> = {};
  const unescape = (s: string) => s.replace(/&quot;/g, '"').replace(/&#39;/g, "'").replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&amp;/g, '&');
  for (const m of html.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)) fields[m[1] ?? ''] = unescape(m[2] ?? '');
  return fields;
}
