/**
 * Apache httpd with Debian's mod_oauth2 (OpenIDC's resource-server module) in front of a small
 * backend, configured as its documentation shows and with nothing orgauth-specific (issue 44):
 *
 * - `OAuth2TokenVerify introspect` with the resource's own credentials: accepts an orgauth token
 *   for that resource; refuses one for another resource, a revoked one and a removed member's.
 * - `OAuth2TokenVerify jwks_uri` with `Require oauth2_claim aud:<resource>`: the same offline
 *   (a revoked token then passes until it expires, as any offline check; see docs/resource-servers.md).
 *
 * Skipped with a notice without apache2 and libapache2-mod-oauth2 (`.ci/run` installs them; under
 * CI their absence fails the file).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, removeMember } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { registerResource } from '../../src/oauth/models/resource-clients.js';
import { type Apache, apacheMissing, startApache } from '../helpers/apache.js';
import { userTokens } from '../helpers/consent.js';
import { BACKEND } from '../helpers/db.js';
import { basic, form } from '../helpers/oauth.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';

const skipReason = apacheMissing();
if (skipReason && process.env.CI) throw new Error(`the Apache mod_oauth2 tests cannot run in CI: ${skipReason}`);
if (skipReason) console.warn(`\n*** Apache mod_oauth2 tests (issue 44) SKIPPED: ${skipReason}. ***\n`);

const PASSWORD = 'apache-password-1';
const REDIRECT = 'https://gateway.example.com/callback';
const ORDERS = 'https://orders.example.com';
const BILLING = 'https://billing.example.com';

describe.skipIf(skipReason !== undefined)(`Apache mod_oauth2 in front of a service, on ${BACKEND}`, () => {
  let world: OidcWorld;
  let apache: Apache;
  let backend: Server;
  let app: { client_id: string; client_secret: string; redirect_uri: string };
  let n = 0;

  /** A new member of the world's organization and their tokens for `resource`. */
  async function memberTokens(resource: string) {
    const email = `apache-${++n}-${process.pid}-${Date.now()}@example.com`;
    const user = await createUser(world.t.handle.db, { email, password: PASSWORD, name: `Gateway User ${n}` });
    await addMember(world.t.handle.db, { organizationId: world.org.organizationId, userId: user.id, role: 'member' });
    return { userId: user.id, ...(await userTokens(world, app, { email, password: PASSWORD, organizationId: world.org.organizationId }, { scope: 'orders.read', resource })) };
  }

  const through = async (location: string, token: string) => {
    const res = await fetch(`${apache.url}${location}orders`, { headers: { authorization: `Bearer ${token}` } });
    return { status: res.status, body: await res.text() };
  };

  beforeAll(async () => {
    world = await startOidcWorld();
    const db = world.t.handle.db;
    const application = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Gateway UI', redirectUris: [REDIRECT], scopes: 'contacts.read' });
    app = { ...application, redirect_uri: REDIRECT };
    const orders = await registerResource(db, world.config, { uri: ORDERS, name: 'Orders', scopes: 'orders.read' });
    await registerResource(db, world.config, { uri: BILLING, name: 'Billing', scopes: 'orders.read' });
    // The backend answers whatever reaches it: what passes Apache is what the test sees.
    backend = createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/plain' }).end('backend reached')).listen(0, '127.0.0.1');
    await new Promise((resolve) => backend.once('listening', resolve));
    const backendUrl = `http://127.0.0.1:${(backend.address() as AddressInfo).port}/`;
    const { client_id: clientId, client_secret: clientSecret } = orders.credentials;
    apache = await startApache({
      '/introspect/': [
        'AuthType oauth2',
        `OAuth2TokenVerify introspect ${world.issuer}/oauth/introspect introspect.auth=client_secret_basic&client_id=${clientId}&client_secret=${encodeURIComponent(clientSecret)}`,
        'Require valid-user',
        `ProxyPass "${backendUrl}"`,
      ],
      '/jwks/': [
        'AuthType oauth2',
        `OAuth2TokenVerify jwks_uri ${world.issuer}/.well-known/jwks.json`,
        `Require oauth2_claim aud:${ORDERS}`,
        `ProxyPass "${backendUrl}"`,
      ],
    });
  });

  afterAll(async () => {
    await apache?.stop();
    await new Promise((resolve) => (backend ? backend.close(resolve) : resolve(undefined)));
    await world?.close();
  });

  it('introspect: accepts a token for its resource; refuses one for another resource, a revoked one and a removed member’s', async () => {
    const own = await memberTokens(ORDERS);
    expect(await through('/introspect/', own.access_token), apache.log()).toEqual({ status: 200, body: 'backend reached' });
    const other = await memberTokens(BILLING);
    expect((await through('/introspect/', other.access_token)).status).toBe(401);

    const revoked = await memberTokens(ORDERS);
    const res = await fetch(`${world.issuer}/oauth/revoke`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(app.client_id, app.client_secret) }, body: form({ token: revoked.refresh_token }) });
    expect(res.status).toBe(200);
    expect((await through('/introspect/', revoked.access_token)).status).toBe(401);

    const removed = await memberTokens(ORDERS);
    await removeMember(world.t.handle.db, { organizationId: world.org.organizationId, userId: removed.userId });
    expect((await through('/introspect/', removed.access_token)).status).toBe(401);
    expect((await through('/introspect/', 'not-a-token')).status).toBe(401);
  });

  it('jwks_uri with Require oauth2_claim aud: accepts a token for its resource offline, refuses one for another resource', async () => {
    const own = await memberTokens(ORDERS);
    expect(await through('/jwks/', own.access_token), apache.log()).toEqual({ status: 200, body: 'backend reached' });
    const other = await memberTokens(BILLING);
    expect((await through('/jwks/', other.access_token)).status).toBe(401);
    expect((await through('/jwks/', `${own.access_token.slice(0, -4)}AAAA`)).status).toBe(401);
  });
});
