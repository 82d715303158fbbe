/**
 * Resource indicators (RFC 8707, AG-2): `resource` on /oauth/authorize and /oauth/token makes
 * the token's `aud` exactly the registered URI (compared in canonical form), refuses unknown and
 * mismatched resources with invalid_target, keeps the audience on refresh, and every resource
 * (orgauth's API included) refuses a token for another. Declared scopes follow the roles: owner,
 * admin and member hold them, viewer none, and a demotion narrows them away.
 */
import { createHash, randomBytes } from 'node:crypto';
import { decodeJwt } from 'jose';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { addMember, changeMemberRole, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import { createRole, findRole, updateRole } from '../../src/accounts/roles.js';
import { sql } from 'kysely';
import { createApplication, findApplicationByClientId, updateApplication } from '../../src/oauth/models/applications.js';
import type { DeveloperApplication } from '../../src/db/schema.js';
import { listLiveGrants } from '../../src/oauth/models/grants.js';
import { canonicalResourceUri } from '../../src/oauth/helpers/resources.js';
import { createResource, deleteResource, updateResource } from '../../src/oauth/models/resources.js';
import { redirectUriMatches } from '../../src/oauth/helpers/redirect-uris.js';
import { approveConsent, signInFor } from '../helpers/consent.js';
import { finishJobs } from '../helpers/jobs.js';
import { basic, form } from '../helpers/oauth.js';
import { type OidcWorld, startOidcWorld } from '../helpers/oidc-world.js';
import { BACKEND } from '../helpers/db.js';

const PASSWORD = 'resource-user-password-1';
const MCP = 'https://mcp.example.com/mcp';
const OTHER = 'https://files.example.com';
const REDIRECT = 'https://agent.example.com/callback';

/**
 * This process's clock (Date: the server's, and on the embedded database the database's), moved
 * forward where a test would otherwise wait for the resource registry to read the resources again
 * (a second after its last read). It runs at the real pace, and never goes back during the file:
 * a cache stamped at a later time would keep what it read until real time caught up.
 */
const RealDate = Date;
let ahead = 0;
class AheadDate extends RealDate {
  constructor(...args: unknown[]) {
    super(...((args.length === 0 ? [RealDate.now() + ahead] : args) as [string]));
  }
  static override now(): number {
    return RealDate.now() + ahead;
  }
  static override [Symbol.hasInstance](value: unknown): boolean {
    return value instanceof RealDate;
  }
}
/** Lets the registry's second pass (RELOAD_MS in src/oauth/models/resources.ts) without waiting for it. */
const afterRegistryReload = () => void (ahead += 1100);

let world: OidcWorld;
let user: { id: number; email: string };
let app: { client_id: string; client_secret: string };
const orgs = { owned: 0, member: 0, viewer: 0 };

beforeAll(async () => {
  vi.stubGlobal('Date', AheadDate);
  world = await startOidcWorld();
  const db = world.t.handle.db;
  const created = await createUser(db, { email: `resources-${process.pid}-${Date.now()}@example.com`, password: PASSWORD, name: 'Res User' });
  user = { id: created.id, email: created.email };
  const other = await createUser(db, { email: `resources-owner-${process.pid}-${Date.now()}@example.com`, password: PASSWORD });
  orgs.owned = (await createOrganization(db, { name: 'Owned', ownerUserId: user.id })).id;
  orgs.member = (await createOrganization(db, { name: 'Membered', ownerUserId: other.id })).id;
  orgs.viewer = (await createOrganization(db, { name: 'Viewed', ownerUserId: other.id })).id;
  await addMember(db, { organizationId: orgs.member, userId: user.id, role: 'member' });
  await addMember(db, { organizationId: orgs.viewer, userId: user.id, role: 'viewer' });
  app = await createApplication(db, { organizationId: world.org.organizationId, type: 'public', name: 'Agent', redirectUris: [REDIRECT], scopes: 'contacts.read tasks.read' });
  await createResource(db, world.config, { uri: 'https://MCP.example.com:443/mcp/', name: 'Contacts MCP', scopes: 'contacts.read tools.call', accessTokenTtl: 900 });
  await createResource(db, world.config, { uri: OTHER, name: 'Files', scopes: 'files.read' });
});

afterAll(async () => {
  await world?.close();
  vi.unstubAllGlobals();
});

function pkce() {
  const verifier = randomBytes(32).toString('base64url');
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
}

function authorizeUrl(params: Record<string, string>): URL {
  const url = new URL('/oauth/authorize', world.issuer);
  for (const [k, v] of Object.entries({ client_id: app.client_id, redirect_uri: REDIRECT, response_type: 'code', state: randomBytes(16).toString('hex'), ...params })) url.searchParams.set(k, v);
  return url;
}

async function token(fields: Record<string, string>): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${world.issuer}/oauth/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(app.client_id, app.client_secret) },
    body: form(fields),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** Signs in, approves for `organizationId`, and returns the code and its verifier. */
