/**
 * Setup links (issue 43; docs/directory.md "Setup link"): an owner makes a link on the dashboard;
 * through it a person who is not a member of the organization — signed in with their own account
 * — verifies a domain (a real DNS server on loopback, test/helpers/dns-server.ts), creates SSO
 * connections and a SCIM directory, and can do nothing else there: not the dashboard, not the
 * API, not another organization, not a feature the link lacks, not after the link expired or was
 * revoked or its creator stopped being an owner. Everything done through it is audited with the
 * link; the link's token is stored only hashed and never logged.
 */
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, changeMemberRole, createOrganization } from '../../src/accounts/organizations.js';
import { createUser } from '../../src/accounts/users.js';
import type { DB } from '../../src/db/connect.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { maskUrl } from '../../src/logger.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { createConnection } from '../../src/sso/connections.js';
import { addDomain } from '../../src/sso/domains.js';
import { Browser, csrfTokenIn, expectPageSecurityHeaders } from '../accounts/browser.js';
import { buildTestApp, logCapture, testConfig, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { startDnsServer, type TestDnsServer } from '../helpers/dns-server.js';
import { idpKeyPair } from '../helpers/saml-idp.js';
import { PASSWORD, submit } from './fixture.js';

const issuer = testConfig().issuer;
let db: DB;
let app: Awaited<ReturnType<typeof buildTestApp>>;
let dns: TestDnsServer;
let closeDb: () => Promise<void>;
const logs = logCapture();
/** Every link token made here: none may reach a log line. */
const tokens: string[] = [];

type Person = { id: number; email: string; browser: Browser };
/** owner and coOwner own each test's organization, admin is an admin there; itAdmin is the customer's IT admin, a member of none of them (only of their own). */
let people: Record<'owner' | 'coOwner' | 'admin' | 'itAdmin', Person>;
let ip = 0;

beforeAll(async () => {
  dns = await startDnsServer();
  const t = await createTestDatabase();
  closeDb = t.close;
  db = t.handle.db;
  await ensureSigningKey(db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  app = await buildTestApp(db, { env: { DNS_SERVERS: dns.address }, logStream: logs.stream });
  const person = async (name: string): Promise<Person> => {
    const user = await createUser(db, { email: `setup-${name}-${process.pid}@example.com`, password: PASSWORD, name });
    const browser = new Browser(app, `10.22.0.${++ip}`);
    expect((await browser.login(user.email, PASSWORD)).statusCode).toBe(303);
    return { id: user.id, email: user.email, browser };
  };
  people = { owner: await person('owner'), coOwner: await person('co-owner'), admin: await person('admin'), itAdmin: await person('it-admin') };
  await createOrganization(db, { name: 'IT Admin’s Own Org', ownerUserId: people.itAdmin.id });
});
afterAll(async () => {
  await app?.close();
  await closeDb?.();
  await dns?.close();
});

let orgCount = 0;

/** A new organization of the owner (current in their browser), with the co-owner and the admin. */
async function newOrganization() {
  const org = await createOrganization(db, { name: `Customer ${++orgCount}`, ownerUserId: people.owner.id });
  await addMember(db, { organizationId: org.id, userId: people.coOwner.id, role: 'owner' });
  await addMember(db, { organizationId: org.id, userId: people.admin.id, role: 'admin' });
  for (const who of ['owner', 'coOwner', 'admin'] as const) expect((await submit(people[who].browser, '/dashboard/organization', { organization_id: String(org.id) })).statusCode).toBe(303);
  return org;
}

const FEATURES = ['domains', 'sso', 'directory'] as const;

/** Makes a link on the dashboard as `by` (an owner); returns its id, its token and its path. */
async function makeLink(features: readonly (typeof FEATURES)[number][] = FEATURES, by: Person = people.owner) {
  const res = await submit(by.browser, '/dashboard/setup-links', { ...Object.fromEntries(features.map((f) => [`feature_${f}`, 'on'])), expires_days: '7' });
  expect(res.statusCode, res.body).toBe(201);
  const url = /id="setup-link" name="setup_link" value="([^"]+)"/.exec(res.body)?.[1] ?? '';
  expect(url).toMatch(new RegExp(`^${issuer}/setup/[A-Za-z0-9_-]{43}$`));
  const token = url.slice(`${issuer}/setup/`.length);
  tokens.push(token);
  const row = await db.selectFrom('setup_links').select('id').where('token_hash', '=', sha256Hex(token)).executeTakeFirstOrThrow();
  return { id: row.id, token, path: `/setup/${token}` };
}

