/**
 * The dashboard's Single sign-on page (/dashboard/sso): connections (OpenID Connect and SAML)
 * and domains through the forms, as an owner; read-only for a role with sso.read alone; refused
 * to roles without it, without the CSRF token, and for another organization's connection or
 * domain. Domain verification asks a real DNS server on loopback (test/helpers/dns-server.ts).
 */
import { execFileSync } from 'node:child_process';
import { X509Certificate } from 'node:crypto';
import { devNull } from 'node:os';
import type { LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { addMember, createOrganization } from '../../src/accounts/organizations.js';
import { createRole } from '../../src/accounts/roles.js';
import { createSession } from '../../src/accounts/sessions.js';
import { createUser } from '../../src/accounts/users.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { sha256Hex } from '../../src/lib/crypto.js';
import { createConnection } from '../../src/sso/connections.js';
import { addDomain } from '../../src/sso/domains.js';
import { Browser, expectPageSecurityHeaders } from '../accounts/browser.js';
import { buildTestApp, testConfig, TEST_SECRET_KEY } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { startDnsServer, type TestDnsServer } from '../helpers/dns-server.js';
import { newOrganization, PASSWORD, type RoleName, selectOrganization, submit, type World } from './fixture.js';

/** The fixture's world (owner, admin, member, outsider), built with DNS_SERVERS, plus a viewer and a user to give a custom role. */
type Extra = 'viewer' | 'auditor';
let w: World & { extra: Record<Extra, { id: number; email: string; browser: Browser }> };
let dns: TestDnsServer;
let closeDb: () => Promise<void>;
const issuer = testConfig().issuer;

beforeAll(async () => {
  dns = await startDnsServer();
  const t = await createTestDatabase();
  closeDb = t.close;
  const db = t.handle.db;
  await ensureSigningKey(db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  const app = await buildTestApp(db, { env: { DNS_SERVERS: dns.address } });
  let ip = 0;
  const signUp = async (name: string) => {
    const user = await createUser(db, { email: `sso-${name}-${process.pid}@example.com`, password: PASSWORD, name });
    const browser = new Browser(app, `10.21.0.${++ip}`);
    expect((await browser.login(user.email, PASSWORD)).statusCode).toBe(303);
    return { id: user.id, email: user.email, browser };
  };
  const roles = ['owner', 'admin', 'member', 'outsider'] as const;
  const made = Object.fromEntries(await Promise.all(roles.map(async (r) => [r, await signUp(r)] as const))) as Record<RoleName, Awaited<ReturnType<typeof signUp>>>;
  await createOrganization(db, { name: 'Outsider Org', ownerUserId: made.outsider.id });
  w = {
    db,
    app,
    users: Object.fromEntries(roles.map((r) => [r, { id: made[r].id, email: made[r].email }])) as World['users'],
    browsers: Object.fromEntries(roles.map((r) => [r, made[r].browser])) as World['browsers'],
    extra: { viewer: await signUp('viewer'), auditor: await signUp('auditor') },
    close: async () => {},
  };
});
afterAll(async () => {
  await w?.app.close();
  await closeDb?.();
  await dns?.close();
});

/** A new organization (the fixture's), with the viewer as a viewer and the auditor holding a custom role with sso.read alone. */
async function newSsoOrganization() {
  const org = await newOrganization(w);
  await addMember(w.db, { organizationId: org.id, userId: w.extra.viewer.id, role: 'viewer' });
  const auditor = await createRole(w.db, org.id, { name: 'SSO auditor', permissions: ['sso.read'] });
  await addMember(w.db, { organizationId: org.id, userId: w.extra.auditor.id, role: auditor });
  for (const who of ['viewer', 'auditor'] as const) expect((await selectOrganization(w.extra[who].browser, org.id)).statusCode).toBe(303);
  return org;
}

const owner = () => w.browsers.owner;
const settings = { issuer, secretKey: TEST_SECRET_KEY, allowHttp: true };

function oidcFields(overrides: Record<string, string> = {}) {
  return {
    protocol: 'oidc',
    name: 'Acme Okta',
    issuer: 'https://acme.okta.example',
    client_id: 'orgauth-client',
    client_secret: 'upstream-secret-value',
    oidc_scopes: 'openid email profile',
    jit: 'on',
    default_role: 'member',
    ...overrides,
  };
}

/**
 * The IdP's signing certificate, self-signed by openssl (the page only reads it: subject,
 * fingerprint, expiry). Made once, on first use.
 */
let idpCertificate: string | undefined;
function idpCertificatePem(): string {
  idpCertificate ??= execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=idp.acme.example', '-days', '2', '-keyout', devNull], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  return idpCertificate;
}
const certificateBody = (pem: string) => pem.replace(/-----(BEGIN|END) CERTIFICATE-----|\s/g, '');

/** A minimal IdP metadata document: one EntityDescriptor, its signing certificate and an HTTP-Redirect SSO endpoint. */
function idpMetadata(entityId = 'https://idp.acme.example/saml', ssoUrl = 'https://idp.acme.example/saml/sso'): string {
  return `<?xml version="1.0" encoding="UTF-8"?>
<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata" xmlns:ds="http://www.w3.org/2000/09/xmldsig#" entityID="${entityId}">
  <md:IDPSSODescriptor protocolSupportEnumeration="urn:oasis:names:tc:SAML:2.0:protocol" WantAuthnRequestsSigned="false">
    <md:KeyDescriptor use="signing"><ds:KeyInfo><ds:X509Data><ds:X509Certificate>${certificateBody(idpCertificatePem())}</ds:X509Certificate></ds:X509Data></ds:KeyInfo></md:KeyDescriptor>
    <md:NameIDFormat>urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress</md:NameIDFormat>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST" Location="${ssoUrl}/post"/>
    <md:SingleSignOnService Binding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect" Location="${ssoUrl}"/>
  </md:IDPSSODescriptor>
</md:EntityDescriptor>`;
}

/** Follows a 303 back to the page, in the same browser. */
async function follow(b: Browser, res: LightMyRequestResponse): Promise<LightMyRequestResponse> {
  expect(res.statusCode).toBe(303);
  const location = String(res.headers.location);
  expect(location.startsWith('/dashboard/sso')).toBe(true);
  return b.get(location.split('#')[0]!);
}

const connectionsOf = (organizationId: number) =>
  w.db.selectFrom('sso_connections').selectAll().where('organization_id', '=', organizationId).orderBy('id').execute();
const domainRow = (organizationId: number, domain: string) =>
  w.db.selectFrom('sso_domains').selectAll().where('organization_id', '=', organizationId).where('domain', '=', domain).executeTakeFirst();
const alertIn = (html: string) => /<div class="error" role="alert"><ul>([\s\S]*?)<\/ul>/.exec(html)?.[1] ?? '';

describe(`dashboard single sign-on: connections on ${BACKEND}`, () => {
  it('shows the page in the navigation of those with sso.read, with the page security headers and no inline script', async () => {
    await newSsoOrganization();
    const page = await owner().get('/dashboard/sso');
    expect(page.statusCode).toBe(200);
    expectPageSecurityHeaders(page);
    expect(page.body).toContain('<a href="/dashboard/sso" aria-current="page">Single sign-on</a>');
    expect(page.body).toContain('<h2 id="add-connection">Add a connection</h2>');
    expect(page.body).not.toMatch(/<script(?![^>]*\bsrc=)/);
    // Everyone without sso.read: no link to it.
    expect((await w.browsers.member.get('/dashboard')).body).not.toContain('href="/dashboard/sso"');
    expect((await w.extra.viewer.browser.get('/dashboard')).body).not.toContain('href="/dashboard/sso"');
    expect((await w.extra.auditor.browser.get('/dashboard')).body).toContain('href="/dashboard/sso"');
  });

  it('creates an OpenID Connect connection from the form and shows the redirect URI to register', async () => {
    const org = await newSsoOrganization();
    const res = await submit(owner(), '/dashboard/sso/connections', oidcFields());
    const [row] = await connectionsOf(org.id);
    expect(row).toMatchObject({ protocol: 'oidc', name: 'Acme Okta', state: 'active', jit: true, default_role: 'member', oidc_issuer: 'https://acme.okta.example', oidc_client_id: 'orgauth-client' });
    expect(res.headers.location).toBe(`/dashboard/sso?created=${row!.id}#connection-${row!.id}`);
    const page = await follow(owner(), res);
    expect(page.statusCode).toBe(200);
    const redirectUri = `${issuer}/sso/${row!.id}/oidc/callback`;
    // Prominently, once: the box to register at the provider; and in the connection's details.
    expect(page.body).toContain('<h2 id="register-urls">Register these at your identity provider</h2>');
    expect(page.body).toMatch(new RegExp(`<section class="secret"[\\s\\S]*${redirectUri}[\\s\\S]*</section>`));
    expect(page.body).toContain(`<code class="copy">${redirectUri}</code>`);
    expect(page.body).toContain('role="status">Connection Acme Okta created.');
    expect(page.body).not.toContain('upstream-secret-value');
    // Shown once: a reload of the same address has no notice.
    expect((await owner().get(String(res.headers.location).split('#')[0]!)).body).not.toContain('role="status"');
    // Without ?created= (the page later): the details still show it, the box does not.
    const later = await owner().get('/dashboard/sso');
    expect(later.body).toContain(redirectUri);
    expect(later.body).not.toContain('register-urls');
    const event = await w.db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', org.id).where('action', '=', 'sso_connection.created').executeTakeFirstOrThrow();
    expect(event.actor_user_id).toBe(w.users.owner.id);
  });

  it('shows what the domain layer refuses on the page, with what was typed, and never the secret', async () => {
    const org = await newSsoOrganization();
    const res = await submit(owner(), '/dashboard/sso/connections', oidcFields({ issuer: 'ftp://acme.example', oidc_scopes: 'email', name: 'Typed name' }));
    expect(res.statusCode).toBe(400);
    const alert = alertIn(res.body);
    expect(alert).toContain('Issuer URL: must be an http(s) URL');
    expect(alert).toContain('Scopes: must include openid');
    expect(res.body).toContain('value="Typed name"');
    expect(res.body).toContain('value="ftp://acme.example"');
    expect(res.body).not.toContain('upstream-secret-value');
    // An owner is not a role a connection gives (the select does not offer it either).
    const ownerRole = await submit(owner(), '/dashboard/sso/connections', oidcFields({ default_role: 'owner' }));
    expect(ownerRole.statusCode).toBe(400);
    expect(alertIn(ownerRole.body)).toContain('Default role: a connection cannot make owners');
    expect(ownerRole.body).not.toContain('<option value="owner"');
    expect(await connectionsOf(org.id)).toHaveLength(0);
    // No protocol: refused (the error page).
    expect((await submit(owner(), '/dashboard/sso/connections', { name: 'x' })).statusCode).toBe(400);
  });

  it('creates a SAML connection from pasted metadata XML and shows its entity ID, ACS URL, metadata URL and certificate', async () => {
    const org = await newSsoOrganization();
    const res = await submit(owner(), '/dashboard/sso/connections', { protocol: 'saml', name: 'Acme Entra', idp_metadata_xml: idpMetadata(), jit: 'on', default_role: 'viewer', state: 'draft' });
    const [row] = await connectionsOf(org.id);
    expect(row).toMatchObject({ protocol: 'saml', state: 'draft', default_role: 'viewer', saml_idp_entity_id: 'https://idp.acme.example/saml', saml_idp_sso_url: 'https://idp.acme.example/saml/sso', saml_idp_initiated: false });
    expect(row!.saml_idp_certificates).toHaveLength(1);
    const page = await follow(owner(), res);
    const base = `${issuer}/sso/${row!.id}/saml`;
    expect(page.body).toContain(`<code class="copy">${base}/metadata</code>`);
    expect(page.body).toContain(`<code class="copy">${base}/acs</code>`);
    expect(page.body).toContain(`<a href="${base}/metadata">`);
    expect(page.body).toContain('The connection is a draft');
    const certificate = new X509Certificate(idpCertificatePem());
    expect(page.body).toContain('CN=idp.acme.example');
    expect(page.body).toContain(certificate.fingerprint256);
    expect(page.body).toContain(`<time datetime="${new Date(certificate.validTo).toISOString()}">`);
    expect(page.body).toContain('<button type="submit">Activate<span class="visually-hidden"> Acme Entra</span></button>');

    // Or by hand, the certificate as a PEM block.
    const manual = await submit(owner(), '/dashboard/sso/connections', {
      protocol: 'saml',
      name: 'By hand',
      idp_entity_id: 'urn:acme:idp',
      idp_sso_url: 'https://idp.acme.example/sso',
      idp_certificates: idpCertificatePem(),
      default_role: 'member',
    });
    expect(manual.statusCode).toBe(303);
    expect((await connectionsOf(org.id))[1]).toMatchObject({ saml_idp_entity_id: 'urn:acme:idp', state: 'active', jit: false });

    // Real metadata is often larger than other forms (Entra ID's runs to tens of KiB): the form takes up to the domain's 512 KiB.
    const padded = idpMetadata('https://big.acme.example/saml').replace('<md:IDPSSODescriptor', `<!-- ${'<padding & "quotes"> '.repeat(20_000)} --><md:IDPSSODescriptor`);
    expect(padded.length).toBeGreaterThan(400 * 1024);
    expect((await submit(owner(), '/dashboard/sso/connections', { protocol: 'saml', name: 'Big', idp_metadata_xml: padded })).statusCode).toBe(303);
    expect((await connectionsOf(org.id))[2]).toMatchObject({ saml_idp_entity_id: 'https://big.acme.example/saml' });

    // Metadata that is not: an error on the page, not a 500.
    const broken = await submit(owner(), '/dashboard/sso/connections', { protocol: 'saml', name: 'Broken', idp_metadata_xml: '<md:EntityDescriptor xmlns:md="urn:oasis:names:tc:SAML:2.0:metadata"/>' });
    expect(broken.statusCode).toBe(400);
    expect(alertIn(broken.body)).toContain('Metadata XML: has no IDPSSODescriptor');
    const missing = await submit(owner(), '/dashboard/sso/connections', { protocol: 'saml', name: 'Nothing' });
    expect(missing.statusCode).toBe(400);
    expect(alertIn(missing.body)).toContain('IdP entity ID: required');
    expect(await connectionsOf(org.id)).toHaveLength(3);
  });

  it('edits a connection: a blank client secret keeps the current one, a new one replaces it', async () => {
    const org = await newSsoOrganization();
    const created = await createConnection(w.db, settings, org.id, { protocol: 'oidc', name: 'Old', issuer: 'https://old.example', client_id: 'c1', client_secret: 's1' });
    const sealed = (await connectionsOf(org.id))[0]!.oidc_client_secret_sealed;
    const res = await submit(owner(), `/dashboard/sso/connections/${created.id}`, { name: 'New name', issuer: 'https://new.example', client_id: 'c2', oidc_scopes: 'openid email', default_role: 'viewer' });
    expect(res.headers.location).toBe(`/dashboard/sso#connection-${created.id}`);
    const [row] = await connectionsOf(org.id);
    expect(row).toMatchObject({ name: 'New name', oidc_issuer: 'https://new.example', oidc_client_id: 'c2', oidc_scopes: 'openid email', jit: false, default_role: 'viewer', oidc_client_secret_sealed: sealed });
    expect((await follow(owner(), res)).body).toContain('Connection New name saved.');
    await submit(owner(), `/dashboard/sso/connections/${created.id}`, { name: 'New name', issuer: 'https://new.example', client_id: 'c2', oidc_scopes: 'openid', jit: 'on', client_secret: 's2' });
    expect((await connectionsOf(org.id))[0]!.oidc_client_secret_sealed).not.toBe(sealed);
    // A refused edit reopens its form with what was typed.
    const bad = await submit(owner(), `/dashboard/sso/connections/${created.id}`, { name: '', issuer: 'https://new.example', client_id: 'c2', oidc_scopes: 'openid' });
    expect(bad.statusCode).toBe(400);
    expect(alertIn(bad.body)).toContain('Name: must not be empty');
    expect(bad.body).toContain('<details open>');
    expect((await connectionsOf(org.id))[0]!.name).toBe('New name');
  });

  it('edits a SAML connection: new metadata replaces the IdP settings, the IdP-initiated checkbox warns', async () => {
    const org = await newSsoOrganization();
    const created = await createConnection(w.db, settings, org.id, { protocol: 'saml', name: 'IdP', idp_metadata_xml: idpMetadata() });
    const page = await owner().get('/dashboard/sso');
    expect(page.body).toContain('name="idp_initiated"');
    expect(page.body).toContain('cannot be tied to the browser');
    const res = await submit(owner(), `/dashboard/sso/connections/${created.id}`, {
      name: 'IdP',
      // The form sends the current values back beside the metadata: the metadata wins over unchanged ones.
      idp_entity_id: 'https://idp.acme.example/saml',
      idp_sso_url: 'https://idp.acme.example/saml/sso',
      idp_metadata_xml: idpMetadata('https://idp2.acme.example/saml', 'https://idp2.acme.example/sso'),
      idp_initiated: 'on',
      default_role: 'member',
    });
    expect(res.statusCode).toBe(303);
    expect((await connectionsOf(org.id))[0]).toMatchObject({ saml_idp_entity_id: 'https://idp2.acme.example/saml', saml_idp_sso_url: 'https://idp2.acme.example/sso', saml_idp_initiated: true });
    const badCert = await submit(owner(), `/dashboard/sso/connections/${created.id}`, { name: 'IdP', idp_entity_id: 'x', idp_sso_url: 'https://idp2.acme.example/sso', idp_certificates: '-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----' });
    expect(badCert.statusCode).toBe(400);
    expect(alertIn(badCert.body)).toContain('Certificates (number 1): is not an X.509 certificate');
  });

  it('only an owner vouches for a connection (links existing accounts by their verified email): what an admin makes or re-points does not', async () => {
    const org = await newSsoOrganization();
    const admin = w.browsers.admin;
    expect((await submit(owner(), '/dashboard/sso/connections', oidcFields({ name: 'Owner made' }))).statusCode).toBe(303);
    expect((await submit(admin, '/dashboard/sso/connections', oidcFields({ name: 'Admin made', client_id: 'admin-client' }))).statusCode).toBe(303);
    // A checkbox the admin's form does not have, posted all the same: not the admin's to set.
    expect((await submit(admin, '/dashboard/sso/connections', oidcFields({ name: 'Admin insisting', client_id: 'admin-client-2', links_existing_accounts: 'on' }))).statusCode).toBe(303);
    const [byOwner, byAdmin, insisting] = await connectionsOf(org.id);
    expect([byOwner, byAdmin, insisting].map((c) => [c!.name, c!.links_existing_accounts])).toEqual([['Owner made', true], ['Admin made', false], ['Admin insisting', false]]);

    // The page says which does; only the owner's edit forms have the checkbox.
    const ownerPage = await owner().get('/dashboard/sso');
    expect(ownerPage.body).toContain('<dt>Existing accounts</dt><dd>linked by their verified email (an owner vouched for this connection)</dd>');
    expect(ownerPage.body).toContain('<dt>Existing accounts</dt><dd>linked only after their owner signs in to them once</dd>');
    expect(ownerPage.body.match(/name="links_existing_accounts"/g)).toHaveLength(3);
    expect(ownerPage.body).toMatch(/<input type="checkbox" name="links_existing_accounts" checked>/);
    const adminPage = await admin.get('/dashboard/sso');
    expect(adminPage.statusCode).toBe(200);
    expect(adminPage.body).toContain('<dt>Existing accounts</dt>');
    expect(adminPage.body).not.toContain('name="links_existing_accounts"');

    const edit = (c: NonNullable<typeof byOwner>, extra: Record<string, string> = {}) => ({ name: c.name, issuer: c.oidc_issuer!, client_id: c.oidc_client_id!, oidc_scopes: c.oidc_scopes!, jit: 'on', default_role: 'member', ...extra });
    const linksOf = async (id: number) => (await connectionsOf(org.id)).find((c) => c.id === id)!.links_existing_accounts;
    // The admin's edit with the checkbox: ignored (the domain layer would refuse it, 403).
    expect((await submit(admin, `/dashboard/sso/connections/${byAdmin!.id}`, edit(byAdmin!, { links_existing_accounts: 'on' }))).statusCode).toBe(303);
    expect(await linksOf(byAdmin!.id)).toBe(false);
    // The admin renames the owner's connection (the form as a browser sends it, the secret left blank): still vouched for. Points it at another issuer: no longer.
    expect((await submit(admin, `/dashboard/sso/connections/${byOwner!.id}`, edit(byOwner!, { name: 'Owner made (renamed)', client_secret: '' }))).statusCode).toBe(303);
    expect(await linksOf(byOwner!.id)).toBe(true);
    expect((await submit(admin, `/dashboard/sso/connections/${byOwner!.id}`, edit(byOwner!, { name: 'Owner made (renamed)', issuer: 'https://attacker-idp.example' }))).statusCode).toBe(303);
    expect(await linksOf(byOwner!.id)).toBe(false);
    const event = await w.db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', org.id).where('action', '=', 'sso_connection.updated').orderBy('id', 'desc').executeTakeFirstOrThrow();
    expect(event).toEqual({ actor_user_id: w.users.admin.id, details: { connection_id: byOwner!.id, changed: ['issuer', 'links_existing_accounts'] } });

    // The owner checks the box: vouched for; unchecks it: not.
    expect((await submit(owner(), `/dashboard/sso/connections/${byAdmin!.id}`, edit(byAdmin!, { links_existing_accounts: 'on' }))).statusCode).toBe(303);
    expect(await linksOf(byAdmin!.id)).toBe(true);
    expect((await submit(owner(), `/dashboard/sso/connections/${byAdmin!.id}`, edit(byAdmin!))).statusCode).toBe(303);
    expect(await linksOf(byAdmin!.id)).toBe(false);
  });

  it('disables a connection: the sessions signed in through it end; draft and active again', async () => {
    const org = await newSsoOrganization();
    const created = await createConnection(w.db, settings, org.id, { protocol: 'oidc', name: 'Okta', issuer: 'https://okta.example', client_id: 'c', client_secret: 's' });
    const other = await createConnection(w.db, settings, org.id, { protocol: 'oidc', name: 'Other', issuer: 'https://other.example', client_id: 'c', client_secret: 's' });
    await createSession(w.db, w.users.member.id, { ssoConnectionId: created.id });
    await createSession(w.db, w.users.member.id, { ssoConnectionId: other.id });
    const sessions = (id: number) => w.db.selectFrom('sessions').select('id_hash').where('sso_connection_id', '=', id).execute();
    expect(await sessions(created.id)).toHaveLength(1);
    const page = await owner().get('/dashboard/sso');
    expect(page.body).toContain('signs out everyone who signed in through this connection');
    const res = await submit(owner(), `/dashboard/sso/connections/${created.id}/state`, { state: 'disabled' });
    expect((await connectionsOf(org.id))[0]!.state).toBe('disabled');
    expect(await sessions(created.id)).toHaveLength(0);
    expect(await sessions(other.id)).toHaveLength(1);
    expect((await follow(owner(), res)).body).toContain('Connection Okta is disabled: everyone who had signed in through it was signed out.');
    const event = await w.db.selectFrom('audit_events').select(['actor_user_id', 'details']).where('organization_id', '=', org.id).where('action', '=', 'sso_connection.updated').executeTakeFirstOrThrow();
    expect(event).toMatchObject({ actor_user_id: w.users.owner.id, details: { state: 'disabled', sessions_ended: 1 } });
    expect((await submit(owner(), `/dashboard/sso/connections/${created.id}/state`, { state: 'draft' })).statusCode).toBe(303);
    expect((await submit(owner(), `/dashboard/sso/connections/${created.id}/state`, { state: 'active' })).statusCode).toBe(303);
    expect((await connectionsOf(org.id))[0]!.state).toBe('active');
    expect((await submit(owner(), `/dashboard/sso/connections/${created.id}/state`, { state: 'gone' })).statusCode).toBe(400);
  });

  it('deletes a connection only after a confirmation page', async () => {
    const org = await newSsoOrganization();
    const created = await createConnection(w.db, settings, org.id, { protocol: 'oidc', name: 'Doomed', issuer: 'https://okta.example', client_id: 'c', client_secret: 's' });
    const session = await createSession(w.db, w.users.member.id, { ssoConnectionId: created.id });
    const ask = await submit(owner(), `/dashboard/sso/connections/${created.id}/delete`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain('<h1>Delete the connection Doomed?</h1>');
    expect(ask.body).toContain('name="confirm" value="delete"');
    expect(await connectionsOf(org.id)).toHaveLength(1);
    const res = await submit(owner(), `/dashboard/sso/connections/${created.id}/delete`, { confirm: 'delete' });
    expect(res.headers.location).toBe('/dashboard/sso');
    expect(await connectionsOf(org.id)).toHaveLength(0);
    expect(await w.db.selectFrom('sessions').select('id_hash').where('id_hash', '=', sha256Hex(session)).execute()).toHaveLength(0);
    expect((await follow(owner(), res)).body).toContain('Deleted the connection Doomed: nobody can sign in through it any more');
  });
});

describe(`dashboard single sign-on: domains on ${BACKEND}`, () => {
  it('adds a domain and shows its TXT record; a public mail domain is refused with the domain layer’s message', async () => {
    const org = await newSsoOrganization();
    const domain = `acme-${org.id}.example`;
    const res = await submit(owner(), '/dashboard/sso/domains', { domain: ` ${domain.toUpperCase()} ` });
    const row = await domainRow(org.id, domain);
    expect(res.headers.location).toBe(`/dashboard/sso#domain-${row!.id}`);
    expect(row?.state).toBe('pending');
    const page = await follow(owner(), res);
    expect(page.body).toContain(`${domain} was added. Publish its TXT record`);
    expect(page.body).toContain(`<code class="copy">_orgauth-challenge.${domain}</code>`);
    expect(page.body).toContain(`<code class="copy">${row!.verification_token}</code>`);
    expect(page.body).toContain('>Verify now<');

    const gmail = await submit(owner(), '/dashboard/sso/domains', { domain: 'gmail.com' });
    expect(gmail.statusCode).toBe(400);
    expect(alertIn(gmail.body)).toContain('Domain: gmail.com is a public mail service; its addresses belong to their users, not to an organization');
    expect(gmail.body).toContain('value="gmail.com"');
    const twice = await submit(owner(), '/dashboard/sso/domains', { domain });
    expect(twice.statusCode).toBe(409);
    expect(alertIn(twice.body)).toContain('already claimed');
    expect((await submit(owner(), '/dashboard/sso/domains', { domain: 'not a domain' })).statusCode).toBe(400);
  });

  it('verifies a domain by its DNS TXT record: an error on the page until the record is there', async () => {
    const org = await newSsoOrganization();
    const domain = `verify-${org.id}.example`;
    await submit(owner(), '/dashboard/sso/domains', { domain });
    const token = (await domainRow(org.id, domain))!.verification_token;

    const none = await submit(owner(), `/dashboard/sso/domains/${domain}/verify`);
    expect(none.statusCode).toBe(400);
    expect(alertIn(none.body)).toContain(`no TXT record found at _orgauth-challenge.${domain}`);
    expect(dns.queries()).toContain(`_orgauth-challenge.${domain}`);
    dns.setTxt(`_orgauth-challenge.${domain}`, ['v=spf1 -all']);
    const wrong = await submit(owner(), `/dashboard/sso/domains/${domain}/verify`);
    expect(wrong.statusCode).toBe(400);
    expect(alertIn(wrong.body)).toContain(`the TXT records at _orgauth-challenge.${domain} do not hold this domain&#39;s token ${token}`);
    expect((await domainRow(org.id, domain))!.state).toBe('pending');

    dns.setTxt(`_orgauth-challenge.${domain}`, ['v=spf1 -all', token]);
    const res = await submit(owner(), `/dashboard/sso/domains/${domain}/verify`);
    expect(res.headers.location).toBe(`/dashboard/sso#domain-${(await domainRow(org.id, domain))!.id}`);
    expect((await domainRow(org.id, domain))!.state).toBe('verified');
    const page = await follow(owner(), res);
    expect(page.body).toContain(`${domain} is verified.`);
    expect(page.body).toContain('>Require SSO<');
    expect(page.body).not.toContain(`<code class="copy">${token}</code>`);
    const event = await w.db.selectFrom('audit_events').select('actor_user_id').where('organization_id', '=', org.id).where('action', '=', 'domain.verified').executeTakeFirstOrThrow();
    expect(event.actor_user_id).toBe(w.users.owner.id);
  });

  it('requires SSO for a verified domain and stops requiring it; a pending one cannot', async () => {
    const org = await newSsoOrganization();
    const domain = `required-${org.id}.example`;
    const pending = `pending-${org.id}.example`;
    await addDomain(w.db, org.id, { domain });
    await addDomain(w.db, org.id, { domain: pending });
    await w.db.updateTable('sso_domains').set({ state: 'verified', verified_at: new Date() }).where('domain', '=', domain).execute();
    const page = await owner().get('/dashboard/sso');
    expect(page.body).toContain('can then sign in only through the organization’s identity provider');
    expect(page.body).toContain('only while a connection is active');
    const on = await submit(owner(), `/dashboard/sso/domains/${domain}/sso-required`, { sso_required: 'yes' });
    expect((await domainRow(org.id, domain))!.sso_required).toBe(true);
    const shown = await follow(owner(), on);
    expect(shown.body).toContain(`Single sign-on is now required for addresses at ${domain}.`);
    expect(shown.body).toContain('>Stop requiring SSO<');
    await submit(owner(), `/dashboard/sso/domains/${domain}/sso-required`, { sso_required: 'no' });
    expect((await domainRow(org.id, domain))!.sso_required).toBe(false);
    const refused = await submit(owner(), `/dashboard/sso/domains/${pending}/sso-required`, { sso_required: 'yes' });
    expect(refused.statusCode).toBe(400);
    expect(alertIn(refused.body)).toContain(`Verify ${pending} before requiring single sign-on for it.`);
    expect((await domainRow(org.id, pending))!.sso_required).toBe(false);

    const ask = await submit(owner(), `/dashboard/sso/domains/${pending}/delete`);
    expect(ask.statusCode).toBe(200);
    expect(ask.body).toContain(`<h1>Remove the domain ${pending}?</h1>`);
    expect(await domainRow(org.id, pending)).toBeDefined();
    const removed = await submit(owner(), `/dashboard/sso/domains/${pending}/delete`, { confirm: 'delete' });
    expect(removed.statusCode).toBe(303);
    expect(await domainRow(org.id, pending)).toBeUndefined();
  });
});

describe(`dashboard single sign-on: who may on ${BACKEND}`, () => {
  it('refuses the page and its forms to roles without sso.read (403)', async () => {
    const org = await newSsoOrganization();
    for (const b of [w.extra.viewer.browser, w.browsers.member]) {
      const page = await b.get('/dashboard/sso');
      expect(page.statusCode).toBe(403);
      expectPageSecurityHeaders(page);
      expect((await submit(b, '/dashboard/sso/domains', { domain: `viewer-${org.id}.example` })).statusCode).toBe(403);
      expect((await submit(b, '/dashboard/sso/connections', oidcFields())).statusCode).toBe(403);
    }
    expect(await connectionsOf(org.id)).toHaveLength(0);
    expect(await domainRow(org.id, `viewer-${org.id}.example`)).toBeUndefined();
    // Signed out: the login page.
    const anonymous = await new Browser(w.app, '10.21.1.1').get('/dashboard/sso');
    expect(anonymous.statusCode).toBe(303);
    expect(anonymous.headers.location).toMatch(/^\/login/);
  });

  it('shows everything read-only to a role with sso.read but not sso.write, and refuses its POSTs (403)', async () => {
    const org = await newSsoOrganization();
    const connection = await createConnection(w.db, settings, org.id, { protocol: 'saml', name: 'Read me', idp_metadata_xml: idpMetadata() });
    const domain = `readonly-${org.id}.example`;
    await addDomain(w.db, org.id, { domain });
    const b = w.extra.auditor.browser;
    const page = await b.get('/dashboard/sso');
    expect(page.statusCode).toBe(200);
    expect(page.body).toContain('Read me');
    expect(page.body).toContain(`${issuer}/sso/${connection.id}/saml/acs`);
    expect(page.body).toContain(`_orgauth-challenge.${domain}`);
    expect(page.body).not.toMatch(/<form method="post" action="\/dashboard\/sso/);
    expect(page.body).not.toContain('Add a connection');
    expect(page.body).not.toContain('Verify now');
    for (const [url, fields] of [
      ['/dashboard/sso/connections', oidcFields()],
      [`/dashboard/sso/connections/${connection.id}`, { name: 'Renamed' }],
      [`/dashboard/sso/connections/${connection.id}/state`, { state: 'disabled' }],
      [`/dashboard/sso/connections/${connection.id}/delete`, { confirm: 'delete' }],
      ['/dashboard/sso/domains', { domain: `new-${org.id}.example` }],
      [`/dashboard/sso/domains/${domain}/verify`, {}],
      [`/dashboard/sso/domains/${domain}/delete`, {}],
      [`/dashboard/sso/domains/${domain}/delete`, { confirm: 'delete' }],
    ] as const) {
      expect((await submit(b, url, fields)).statusCode).toBe(403);
    }
    expect(await connectionsOf(org.id)).toMatchObject([{ name: 'Read me', state: 'active' }]);
    expect(await domainRow(org.id, domain)).toBeDefined();
  });

  it('refuses a form without the session’s CSRF token (403)', async () => {
    const org = await newSsoOrganization();
    const connection = await createConnection(w.db, settings, org.id, { protocol: 'oidc', name: 'Okta', issuer: 'https://okta.example', client_id: 'c', client_secret: 's' });
    expect((await owner().post('/dashboard/sso/connections', oidcFields())).statusCode).toBe(403);
    const foreign = await w.browsers.admin.csrf('/dashboard');
    expect((await owner().post('/dashboard/sso/connections', { ...oidcFields(), csrf_token: foreign })).statusCode).toBe(403);
    expect((await owner().post(`/dashboard/sso/connections/${connection.id}/state`, { state: 'disabled' })).statusCode).toBe(403);
    expect((await owner().post('/dashboard/sso/domains', { domain: `csrf-${org.id}.example` })).statusCode).toBe(403);
    expect(await connectionsOf(org.id)).toMatchObject([{ name: 'Okta', state: 'active' }]);
    expect(await domainRow(org.id, `csrf-${org.id}.example`)).toBeUndefined();
  });

  it('answers 404 for another organization’s connection or domain', async () => {
    const org = await newSsoOrganization();
    const theirs = (await w.db.selectFrom('organizations').select('id').where('name', '=', 'Outsider Org').executeTakeFirstOrThrow()).id;
    const connection = await createConnection(w.db, settings, theirs, { protocol: 'oidc', name: 'Theirs', issuer: 'https://theirs.example', client_id: 'c', client_secret: 's' });
    const domain = `theirs-${org.id}.example`;
    await addDomain(w.db, theirs, { domain });
    for (const [url, fields] of [
      [`/dashboard/sso/connections/${connection.id}`, { name: 'Mine now', issuer: 'https://x.example', client_id: 'c', oidc_scopes: 'openid' }],
      [`/dashboard/sso/connections/${connection.id}/state`, { state: 'disabled' }],
      [`/dashboard/sso/connections/${connection.id}/delete`, { confirm: 'delete' }],
      ['/dashboard/sso/connections/01/state', { state: 'disabled' }],
      ['/dashboard/sso/connections/99999999/state', { state: 'disabled' }],
      [`/dashboard/sso/domains/${domain}/verify`, {}],
      [`/dashboard/sso/domains/${domain}/sso-required`, { sso_required: 'no' }],
      [`/dashboard/sso/domains/${domain}/delete`, {}],
      [`/dashboard/sso/domains/${domain}/delete`, { confirm: 'delete' }],
    ] as const) {
      expect((await submit(owner(), url, fields)).statusCode, url).toBe(404);
    }
    expect(await connectionsOf(theirs)).toMatchObject([{ name: 'Theirs', state: 'active' }]);
    expect(await domainRow(theirs, domain)).toBeDefined();
    // Nothing in a URL becomes a notice, or shows another organization's connection.
    const forged = await owner().get(`/dashboard/sso?done=disabled&connection=${connection.id}&created=${connection.id}`);
    expect(forged.statusCode).toBe(200);
    expect(forged.body).not.toContain('Theirs');
    expect(forged.body).not.toContain('role="status"');
  });
});