async function authorize(params: Record<string, string>, organizationId: number): Promise<{ code: string; verifier: string; consent: string }> {
  const { verifier, challenge } = pkce();
  // prompt=consent: the page every time, not a consent remembered from an earlier test.
  const { browser, page } = await signInFor(authorizeUrl({ code_challenge: challenge, code_challenge_method: 'S256', prompt: 'consent', ...params }), { issuer: world.issuer, email: user.email, password: PASSWORD });
  const consent = await page.text();
  expect(page.status, consent).toBe(200);
  const callback = await approveConsent(browser, world.issuer, consent, organizationId);
  const code = callback.searchParams.get('code');
  if (!code) throw new Error(`no code: ${callback}`);
  return { code, verifier, consent };
}

describe('resource URIs in canonical form', () => {
  it('lower-cases scheme and host, drops the default port, a lone trailing slash; refuses fragments, queries and plain http off loopback', () => {
    expect(canonicalResourceUri('HTTPS://MCP.Example.COM:443/mcp/')).toBe('https://mcp.example.com/mcp');
    expect(canonicalResourceUri('https://mcp.example.com/')).toBe('https://mcp.example.com');
    expect(canonicalResourceUri('https://mcp.example.com:8443/Path')).toBe('https://mcp.example.com:8443/Path');
    expect(canonicalResourceUri('http://localhost:3001/mcp')).toBe('http://localhost:3001/mcp');
    for (const bad of ['https://mcp.example.com/mcp#x', 'https://mcp.example.com/mcp?a=1', 'http://mcp.example.com/mcp', 'urn:example:mcp', 'mcp', 'https://u:p@mcp.example.com/']) {
      expect(canonicalResourceUri(bad), bad).toBeUndefined();
    }
  });

  it('matches loopback redirect URIs whatever the port (RFC 8252 §7.3), everything else byte for byte', () => {
    expect(redirectUriMatches('http://127.0.0.1/cb', 'http://127.0.0.1:53412/cb')).toBe(true);
    expect(redirectUriMatches('http://[::1]:8080/cb', 'http://[::1]:9/cb')).toBe(true);
    expect(redirectUriMatches('http://localhost/cb', 'http://localhost:3000/cb')).toBe(true);
    expect(redirectUriMatches('http://127.0.0.1/cb', 'http://127.0.0.1:53412/cb2')).toBe(false);
    expect(redirectUriMatches('http://127.0.0.1/cb', 'http://localhost:53412/cb')).toBe(false);
    expect(redirectUriMatches('https://a.example.com/cb', 'https://a.example.com:444/cb')).toBe(false);
    expect(redirectUriMatches('http://127.0.0.1/cb', 'http://127.0.0.1:1@evil.example/cb')).toBe(false);
  });
});