/** Posts a form of a setup page with the browser's CSRF token, read from `page` (the link's page the form is on). */
async function post(b: Browser, page: string, url: string, fields: Record<string, string> = {}): Promise<LightMyRequestResponse> {
  const res = await b.get(page);
  expect(res.statusCode, res.body.slice(0, 300)).toBe(200);
  return b.post(url, { csrf_token: csrfTokenIn(res.body), ...fields });
}

/** Follows a 303 within the link's pages and returns the page. */
async function follow(b: Browser, res: LightMyRequestResponse, link: { path: string }): Promise<LightMyRequestResponse> {
  expect(res.statusCode, res.body.slice(0, 500)).toBe(303);
  const location = String(res.headers.location);
  expect(location.startsWith(`${link.path}/`)).toBe(true);
  return b.get(location.split('#')[0]!);
}

const alertIn = (html: string) => /<div class="error" role="alert"><ul>([\s\S]*?)<\/ul>/.exec(html)?.[1] ?? '';

const auditOf = (organizationId: number) =>
  db.selectFrom('audit_events').select(['action', 'actor_user_id', 'details']).where('organization_id', '=', organizationId).orderBy('id').execute();

function oidcFields(overrides: Record<string, string> = {}) {
  return { protocol: 'oidc', name: 'Customer Okta', issuer: 'https://customer.okta.example', client_id: 'orgauth-client', client_secret: 'upstream-secret-value', oidc_scopes: 'openid email profile', jit: 'on', ...overrides };
}

