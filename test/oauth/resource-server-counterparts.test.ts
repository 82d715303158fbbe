/**
 * Services of our users' own behind orgauth (issue 44), checked by code orgauth did not write:
 *
 * - examples/resource-server (jose, docs/resource-servers.md), both ways: offline with orgauth's
 *   keys, and by introspection with the resource's own credentials. Each accepts a token for its
 *   resource and organization and refuses one for another resource, another organization, or
 *   without the scope; only introspection refuses a revoked token before it expires.
 * - Auth0's `express-oauth2-jwt-bearer` (express middleware), configured with orgauth's issuer
 *   and the resource as audience and nothing else orgauth-specific: accepts the resource's
 *   tokens, refuses another's.
 */
import type { AddressInfo } from 'node:net';
import express from 'express';
import { auth, requiredScopes } from 'express-oauth2-jwt-bearer';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createApplication } from '../../src/oauth/models/applications.js';
import { registerResource } from '../../src/oauth/models/resource-clients.js';
import { type RunningResourceServer, startResourceServer } from '../../examples/resource-server/server.js';
import { userTokens } from '../helpers/consent.js';
import { BACKEND } from '../helpers/db.js';
import { basic, form } from '../helpers/oauth.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';
import { freePort } from '../helpers/process.js';

const PASSWORD = 'counterparts-password-1';
const REDIRECT = 'https://agent.example.com/callback';

let world: OidcWorld;
let app: { client_id: string; client_secret: string; redirect_uri: string };
let user: { email: string; password: string; organizationId: number };
let otherOrganization: number;
/** The two services, each registered at the address it listens on. */
const services: { jwt?: RunningResourceServer; introspection?: RunningResourceServer } = {};
let uris: { jwt: string; introspection: string; elsewhere: string };

beforeAll(async () => {
  world = await startOidcWorld();
  const db = world.t.handle.db;
  const created = await createUser(db, { email: `counterparts-${process.pid}-${Date.now()}@example.com`, password: PASSWORD, name: 'Counter Part' });
  await addMember(db, { organizationId: world.org.organizationId, userId: created.id, role: 'member' });
  otherOrganization = (await createOrganization(db, { name: 'Elsewhere', ownerUserId: created.id })).id;
  user = { email: created.email, password: PASSWORD, organizationId: world.org.organizationId };
  const application = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Orders UI', redirectUris: [REDIRECT], scopes: 'contacts.read' });
  app = { ...application, redirect_uri: REDIRECT };

  const [jwtPort, introspectionPort] = [await freePort(), await freePort()];
  uris = { jwt: `http://127.0.0.1:${jwtPort}`, introspection: `http://127.0.0.1:${introspectionPort}`, elsewhere: 'https://elsewhere.example.com' };
  await registerResource(db, world.config, { uri: uris.jwt, name: 'Orders (JWKS)', scopes: 'orders.read orders.write', accessTokenTtl: 600 });
  const introspected = await registerResource(db, world.config, { uri: uris.introspection, name: 'Orders (introspection)', scopes: 'orders.read orders.write' });
  await registerResource(db, world.config, { uri: uris.elsewhere, name: 'Elsewhere', scopes: 'orders.read' });
  const orders = { [world.org.organizationId]: [{ id: 'o-1', total: 42 }], [otherOrganization]: [{ id: 'o-2', total: 7 }] };
  services.jwt = await startResourceServer({ issuer: world.issuer, resourceUri: uris.jwt, port: jwtPort, mode: { kind: 'jwt' }, orders });
  services.introspection = await startResourceServer({
    issuer: world.issuer,
    resourceUri: uris.introspection,
    port: introspectionPort,
    mode: { kind: 'introspection', clientId: introspected.credentials.client_id, clientSecret: introspected.credentials.client_secret },
    orders,
  });
});

afterAll(async () => {
  await services.jwt?.close();
  await services.introspection?.close();
  await world?.close();
});