describe(`resource indicators (RFC 8707) on ${BACKEND}`, () => {
  it('authorization_code: aud is exactly the registered URI (asked for in another spelling), lifetime the resource’s; the API refuses the token', async () => {
    const { code, verifier, consent } = await authorize({ resource: 'https://mcp.EXAMPLE.com/mcp/', scope: 'contacts.read tools.call' }, orgs.member);
    expect(consent).toContain('<strong>Contacts MCP</strong> (<code>https://mcp.example.com/mcp</code>)');
    const res = await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier, resource: MCP });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body).toMatchObject({ scope: 'contacts.read tools.call', organization_id: orgs.member, expires_in: 900 });
    const claims = decodeJwt(String(res.body.access_token));
    expect(claims.aud).toBe(MCP);
    expect(claims.exp! - claims.iat!).toBe(900);
    // AG-2: orgauth's own API refuses a token for another resource.
    const api = await fetch(`${world.issuer}/api/v1/${orgs.member}/contacts`, { headers: { authorization: `Bearer ${String(res.body.access_token)}` } });
    expect(api.status).toBe(401);
    expect(api.headers.get('www-authenticate')).toContain('error="invalid_token"');

    // Refresh keeps the audience, also when the resource is named again; another resource is invalid_target.
    const other = await token({ grant_type: 'refresh_token', refresh_token: String(res.body.refresh_token), resource: OTHER });
    expect(other).toMatchObject({ status: 400, body: { error: 'invalid_target' } });
    const refreshed = await token({ grant_type: 'refresh_token', refresh_token: String(res.body.refresh_token) });
    expect(refreshed.status).toBe(200);
    expect(decodeJwt(String(refreshed.body.access_token)).aud).toBe(MCP);
    const again = await token({ grant_type: 'refresh_token', refresh_token: String(refreshed.body.refresh_token), resource: `${MCP}/` });
    expect(again.status).toBe(200);
    expect(decodeJwt(String(again.body.access_token)).aud).toBe(MCP);

    // Narrowed at the resource since: a refresh gets only what it still lists.
    await updateResource(world.t.handle.db, MCP, { scopes: 'contacts.read' });
    try {
      afterRegistryReload();
      const narrowed = await token({ grant_type: 'refresh_token', refresh_token: String(again.body.refresh_token) });
      expect(narrowed.body.scope, JSON.stringify(narrowed.body)).toBe('contacts.read');
    } finally {
      await updateResource(world.t.handle.db, MCP, { scopes: 'contacts.read tools.call' });
      afterRegistryReload();
    }
  });

  it('a token request naming another resource than the authorization did is invalid_target, and the code stays unused', async () => {
    const { code, verifier } = await authorize({ resource: MCP, scope: 'tools.call' }, orgs.member);
    expect(await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier, resource: OTHER })).toMatchObject({ status: 400, body: { error: 'invalid_target' } });
    expect(await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier, resource: `${world.issuer}/api/v1` })).toMatchObject({
      status: 400,
      body: { error: 'invalid_target' },
    });
    const ok = await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier });
    expect(ok.status).toBe(200);
    expect(decodeJwt(String(ok.body.access_token)).aud).toBe(MCP);
  });

  it('an unknown resource at /oauth/authorize and at /oauth/token is invalid_target', async () => {
    const res = await fetch(authorizeUrl({ resource: 'https://unknown.example.com/mcp', scope: 'contacts.read', code_challenge: pkce().challenge, code_challenge_method: 'S256' }), { redirect: 'manual' });
    // Signed out: sent to sign in first (AZ-6); the error is given after sign-in.
    expect(res.status).toBe(303);
    const { page } = await signInFor(authorizeUrl({ resource: 'https://unknown.example.com/mcp', scope: 'contacts.read', code_challenge: pkce().challenge, code_challenge_method: 'S256' }), {
      issuer: world.issuer,
      email: user.email,
      password: PASSWORD,
    });
    expect(page.status).toBe(303);
    const back = new URL(page.headers.get('location')!);
    expect(back.searchParams.get('error')).toBe('invalid_target');
    expect(await token({ grant_type: 'refresh_token', refresh_token: 'x'.repeat(43), resource: 'https://unknown.example.com' })).toMatchObject({ status: 400, body: { error: 'invalid_target' } });
    expect(await token({ grant_type: 'refresh_token', refresh_token: 'x'.repeat(43), resource: 'https://mcp.example.com/mcp#frag' })).toMatchObject({ status: 400, body: { error: 'invalid_target' } });
  });

  it('without resource, behaviour is as before: orgauth’s API, its audience and the contract’s lifetime', async () => {
    const { code, verifier } = await authorize({ scope: 'contacts.read' }, orgs.member);
    const res = await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier });
    expect(res.status).toBe(200);
    expect(decodeJwt(String(res.body.access_token)).aud).toBe(`${world.issuer}/api/v1`);
    expect(res.body.expires_in).toBe(world.config.accessTokenTtl);
    const api = await fetch(`${world.issuer}/api/v1/${orgs.member}/contacts`, { headers: { authorization: `Bearer ${String(res.body.access_token)}` } });
    expect(api.status).toBe(200);
  });

  it('client_credentials with resource: aud the resource, its scopes only; the API refuses it', async () => {
    const priv = world.org.privateApp;
    const post = (fields: Record<string, string>) =>
      fetch(`${world.issuer}/oauth/token`, {
        method: 'POST',
        headers: { 'content-type': 'application/x-www-form-urlencoded', authorization: basic(priv.client_id, priv.client_secret) },
        body: form({ grant_type: 'client_credentials', organization_id: String(world.org.organizationId), ...fields }),
      });
    // Acting for itself, a private application gets a declared scope only when it is registered with it.
    expect((await (await post({ resource: OTHER })).json()) as object).toMatchObject({ error: 'invalid_scope' });
    await expect(updateApplication(world.t.handle.db, (await findApplicationByClientId(world.t.handle.db, priv.client_id)) as DeveloperApplication, { scopes: 'contacts.read made.up' })).rejects.toThrow(/unknown scope/);
    await updateApplication(world.t.handle.db, (await findApplicationByClientId(world.t.handle.db, priv.client_id)) as DeveloperApplication, { scopes: 'contacts.read files.read' });
    // Changed outside the server: its application cache learns by NOTIFY or after 500 ms at most.
    await expect.poll(async () => (await post({ resource: OTHER })).status, { timeout: 5000, interval: 20 }).toBe(200);
    const res = await post({ resource: OTHER });
    const body = (await res.json()) as Record<string, string>;
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(body.scope).toBe('files.read');
    expect(decodeJwt(body.access_token!).aud).toBe(OTHER);
    const api = await fetch(`${world.issuer}/api/v1/${world.org.organizationId}/contacts`, { headers: { authorization: `Bearer ${body.access_token}` } });
    expect(api.status).toBe(401);
    expect((await (await post({ resource: OTHER, scope: 'contacts.read' })).json()) as object).toMatchObject({ error: 'invalid_scope' });
    expect((await (await post({ resource: 'https://nope.example.com' })).json()) as object).toMatchObject({ error: 'invalid_target' });
    // Narrowed: its own grant holding the declared scope is revoked, as for any scope it loses.
    await updateApplication(world.t.handle.db, (await findApplicationByClientId(world.t.handle.db, priv.client_id)) as DeveloperApplication, { scopes: 'contacts.read' });
    await expect.poll(async () => (await post({ resource: OTHER })).json(), { timeout: 5000, interval: 20 }).toMatchObject({ error: 'invalid_scope' });
    await finishJobs(world.t.handle.db);
    const grant = await world.t.handle.db.selectFrom('grants').select(['revoked_reason']).where('scopes', '@>', sql<string[]>`array['files.read']`).executeTakeFirstOrThrow();
    expect(grant.revoked_reason).toBe('scopes_narrowed');
  });

  it('a grant to another organization’s application is listed among the connected apps of the organization it was granted in', async () => {
    const { code, verifier } = await authorize({ resource: MCP, scope: 'tools.call' }, orgs.member);
    expect((await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier })).status).toBe(200);
    const listed = await listLiveGrants(world.t.handle.db, orgs.member, { userId: user.id, beforeId: undefined, limit: 100 });
    expect(listed.map((g) => g.application_client_id)).toContain(app.client_id);
  });

  it('a declared scope is granted by owner and member roles, never by a viewer', async () => {
    const { verifier, challenge } = pkce();
    const { page } = await signInFor(authorizeUrl({ resource: MCP, scope: 'tools.call', code_challenge: challenge, code_challenge_method: 'S256', prompt: 'consent' }), { issuer: world.issuer, email: user.email, password: PASSWORD });
    const consent = await page.text();
    void verifier;
    const choosable = (id: number) => consent.includes(`name="organization_id" value="${id}" required`) && !consent.includes(`name="organization_id" value="${id}" required disabled`);
    expect(choosable(orgs.owned)).toBe(true);
    expect(choosable(orgs.member)).toBe(true);
    expect(choosable(orgs.viewer)).toBe(false);
  });

  it('demoting a member to viewer narrows their resource grant: the declared scope goes, the audience stays', async () => {
    const db = world.t.handle.db;
    const { code, verifier } = await authorize({ resource: MCP, scope: 'contacts.read tools.call' }, orgs.member);
    const res = await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier });
    expect(res.body.scope).toBe('contacts.read tools.call');
    await changeMemberRole(db, { organizationId: orgs.member, userId: user.id, role: 'viewer' });
    try {
      const refreshed = await token({ grant_type: 'refresh_token', refresh_token: String(res.body.refresh_token) });
      expect(refreshed.status, JSON.stringify(refreshed.body)).toBe(200);
      expect(refreshed.body.scope).toBe('contacts.read');
      expect(decodeJwt(String(refreshed.body.access_token)).aud).toBe(MCP);
    } finally {
      await changeMemberRole(db, { organizationId: orgs.member, userId: user.id, role: 'member' });
    }
  });

  it('an organization’s own role holds the declared scopes it lists: chosen for them, narrowed when one is taken away', async () => {
    const db = world.t.handle.db;
    await expect(createRole(db, orgs.viewer, { name: 'Bad', permissions: ['contacts.read', 'made.up'] })).rejects.toThrow(/unknown permission/);
    const agents = await createRole(db, orgs.viewer, { name: 'Agents', permissions: ['contacts.read', 'tools.call'] });
    expect(agents.permissions).toEqual(['contacts.read', 'tools.call']);
    await createRole(db, orgs.viewer, { name: 'Readers', permissions: ['contacts.read'] });
    const choosable = async () => {
      const { page } = await signInFor(authorizeUrl({ resource: MCP, scope: 'tools.call', code_challenge: pkce().challenge, code_challenge_method: 'S256', prompt: 'consent' }), {
        issuer: world.issuer,
        email: user.email,
        password: PASSWORD,
      });
      const html = await page.text();
      return html.includes(`value="${orgs.viewer}" required`) && !html.includes(`value="${orgs.viewer}" required disabled`);
    };
    try {
      await changeMemberRole(db, { organizationId: orgs.viewer, userId: user.id, role: (await findRole(db, orgs.viewer, 'Readers'))! });
      expect(await choosable()).toBe(false);
      await changeMemberRole(db, { organizationId: orgs.viewer, userId: user.id, role: (await findRole(db, orgs.viewer, 'Agents'))! });
      expect(await choosable()).toBe(true);
      const { code, verifier } = await authorize({ resource: MCP, scope: 'contacts.read tools.call' }, orgs.viewer);
      const res = await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier });
      expect(res.body.scope, JSON.stringify(res.body)).toBe('contacts.read tools.call');
      await updateRole(db, orgs.viewer, 'Agents', { permissions: ['contacts.read'] });
      const refreshed = await token({ grant_type: 'refresh_token', refresh_token: String(res.body.refresh_token) });
      expect(refreshed.body.scope, JSON.stringify(refreshed.body)).toBe('contacts.read');
      expect(decodeJwt(String(refreshed.body.access_token)).aud).toBe(MCP);
    } finally {
      await changeMemberRole(db, { organizationId: orgs.viewer, userId: user.id, role: 'viewer' });
    }
  });

  it('deleting a resource ends its grants: nothing is refreshed for it again', async () => {
    const db = world.t.handle.db;
    await createResource(db, world.config, { uri: 'https://temp.example.com/api', name: 'Temp', scopes: 'temp.use' });
    const { code, verifier } = await authorize({ resource: 'https://temp.example.com/api', scope: 'temp.use' }, orgs.owned);
    const res = await token({ grant_type: 'authorization_code', code, redirect_uri: REDIRECT, code_verifier: verifier });
    expect(res.status).toBe(200);
    await deleteResource(db, 'https://temp.example.com/api');
    expect(await token({ grant_type: 'refresh_token', refresh_token: String(res.body.refresh_token) })).toMatchObject({ status: 400, body: { error: 'invalid_grant' } });
  });

  it('refuses to register orgauth itself, a duplicate in another spelling, management scopes and bad names', async () => {
    const db = world.t.handle.db;
    await expect(createResource(db, world.config, { uri: `${world.issuer}/api/v1`, name: 'Me', scopes: 'contacts.read' })).rejects.toThrow(/orgauth itself/);
    await expect(createResource(db, world.config, { uri: 'HTTPS://mcp.example.com/mcp/', name: 'Again', scopes: 'x.y' })).rejects.toThrow(/exists/);
    await expect(createResource(db, world.config, { uri: 'https://m.example.com', name: 'M', scopes: 'members.write' })).rejects.toThrow(/administers orgauth/);
    await expect(createResource(db, world.config, { uri: 'https://m.example.com', name: 'M', scopes: 'bad"scope' })).rejects.toThrow(/not a scope name/);
    await expect(createResource(db, world.config, { uri: 'https://m.example.com#f', name: 'M', scopes: 'a.b' })).rejects.toThrow(/fragment/);
  });
});