describe(`setup links on the dashboard on ${BACKEND}`, () => {
  it('an owner makes a link: its URL is shown once, only its hash is kept, and it is listed without it', async () => {
    const org = await newOrganization();
    const page = await people.owner.browser.get('/dashboard/setup-links');
    expect(page.statusCode).toBe(200);
    expectPageSecurityHeaders(page);
    expect((await people.owner.browser.get('/dashboard/sso')).body).toContain('href="/dashboard/setup-links"');

    const link = await makeLink(['sso', 'directory']);
    const row = await db.selectFrom('setup_links').selectAll().where('id', '=', link.id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({ organization_id: org.id, features: ['sso', 'directory'], token_hash: sha256Hex(link.token), created_by_user_id: people.owner.id, revoked_at: null, last_used_at: null });
    expect(row.expires_at.getTime() - row.created_at.getTime()).toBe(7 * 86_400_000);
    // The token is nowhere in the row, and the list no longer shows it.
    expect(JSON.stringify(row)).not.toContain(link.token);
    const list = await people.owner.browser.get('/dashboard/setup-links');
    expect(list.body).not.toContain(link.token);
    expect(list.body).toContain(`<tr id="setup-link-${link.id}">`);
    expect(list.body).toContain('single sign-on, directory sync (SCIM)');
    expect(list.body).toContain(people.owner.email);
    expect(await auditOf(org.id)).toContainEqual({ action: 'setup_link.created', actor_user_id: people.owner.id, details: { setup_link_id: link.id, features: ['sso', 'directory'], expires_at: row.expires_at.toISOString() } });
  });

  it('only owners make, see and revoke links; a link needs a feature and a lifetime the form offers', async () => {
    await newOrganization();
    const link = await makeLink(['domains']);
    expect((await people.admin.browser.get('/dashboard/setup-links')).statusCode).toBe(403);
    expect((await submit(people.admin.browser, '/dashboard/setup-links', { feature_sso: 'on', expires_days: '7' })).statusCode).toBe(403);
    expect((await submit(people.admin.browser, `/dashboard/setup-links/${link.id}/revoke`)).statusCode).toBe(403);
    expect((await people.owner.browser.post('/dashboard/setup-links', { feature_sso: 'on', expires_days: '7' })).statusCode).toBe(403);
    const none = await submit(people.owner.browser, '/dashboard/setup-links', { expires_days: '7' });
    expect(none.statusCode).toBe(400);
    expect(alertIn(none.body)).toContain('choose at least one of domains, sso, directory');
    expect((await submit(people.owner.browser, '/dashboard/setup-links', { feature_sso: 'on', expires_days: '31' })).statusCode).toBe(400);
    expect(await db.selectFrom('setup_links').select('id').where('created_by_user_id', '=', people.admin.id).execute()).toEqual([]);
  });
});

describe(`through a setup link on ${BACKEND}`, () => {
  it('signed out, the link goes to sign in (or sign up) and comes back to the link', async () => {
    await newOrganization();
    const link = await makeLink(['domains']);
    const stranger = new Browser(app, '10.22.1.1');
    const res = await stranger.get(link.path);
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe(`/login?return_to=${encodeURIComponent(link.path)}`);
    const login = await stranger.get(String(res.headers.location));
    expect(login.body).toContain(`href="/signup?return_to=${encodeURIComponent(link.path)}"`);
    // A form posted signed out is refused.
    expect((await stranger.post(`${link.path}/domains`, { domain: 'x.example' })).statusCode).toBe(403);
    const signedIn = await stranger.login(people.itAdmin.email, PASSWORD, link.path);
    expect(signedIn.headers.location).toBe(link.path);
    const start = await stranger.get(link.path);
    expect(start.headers.location).toBe(`${link.path}/domains`);
    const page = await stranger.get(`${link.path}/domains`);
    expect(page.statusCode).toBe(200);
    expectPageSecurityHeaders(page);
  });

  it('a non-member verifies a domain, creates SSO connections and a directory; every change is audited with the link', async () => {
    const org = await newOrganization();
    const link = await makeLink();
    const b = people.itAdmin.browser;
    const base = link.path;

    // Domains: add, see the TXT record, verify through DNS.
    const domain = `setup-${org.id}.example`;
    const domainsPage = await b.get(`${base}/domains`);
    expect(domainsPage.body).toContain(`Setting up <strong>${org.name}</strong>`);
    let page = await follow(b, await post(b, `${base}/domains`, `${base}/domains`, { domain }), link);
    const pending = await db.selectFrom('sso_domains').selectAll().where('organization_id', '=', org.id).where('domain', '=', domain).executeTakeFirstOrThrow();
    expect(page.body).toContain(`was added. Publish its TXT record`);
    expect(page.body).toContain(`_orgauth-challenge.${domain}`);
    expect(page.body).toContain(pending.verification_token);
    // No "SSO required" here: the link does not give it.
    expect(page.body).not.toContain('/sso-required');
    dns.setTxt(`_orgauth-challenge.${domain}`, [pending.verification_token]);
    page = await follow(b, await post(b, `${base}/domains`, `${base}/domains/${domain}/verify`), link);
    expect(page.body).toContain(`${domain} is verified.`);
    expect(dns.queries()).toContain(`_orgauth-challenge.${domain}`);
    expect((await db.selectFrom('sso_domains').select('state').where('id', '=', pending.id).executeTakeFirstOrThrow()).state).toBe('verified');

    // SSO: an OpenID Connect connection (a default role sent anyway is not the link's to choose), then edited.
    const created = await post(b, `${base}/sso`, `${base}/sso/connections`, oidcFields({ default_role: 'admin' }));
    const oidc = await db.selectFrom('sso_connections').selectAll().where('organization_id', '=', org.id).executeTakeFirstOrThrow();
    expect(created.headers.location).toBe(`${base}/sso?created=${oidc.id}#connection-${oidc.id}`);
    page = await follow(b, created, link);
    expect(page.body).toContain('Register these at your identity provider');
    expect(page.body).toContain(`${issuer}/sso/${oidc.id}/oidc/callback`);
    expect(page.body).not.toContain('name="default_role"');
    expect(page.body).not.toContain('/delete"');
    expect(oidc).toMatchObject({ protocol: 'oidc', name: 'Customer Okta', state: 'active', default_role: 'member', oidc_issuer: 'https://customer.okta.example', links_existing_accounts: false });
    page = await follow(b, await post(b, `${base}/sso`, `${base}/sso/connections/${oidc.id}`, { name: 'Customer Okta (prod)', jit: 'on', issuer: 'https://customer.okta.example', client_id: 'orgauth-client-2', oidc_scopes: 'openid email' }), link);
    expect(page.body).toContain('Connection Customer Okta (prod) saved.');
    expect(await db.selectFrom('sso_connections').select(['name', 'oidc_client_id']).where('id', '=', oidc.id).executeTakeFirstOrThrow()).toEqual({ name: 'Customer Okta (prod)', oidc_client_id: 'orgauth-client-2' });
    // A SAML connection as a draft, its ACS URL shown, then activated. The dashboard's validation: a bad URL is shown, with what was typed.
    const bad = await post(b, `${base}/sso`, `${base}/sso/connections`, { protocol: 'saml', name: 'Entra', idp_entity_id: 'https://sts.entra.example/', idp_sso_url: 'not a url', idp_certificates: idpKeyPair().certificatePem, jit: 'on', state: 'draft' });
    expect(bad.statusCode).toBe(400);
    expect(alertIn(bad.body)).toMatch(/SSO URL: must be an https?\(?s?\)? URL/);
    expect(bad.body).toContain('value="https://sts.entra.example/"');
    const saml = await follow(b, await post(b, `${base}/sso`, `${base}/sso/connections`, { protocol: 'saml', name: 'Entra', idp_entity_id: 'https://sts.entra.example/', idp_sso_url: 'https://login.entra.example/saml2', idp_certificates: idpKeyPair().certificatePem, jit: 'on', state: 'draft' }), link);
    const samlRow = await db.selectFrom('sso_connections').select(['id', 'state', 'links_existing_accounts']).where('organization_id', '=', org.id).where('protocol', '=', 'saml').executeTakeFirstOrThrow();
    expect(saml.body).toContain(`${issuer}/sso/${samlRow.id}/saml/acs`);
    expect(samlRow).toMatchObject({ state: 'draft', links_existing_accounts: false });
    await follow(b, await post(b, `${base}/sso`, `${base}/sso/connections/${samlRow.id}/state`, { state: 'active' }), link);
    expect((await db.selectFrom('sso_connections').select('state').where('id', '=', samlRow.id).executeTakeFirstOrThrow()).state).toBe('active');

    // Directory: made, its base URL and token shown once; listed without it; a new token replaces it.
    const made = await post(b, `${base}/directory`, `${base}/directory/directories`, { name: 'Okta' });
    expect(made.statusCode).toBe(201);
    const directory = await db.selectFrom('directories').select(['id', 'token_hash', 'default_role']).where('organization_id', '=', org.id).executeTakeFirstOrThrow();
    const token = /id="scim-token" name="scim_token" value="(scim_[A-Za-z0-9_-]+)"/.exec(made.body)?.[1] ?? '';
    expect(sha256Hex(token)).toBe(directory.token_hash);
    expect(made.body).toContain(`<code class="copy" id="scim-base-url">${issuer}/scim/v2/${directory.id}</code>`);
    expect(directory.default_role).toBe('member');
    const listed = await b.get(`${base}/directory`);
    expect(listed.body).toContain(`${issuer}/scim/v2/${directory.id}`);
    expect(listed.body).not.toContain(token);
    const rotated = await post(b, `${base}/directory`, `${base}/directory/directories/${directory.id}/rotate-token`);
    expect(rotated.statusCode).toBe(200);
    const newToken = /id="scim-token" name="scim_token" value="(scim_[A-Za-z0-9_-]+)"/.exec(rotated.body)?.[1] ?? '';
    expect(newToken).not.toBe(token);
    expect((await db.selectFrom('directories').select('token_hash').where('id', '=', directory.id).executeTakeFirstOrThrow()).token_hash).toBe(sha256Hex(newToken));

    // Removing the domain asks first, then does it.
    const confirm = await post(b, `${base}/domains`, `${base}/domains/${domain}/delete`);
    expect(confirm.statusCode).toBe(200);
    expect(confirm.body).toContain(`Remove the domain ${domain}?`);
    expect(confirm.body).toContain(`href="${base}/domains#domain-${pending.id}"`);
    page = await follow(b, await b.post(`${base}/domains/${domain}/delete`, { csrf_token: csrfTokenIn(confirm.body), confirm: 'delete' }), link);
    expect(page.body).toContain(`Removed the domain ${domain}.`);

    // Not a member, and every change of the IT admin's is audited with the link.
    expect(await db.selectFrom('memberships').select('role').where('organization_id', '=', org.id).where('user_id', '=', people.itAdmin.id).execute()).toEqual([]);
    const byItAdmin = (await auditOf(org.id)).filter((e) => e.actor_user_id === people.itAdmin.id);
    expect(byItAdmin.map((e) => e.action)).toEqual([
      'setup_link.opened',
      'domain.added',
      'domain.verified',
      'sso_connection.created',
      'sso_connection.updated',
      'sso_connection.created',
      'sso_connection.updated',
      'directory.created',
      'directory.token_rotated',
      'domain.deleted',
    ]);
    for (const event of byItAdmin) expect(event.details).toMatchObject({ setup_link_id: link.id });
    expect((await db.selectFrom('setup_links').select('last_used_at').where('id', '=', link.id).executeTakeFirstOrThrow()).last_used_at).not.toBeNull();
    // The owner's list says it was used.
    expect((await people.owner.browser.get('/dashboard/setup-links')).body).not.toMatch(new RegExp(`<tr id="setup-link-${link.id}">[\\s\\S]*?never</td>`));
  });

  it('opens nothing else: not the dashboard of the organization, not its API, not another organization', async () => {
    const org = await newOrganization();
    const link = await makeLink();
    const b = people.itAdmin.browser;
    expect((await b.get(`${link.path}/domains`)).statusCode).toBe(200);
    // The dashboard: the organization cannot be chosen, and its pages show the IT admin's own organization.
    const chosen = await submit(b, '/dashboard/organization', { organization_id: String(org.id) });
    expect(chosen.statusCode).toBe(403);
    await createConnection(db, { issuer, secretKey: TEST_SECRET_KEY, allowHttp: true }, org.id, { protocol: 'oidc', name: 'Owners Only IdP', issuer: 'https://owners.example', client_id: 'c', client_secret: 's' });
    const sso = await b.get('/dashboard/sso');
    expect(sso.body).not.toContain(org.name);
    expect(sso.body).not.toContain('Owners Only IdP');
    expect((await b.get('/dashboard/setup-links')).statusCode).toBe(200);
    expect((await b.get('/dashboard/setup-links')).body).not.toContain(`setup-link-${link.id}`);
    // The API: a session is no bearer token, and nothing made the IT admin one for this organization.
    for (const path of ['domains', 'sso-connections', 'directories', 'contacts']) {
      expect((await b.get(`/api/v1/${org.id}/${path}`)).statusCode).toBe(401);
    }
    // Another organization's connection and domain, through this organization's link: not found.
    const other = await createOrganization(db, { name: 'Someone Else', ownerUserId: people.admin.id });
    const foreign = await createConnection(db, { issuer, secretKey: TEST_SECRET_KEY, allowHttp: true }, other.id, { protocol: 'oidc', name: 'Foreign', issuer: 'https://foreign.example', client_id: 'c', client_secret: 's' });
    await addDomain(db, other.id, { domain: `foreign-${other.id}.example` });
    const edit = await post(b, `${link.path}/sso`, `${link.path}/sso/connections/${foreign.id}`, { name: 'Taken over', issuer: 'https://evil.example', client_id: 'x' });
    expect(edit.statusCode).toBe(404);
    const state = await post(b, `${link.path}/sso`, `${link.path}/sso/connections/${foreign.id}/state`, { state: 'disabled' });
    expect(state.statusCode).toBe(404);
    expect((await post(b, `${link.path}/domains`, `${link.path}/domains/foreign-${other.id}.example/verify`)).statusCode).toBe(404);
    expect((await post(b, `${link.path}/domains`, `${link.path}/domains/foreign-${other.id}.example/delete`, { confirm: 'delete' })).statusCode).toBe(404);
    expect(await db.selectFrom('sso_connections').select(['name', 'state']).where('id', '=', foreign.id).executeTakeFirstOrThrow()).toEqual({ name: 'Foreign', state: 'active' });
    expect(await db.selectFrom('sso_domains').select('id').where('organization_id', '=', other.id).execute()).toHaveLength(1);
    // A form without the session's CSRF token.
    expect((await b.post(`${link.path}/domains`, { domain: `csrf-${org.id}.example` })).statusCode).toBe(403);
    expect(await db.selectFrom('sso_domains').select('id').where('organization_id', '=', org.id).execute()).toEqual([]);
  });

  it('a link for domains only refuses the SSO and directory pages and forms', async () => {
    const org = await newOrganization();
    const link = await makeLink(['domains']);
    const b = people.itAdmin.browser;
    const page = await b.get(`${link.path}/domains`);
    expect(page.statusCode).toBe(200);
    expect(page.body).not.toContain(`href="${link.path}/sso"`);
    const csrf = csrfTokenIn(page.body);
    for (const path of ['sso', 'directory']) {
      const refused = await b.get(`${link.path}/${path}`);
      expect(refused.statusCode).toBe(403);
      expect(refused.body).toContain('This setup link does not include');
    }
    expect((await b.post(`${link.path}/sso/connections`, { csrf_token: csrf, ...oidcFields() })).statusCode).toBe(403);
    expect((await b.post(`${link.path}/directory/directories`, { csrf_token: csrf, name: 'Okta' })).statusCode).toBe(403);
    expect(await db.selectFrom('sso_connections').select('id').where('organization_id', '=', org.id).execute()).toEqual([]);
    expect(await db.selectFrom('directories').select('id').where('organization_id', '=', org.id).execute()).toEqual([]);
  });

  it('an expired link and a revoked link are refused on the next request', async () => {
    const org = await newOrganization();
    const b = people.itAdmin.browser;
    const expiring = await makeLink(['domains']);
    const csrf = csrfTokenIn((await b.get(`${expiring.path}/domains`)).body);
    await db.updateTable('setup_links').set({ created_at: new Date(Date.now() - 2 * 86_400_000), expires_at: new Date(Date.now() - 1000) }).where('id', '=', expiring.id).execute();
    const expired = await b.get(`${expiring.path}/domains`);
    expect(expired.statusCode).toBe(404);
    expect(expired.body).toContain('This setup link does not work: it has expired or was revoked.');
    expect((await b.post(`${expiring.path}/domains`, { csrf_token: csrf, domain: `late-${org.id}.example` })).statusCode).toBe(404);

    const revoking = await makeLink(['domains']);
    expect((await b.get(`${revoking.path}/domains`)).statusCode).toBe(200);
    const revoked = await submit(people.owner.browser, `/dashboard/setup-links/${revoking.id}/revoke`);
    expect(revoked.statusCode).toBe(303);
    expect((await people.owner.browser.get('/dashboard/setup-links')).body).toContain(`Setup link ${revoking.id} is revoked`);
    expect((await b.get(`${revoking.path}/domains`)).statusCode).toBe(404);
    expect((await b.post(`${revoking.path}/domains`, { csrf_token: csrf, domain: `late-${org.id}.example` })).statusCode).toBe(404);
    // Revoked once; neither is listed any more.
    expect((await submit(people.owner.browser, `/dashboard/setup-links/${revoking.id}/revoke`)).statusCode).toBe(404);
    const list = (await people.owner.browser.get('/dashboard/setup-links')).body;
    expect(list).not.toContain(`setup-link-${revoking.id}"`);
    expect(list).not.toContain(`setup-link-${expiring.id}"`);
    expect(await db.selectFrom('sso_domains').select('id').where('organization_id', '=', org.id).execute()).toEqual([]);
    expect(await auditOf(org.id)).toContainEqual({ action: 'setup_link.revoked', actor_user_id: people.owner.id, details: { setup_link_id: revoking.id, features: ['domains'] } });
  });

  it('a link stops when its creator is no longer an owner', async () => {
    const org = await newOrganization();
    const link = await makeLink(['domains'], people.coOwner);
    expect((await people.itAdmin.browser.get(`${link.path}/domains`)).statusCode).toBe(200);
    await changeMemberRole(db, { organizationId: org.id, userId: people.coOwner.id, role: 'admin' });
    expect((await people.itAdmin.browser.get(`${link.path}/domains`)).statusCode).toBe(404);
  });

  it('the organization’s two-step requirement holds for the link’s holder too', async () => {
    const org = await newOrganization();
    const link = await makeLink(['domains']);
    await db.updateTable('organizations').set({ require_mfa: true }).where('id', '=', org.id).execute();
    const res = await people.itAdmin.browser.get(`${link.path}/domains`);
    expect(res.statusCode).toBe(303);
    expect(res.headers.location).toBe(`/dashboard/account?${new URLSearchParams({ return_to: `${link.path}/domains` }).toString()}`);
    const csrf = csrfTokenIn((await people.itAdmin.browser.get('/dashboard')).body);
    expect((await people.itAdmin.browser.post(`${link.path}/domains`, { csrf_token: csrf, domain: `mfa-${org.id}.example` })).statusCode).toBe(403);
  });

  it('the token in a link’s path never reaches the logs', async () => {
    expect(maskUrl('/setup/abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ/domains?x=1')).toBe('/setup/[redacted]/domains?x=1');
    expect(maskUrl(`/login?return_to=${encodeURIComponent('/setup/abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQ')}`)).toBe(`/login?return_to=${encodeURIComponent('/setup/[redacted]')}`);
    expect(tokens.length).toBeGreaterThan(5);
    const lines = logs.lines().join('\n');
    expect(lines).toContain('/setup/[redacted]');
    for (const token of tokens) expect(lines).not.toContain(token);
  });
});