const get = async (url: string, token?: string) => {
  const res = await fetch(url, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  return { status: res.status, challenge: res.headers.get('www-authenticate'), body: (await res.json()) as Record<string, unknown> };
};

describe(`examples/resource-server on ${BACKEND}`, () => {
  for (const kind of ['jwt', 'introspection'] as const) {
    it(`${kind}: its own token for the organization in the path, and nothing else`, async () => {
      const service = services[kind]!;
      const own = await userTokens(world, app, user, { scope: 'orders.read', resource: uris[kind] });
      expect(await get(`${service.url}/orgs/${world.org.organizationId}/orders`, own.access_token)).toMatchObject({
        status: 200,
        body: { organization_id: world.org.organizationId, orders: [{ id: 'o-1', total: 42 }] },
      });
      // Another organization's path: the token is for one organization only.
      expect((await get(`${service.url}/orgs/${otherOrganization}/orders`, own.access_token)).status).toBe(403);
      // Another resource's token, and orgauth's API's: invalid_token.
      const elsewhere = await userTokens(world, app, user, { scope: 'orders.read', resource: uris.elsewhere });
      const api = await userTokens(world, app, user, { scope: 'contacts.read' });
      for (const token of [elsewhere.access_token, api.access_token, 'not-a-token']) {
        expect(await get(`${service.url}/orgs/${world.org.organizationId}/orders`, token)).toMatchObject({ status: 401, challenge: 'Bearer error="invalid_token"' });
      }
      expect(await get(`${service.url}/orgs/${world.org.organizationId}/orders`)).toMatchObject({ status: 401, challenge: 'Bearer' });
      // Without the scope: insufficient_scope, naming the one to ask for.
      const writer = await userTokens(world, app, user, { scope: 'orders.write', resource: uris[kind] });
      expect(await get(`${service.url}/orgs/${world.org.organizationId}/orders`, writer.access_token)).toMatchObject({
        status: 403,
        challenge: 'Bearer error="insufficient_scope", scope="orders.read"',
      });
    });
  }

  it('a revoked token: refused at once by introspection, accepted offline until it expires (keep the lifetime short)', async () => {
    const byJwt = await userTokens(world, app, user, { scope: 'orders.read', resource: uris.jwt });
    const byIntrospection = await userTokens(world, app, user, { scope: 'orders.read', resource: uris.introspection });
    for (const token of [byJwt.refresh_token, byIntrospection.refresh_token]) {
      const res = await fetch(`${world.issuer}/oauth/revoke`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(app.client_id, app.client_secret) }, body: form({ token }) });
      expect(res.status).toBe(200);
    }
    expect((await get(`${services.introspection!.url}/orgs/${world.org.organizationId}/orders`, byIntrospection.access_token)).status).toBe(401);
    expect((await get(`${services.jwt!.url}/orgs/${world.org.organizationId}/orders`, byJwt.access_token)).status).toBe(200);
  });
});

describe(`express-oauth2-jwt-bearer (Auth0's middleware) on ${BACKEND}`, () => {
  it('with orgauth’s issuer and the resource as audience: accepts the resource’s tokens, refuses another’s and a wrong scope', async () => {
    const server = express()
      .use(auth({ issuerBaseURL: world.issuer, audience: uris.jwt, tokenSigningAlg: world.config.signingAlg }))
      .get('/orders', requiredScopes('orders.read'), (req, res) => {
        res.json({ organization_id: req.auth?.payload.organization_id, sub: req.auth?.payload.sub });
      })
      .listen(0, '127.0.0.1');
    await new Promise((resolve) => server.once('listening', resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/orders`;
      const own = await userTokens(world, app, user, { scope: 'orders.read', resource: uris.jwt });
      expect(await get(url, own.access_token)).toMatchObject({ status: 200, body: { organization_id: world.org.organizationId } });
      const elsewhere = await userTokens(world, app, user, { scope: 'orders.read', resource: uris.elsewhere });
      const res = await fetch(url, { headers: { authorization: `Bearer ${elsewhere.access_token}` } });
      expect(res.status).toBe(401);
      expect(res.headers.get('www-authenticate')).toMatch(/error="invalid_token"/);
      const writer = await userTokens(world, app, user, { scope: 'orders.write', resource: uris.jwt });
      const scoped = await fetch(url, { headers: { authorization: `Bearer ${writer.access_token}` } });
      expect(scoped.status).toBe(403);
      expect(scoped.headers.get('www-authenticate')).toMatch(/error="insufficient_scope"/);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
