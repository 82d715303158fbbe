/**
 * The management API's single sign-on resources (issue 25): an organization's private
 * application connects OpenID Connect and SAML identity providers (/sso-connections) and claims,
 * verifies and configures email domains (/domains), with sso.read and sso.write, the domain
 * layer's rules (src/sso/*), and every change in the audit log. Domain verification looks the
 * TXT record up for real, on a loopback DNS server (DNS_SERVERS).
 */
import { X509Certificate } from 'node:crypto';
import type { FastifyInstance, LightMyRequestResponse } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRole } from '../../src/accounts/roles.js';
import { KNOWN_SCOPES } from '../../src/oauth/helpers/scopes.js';
import { ensureSigningKey } from '../../src/oauth/models/signing-keys.js';
import { openText } from '../../src/lib/crypto.js';
import { CLIENT_SECRET_PURPOSE, createConnection } from '../../src/sso/connections.js';
import { buildTestApp, TEST_SECRET_KEY, testConfig } from '../helpers/app.js';
import { BACKEND, createTestDatabase } from '../helpers/db.js';
import { startDnsServer, type TestDnsServer } from '../helpers/dns-server.js';
import { clientCredentialsToken, createOrgFixture, type OrgFixture } from '../helpers/oauth.js';
import { certificateBody, createSamlIdp, generateTestKeyPair, idpKeyPair } from '../helpers/saml-idp.js';

let t: Awaited<ReturnType<typeof createTestDatabase>>;
let dns: TestDnsServer;
let app: FastifyInstance;
let issuer: string;
let a: OrgFixture;
let b: OrgFixture;
let c: OrgFixture;
const full = new Map<OrgFixture, string>();

beforeAll(async () => {
  dns = await startDnsServer();
  t = await createTestDatabase();
  await ensureSigningKey(t.handle.db, { alg: 'ES256', secretKey: TEST_SECRET_KEY });
  const env = { DNS_SERVERS: dns.address };
  issuer = testConfig(env).issuer;
  app = await buildTestApp(t.handle.db, { listen: t.handle.listen, env });
  // Private applications that may hold every scope, sso.read and sso.write included.
  [a, b, c] = [await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') }), await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') }), await createOrgFixture(t.handle.db, { scopes: KNOWN_SCOPES.join(' ') })];
  for (const fixture of [a, b, c]) full.set(fixture, await clientCredentialsToken(app, fixture));
});
afterAll(async () => {
  await app?.close();
  await t?.close();
  await dns?.close();
});

type Method = 'GET' | 'POST' | 'PATCH' | 'DELETE';

function api(method: Method, path: string, options: { org?: OrgFixture; token?: string; body?: object } = {}) {
  const org = options.org ?? a;
  return app.inject({
    method,
    url: `/api/v1/${org.organizationId}${path}`,
    headers: { authorization: `Bearer ${options.token ?? full.get(org)}` },
    ...(options.body ? { payload: options.body } : {}),
  });
}

function expectError(res: LightMyRequestResponse, status: number, error: string): { error: string; error_description: string; details?: { path: string; message: string }[] } {
  expect({ status: res.statusCode, body: res.json() }).toMatchObject({ status, body: { error, error_description: expect.any(String) } });
  return res.json();
}

async function auditEvents(org: OrgFixture = a): Promise<{ action: string; actor: { user_id: number | null; client_id: string | null }; details: Record<string, unknown> }[]> {
  const res = await api('GET', '/audit-events?limit=100', { org, token: await clientCredentialsToken(app, org, 'audit.read') });
  expect(res.statusCode).toBe(200);
  return res.json().data;
}

const OIDC = { protocol: 'oidc', name: 'Okta', issuer: 'https://acme.okta.example/oauth2/default', client_id: 'orgauth-client', client_secret: 'upstream-client-secret-value-0001' };
const SAML_ENTITY = 'https://idp.acme.example/saml/metadata';
const SAML_SSO = 'https://idp.acme.example/saml/sso';

describe(`SSO connections in the management API on ${BACKEND}`, () => {
  it('creates an OIDC connection: 201, the redirect URI to register, and the client secret nowhere in what it returns', async () => {
    const res = await api('POST', '/sso-connections', { body: OIDC });
    expect(res.statusCode, res.body).toBe(201);
    const made = res.json();
    expect(made).toEqual({
      id: expect.any(Number), organization_id: a.organizationId, protocol: 'oidc', name: 'Okta', state: 'active', jit: true, default_role: 'member',
      // Made by an application: it takes over no existing account without that account's proof.
      links_existing_accounts: false,
      created_at: expect.any(String), updated_at: expect.any(String),
      issuer: OIDC.issuer, client_id: 'orgauth-client', scopes: 'openid email profile', redirect_uri: `${issuer}/sso/${made.id}/oidc/callback`,
    });
    expect(res.headers.location).toBe(`/api/v1/${a.organizationId}/sso-connections/${made.id}`);
    const shown = await api('GET', `/sso-connections/${made.id}`);
    expect(shown.statusCode).toBe(200);
    expect(shown.json()).toEqual(made);
    const listed = await api('GET', '/sso-connections');
    expect(listed.statusCode).toBe(200);
    expect(listed.json().data).toContainEqual(made);
    for (const body of [res.body, shown.body, listed.body]) {
      expect(body).not.toContain(OIDC.client_secret);
      expect(body).not.toMatch(/client_secret|sealed/);
    }
    // Sealed at rest: not the secret, but the secret once opened with the instance's key.
    const row = await t.handle.db.selectFrom('sso_connections').select('oidc_client_secret_sealed').where('id', '=', made.id).executeTakeFirstOrThrow();
    expect(row.oidc_client_secret_sealed).not.toContain(OIDC.client_secret);
    expect(openText(TEST_SECRET_KEY, CLIENT_SECRET_PURPOSE, row.oidc_client_secret_sealed!)).toBe(OIDC.client_secret);
    expect((await auditEvents()).find((e) => e.action === 'sso_connection.created' && e.details.connection_id === made.id)).toEqual({
      id: expect.any(Number), action: 'sso_connection.created', created_at: expect.any(String),
      actor: { user_id: null, email: null, client_id: a.privateApp.client_id },
      details: { connection_id: made.id, protocol: 'oidc', name: 'Okta', state: 'active' },
    });
  });

  it('takes scopes, state, jit and a default role, and refuses what the domain refuses (400 with details)', async () => {
    const made = (await api('POST', '/sso-connections', { body: { ...OIDC, name: 'Entra', scopes: 'openid email', state: 'draft', jit: false, default_role: 'viewer' } })).json();
    expect(made).toMatchObject({ name: 'Entra', scopes: 'openid email', state: 'draft', jit: false, default_role: 'viewer' });
    const { client_secret: _secret, ...withoutSecret } = OIDC;
    expect(expectError(await api('POST', '/sso-connections', { body: withoutSecret }), 400, 'invalid_request').details).toContainEqual({ path: 'client_secret', message: expect.any(String) });
    expect(expectError(await api('POST', '/sso-connections', { body: { ...OIDC, issuer: 'not a url' } }), 400, 'invalid_request').details).toContainEqual({ path: 'issuer', message: expect.any(String) });
    expect(expectError(await api('POST', '/sso-connections', { body: { ...OIDC, scopes: 'email profile' } }), 400, 'invalid_request').details).toContainEqual({ path: 'scopes', message: 'must include openid' });
    expectError(await api('POST', '/sso-connections', { body: { ...OIDC, protocol: 'ldap' } }), 400, 'invalid_request');
    expectError(await api('POST', '/sso-connections', { body: { ...OIDC, state: 'on' } }), 400, 'invalid_request');
    // An OIDC connection has no SAML fields, and nobody has fields that do not exist.
    expectError(await api('POST', '/sso-connections', { body: { ...OIDC, idp_entity_id: SAML_ENTITY } }), 400, 'invalid_request');
    expectError(await api('POST', '/sso-connections', { body: { ...OIDC, client_secret_hash: 'x' } }), 400, 'invalid_request');
  });

  it('creates a SAML connection from PEM certificates (several, for rotation) or base64 DER: its SP URLs to register, the certificates described', async () => {
    const current = idpKeyPair().certificatePem;
    const next = generateTestKeyPair('next IdP key').certificatePem;
    const res = await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'ADFS', idp_entity_id: SAML_ENTITY, idp_sso_url: SAML_SSO, idp_certificates: [current, certificateBody(next)], idp_initiated: true } });
    expect(res.statusCode, res.body).toBe(201);
    const made = res.json();
    const base = `${issuer}/sso/${made.id}`;
    expect(made).toEqual({
      id: expect.any(Number), organization_id: a.organizationId, protocol: 'saml', name: 'ADFS', state: 'active', jit: true, default_role: 'member', links_existing_accounts: false,
      created_at: expect.any(String), updated_at: expect.any(String),
      idp_entity_id: SAML_ENTITY, idp_sso_url: SAML_SSO, idp_initiated: true,
      idp_certificates: [current, next].map((pem) => {
        const cert = new X509Certificate(pem);
        return { subject: expect.stringContaining('CN='), fingerprint_sha256: cert.fingerprint256, not_after: new Date(cert.validTo).toISOString() };
      }),
      entity_id: `${base}/saml/metadata`, acs_url: `${base}/saml/acs`, metadata_url: `${base}/saml/metadata`,
    });
    expect((await api('GET', `/sso-connections/${made.id}`)).json()).toEqual(made);
  });

  it('creates a SAML connection from the IdP metadata XML; what is given beside it wins', async () => {
    const idp = createSamlIdp({ entityId: 'https://metadata-idp.example/entity', ssoUrl: 'https://metadata-idp.example/sso' });
    const res = await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'From metadata', idp_metadata_xml: idp.metadataXml() } });
    expect(res.statusCode, res.body).toBe(201);
    expect(res.json()).toMatchObject({
      idp_entity_id: 'https://metadata-idp.example/entity', idp_sso_url: 'https://metadata-idp.example/sso', idp_initiated: false,
      idp_certificates: [{ fingerprint_sha256: new X509Certificate(idp.certificatePem).fingerprint256 }],
    });
    const overridden = await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Overridden', idp_metadata_xml: idp.metadataXml(), idp_sso_url: SAML_SSO } });
    expect(overridden.json()).toMatchObject({ idp_entity_id: 'https://metadata-idp.example/entity', idp_sso_url: SAML_SSO });
    // Real IdP metadata can be larger than the API's 64 KiB body limit: these routes take up to 1.5 MiB.
    const large = await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Large metadata', idp_metadata_xml: `${idp.metadataXml()}<!-- ${'x'.repeat(200_000)} -->` } });
    expect(large.statusCode, large.body.slice(0, 300)).toBe(201);
    expect(large.json().idp_entity_id).toBe('https://metadata-idp.example/entity');
    expectError(await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Too large', idp_metadata_xml: 'x'.repeat(600 * 1024) } }), 400, 'invalid_request');
  });

  it('refuses a certificate that is not one, metadata that is not metadata, and a SAML connection missing its IdP (400 with details)', async () => {
    const bad = expectError(
      await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Bad', idp_entity_id: SAML_ENTITY, idp_sso_url: SAML_SSO, idp_certificates: [idpKeyPair().certificatePem, '-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----'] } }),
      400,
      'invalid_request',
    );
    expect(bad.details).toEqual([{ path: 'idp_certificates.1', message: 'is not an X.509 certificate (PEM or base64 DER)' }]);
    expect(expectError(await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Bad', idp_entity_id: SAML_ENTITY, idp_sso_url: SAML_SSO, idp_certificates: [] } }), 400, 'invalid_request').details).toEqual([
      { path: 'idp_certificates', message: 'must hold at least one certificate' },
    ]);
    expect(expectError(await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Bad', idp_metadata_xml: '<nope' } }), 400, 'invalid_request').details).toEqual([
      { path: 'idp_metadata_xml', message: 'is not well-formed XML' },
    ]);
    expect(expectError(await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Bad', idp_metadata_xml: '<!DOCTYPE x><x/>' } }), 400, 'invalid_request').details).toEqual([
      { path: 'idp_metadata_xml', message: 'must not contain a DOCTYPE' },
    ]);
    const missing = expectError(await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Bad', idp_entity_id: SAML_ENTITY } }), 400, 'invalid_request');
    expect(missing.details).toEqual([{ path: 'idp_sso_url', message: 'required' }, { path: 'idp_certificates', message: 'required' }]);
  });

  it('never makes owners, refuses unknown roles, and gives only a role within the token’s scopes (403 beyond them)', async () => {
    expect(expectError(await api('POST', '/sso-connections', { body: { ...OIDC, default_role: 'owner' } }), 400, 'invalid_request').error_description).toMatch(/cannot make owners/);
    expect(expectError(await api('POST', '/sso-connections', { body: { ...OIDC, default_role: 'Wizard' } }), 400, 'invalid_request').error_description).toMatch(/no role named\s+.Wizard.\s+in this organization/);
    // A token with sso.write alone cannot give member (which holds contacts.*, tasks.*, ...) but can give a role holding nothing.
    const narrow = await clientCredentialsToken(app, a, 'sso.write');
    expect(expectError(await api('POST', '/sso-connections', { token: narrow, body: OIDC }), 403, 'forbidden').error_description).toMatch(/may not give the role member/);
    await createRole(t.handle.db, a.organizationId, { name: 'SSO guest', permissions: [] });
    const guest = await api('POST', '/sso-connections', { token: narrow, body: { ...OIDC, name: 'Guests', default_role: 'SSO guest' } });
    expect(guest.statusCode, guest.body).toBe(201);
    expect(guest.json().default_role).toBe('SSO guest');
    // Nor change or delete a connection giving a role beyond its scopes.
    const wide = (await api('POST', '/sso-connections', { body: { ...OIDC, name: 'Wide' } })).json();
    expectError(await api('PATCH', `/sso-connections/${wide.id}`, { token: narrow, body: { default_role: 'SSO guest' } }), 403, 'forbidden');
    expectError(await api('DELETE', `/sso-connections/${wide.id}`, { token: narrow }), 403, 'forbidden');
    expect((await api('PATCH', `/sso-connections/${guest.json().id}`, { token: narrow, body: { name: 'Guests 2' } })).json().name).toBe('Guests 2');
  });

  it('changes a connection: disabling it, renaming it, replacing the secret or the certificates; the audit log says what changed', async () => {
    const made = (await api('POST', '/sso-connections', { body: { ...OIDC, name: 'To change' } })).json();
    const disabled = await api('PATCH', `/sso-connections/${made.id}`, { body: { state: 'disabled' } });
    expect(disabled.statusCode, disabled.body).toBe(200);
    expect(disabled.json()).toEqual({ ...made, state: 'disabled', updated_at: expect.any(String) });
    const secret = 'a-brand-new-upstream-secret-0002';
    const moved = 'https://login.acme.example/oauth2/v2';
    const renamed = await api('PATCH', `/sso-connections/${made.id}`, { body: { name: 'Changed', issuer: moved, client_secret: secret, scopes: 'openid email' } });
    expect(renamed.json()).toMatchObject({ name: 'Changed', issuer: moved, scopes: 'openid email', state: 'disabled' });
    expect(renamed.body).not.toContain(secret);
    const row = await t.handle.db.selectFrom('sso_connections').select('oidc_client_secret_sealed').where('id', '=', made.id).executeTakeFirstOrThrow();
    expect(openText(TEST_SECRET_KEY, CLIENT_SECRET_PURPOSE, row.oidc_client_secret_sealed!)).toBe(secret);
    // The other protocol's fields, the protocol itself, bad values: 400.
    expectError(await api('PATCH', `/sso-connections/${made.id}`, { body: { idp_sso_url: SAML_SSO } }), 400, 'invalid_request');
    expectError(await api('PATCH', `/sso-connections/${made.id}`, { body: { protocol: 'saml' } }), 400, 'invalid_request');
    expectError(await api('PATCH', `/sso-connections/${made.id}`, { body: { state: 'paused' } }), 400, 'invalid_request');
    expectError(await api('PATCH', `/sso-connections/${made.id}`, { body: { default_role: 'owner' } }), 400, 'invalid_request');

    const saml = (await api('POST', '/sso-connections', { body: { protocol: 'saml', name: 'Rotating', idp_entity_id: SAML_ENTITY, idp_sso_url: SAML_SSO, idp_certificates: [idpKeyPair().certificatePem] } })).json();
    const next = generateTestKeyPair('rotated IdP key').certificatePem;
    const rotated = await api('PATCH', `/sso-connections/${saml.id}`, { body: { idp_certificates: [next] } });
    expect(rotated.statusCode, rotated.body).toBe(200);
    expect(rotated.json().idp_certificates.map((cert: { fingerprint_sha256: string }) => cert.fingerprint_sha256)).toEqual([new X509Certificate(next).fingerprint256]);
    expect(expectError(await api('PATCH', `/sso-connections/${saml.id}`, { body: { idp_certificates: ['nope'] } }), 400, 'invalid_request').details).toEqual([
      { path: 'idp_certificates.0', message: 'is not an X.509 certificate (PEM or base64 DER)' },
    ]);

    const events = (await auditEvents()).filter((e) => e.action === 'sso_connection.updated' && (e.details.connection_id === made.id || e.details.connection_id === saml.id));
    expect(events.map((e) => e.details)).toEqual([
      { connection_id: saml.id, changed: ['idp_certificates'] },
      { connection_id: made.id, changed: ['name', 'issuer', 'client_secret', 'scopes'] },
      { connection_id: made.id, changed: ['state'], state: 'disabled', sessions_ended: 0 },
    ]);
    expect(events.every((e) => e.actor.client_id === a.privateApp.client_id)).toBe(true);
    expect(JSON.stringify(events)).not.toContain(secret);
  });

  // KNOWN BUG in src/sso/connections.ts (updateConnection): the OIDC fields are applied only
  // `if ('issuer' in parsed)`, and zod leaves absent keys out, so a PATCH of client_id,
  // client_secret or scopes without issuer is answered 200 and changes nothing. The fix there:
  // `if (current.protocol === 'oidc')`. Then drop `.fails` here.
  it('changes the client secret, client id or scopes of an OIDC connection without the issuer being given', async () => {
    const made = (await api('POST', '/sso-connections', { body: { ...OIDC, name: 'Secret rotation' } })).json();
    const secret = 'rotated-upstream-secret-value-0003';
    const res = await api('PATCH', `/sso-connections/${made.id}`, { body: { client_id: 'new-client', client_secret: secret, scopes: 'openid email' } });
    expect(res.json()).toMatchObject({ client_id: 'new-client', scopes: 'openid email' });
    const row = await t.handle.db.selectFrom('sso_connections').select('oidc_client_secret_sealed').where('id', '=', made.id).executeTakeFirstOrThrow();
    expect(openText(TEST_SECRET_KEY, CLIENT_SECRET_PURPOSE, row.oidc_client_secret_sealed!)).toBe(secret);
  });

  it('links_existing_accounts: an application may not turn it on (403); its change of what a connection trusts turns it off', async () => {
    const countOf = async () => (await t.handle.db.selectFrom('sso_connections').select('id').where('organization_id', '=', a.organizationId).execute()).length;
    const before = await countOf();
    expect(expectError(await api('POST', '/sso-connections', { body: { ...OIDC, name: 'Vouching app', links_existing_accounts: true } }), 403, 'forbidden').error_description).toMatch(/only an owner/);
    expect(await countOf()).toBe(before);
    const unvouched = await api('POST', '/sso-connections', { body: { ...OIDC, name: 'Not vouching', links_existing_accounts: false } });
    expect(unvouched.statusCode, unvouched.body).toBe(201);
    expect(unvouched.json().links_existing_accounts).toBe(false);
    expectError(await api('PATCH', `/sso-connections/${unvouched.json().id}`, { body: { links_existing_accounts: true } }), 403, 'forbidden');
    expectError(await api('POST', '/sso-connections', { body: { ...OIDC, links_existing_accounts: 'yes' } }), 400, 'invalid_request');

    // One the operator made (what createConnection does without an acting role): it links existing accounts.
    const settings = { issuer, secretKey: TEST_SECRET_KEY, allowHttp: testConfig().outbound.allowHttp };
    const vouched = await createConnection(t.handle.db, settings, a.organizationId, { ...OIDC, name: 'Operator vouched' });
    expect((await api('GET', `/sso-connections/${vouched.id}`)).json().links_existing_accounts).toBe(true);
    // The application renames it: still vouched for. It sets the client secret: whom the connection trusts is the application's word now.
    expect((await api('PATCH', `/sso-connections/${vouched.id}`, { body: { name: 'Operator vouched (renamed)', scopes: 'openid email' } })).json().links_existing_accounts).toBe(true);
    const moved = await api('PATCH', `/sso-connections/${vouched.id}`, { body: { client_secret: 'an-application-chose-this-secret-01' } });
    expect(moved.statusCode, moved.body).toBe(200);
    expect(moved.json().links_existing_accounts).toBe(false);
    expect((await auditEvents()).find((e) => e.action === 'sso_connection.updated' && e.details.connection_id === vouched.id)?.details).toEqual({
      connection_id: vouched.id, changed: ['client_secret', 'links_existing_accounts'],
    });
    // Turning it off is anyone's.
    const another = await createConnection(t.handle.db, settings, a.organizationId, { ...OIDC, name: 'Operator vouched 2' });
    expect((await api('PATCH', `/sso-connections/${another.id}`, { body: { links_existing_accounts: false } })).json().links_existing_accounts).toBe(false);
  });

  it('deletes a connection: 204, then 404 for it; audited', async () => {
    const made = (await api('POST', '/sso-connections', { body: { ...OIDC, name: 'Doomed' } })).json();
    const deleted = await api('DELETE', `/sso-connections/${made.id}`);
    expect(deleted.statusCode).toBe(204);
    expect(deleted.body).toBe('');
    expectError(await api('GET', `/sso-connections/${made.id}`), 404, 'not_found');
    expectError(await api('PATCH', `/sso-connections/${made.id}`, { body: { name: 'Back' } }), 404, 'not_found');
    expectError(await api('DELETE', `/sso-connections/${made.id}`), 404, 'not_found');
    expect((await auditEvents()).find((e) => e.action === 'sso_connection.deleted' && e.details.connection_id === made.id)).toMatchObject({
      actor: { client_id: a.privateApp.client_id }, details: { connection_id: made.id, name: 'Doomed', protocol: 'oidc' },
    });
  });

  it("another organization's connection is not found (404 exactly like a missing id), and stays as it was", async () => {
    const theirs = (await api('POST', '/sso-connections', { org: b, body: { ...OIDC, name: 'Theirs' } })).json();
    const missing = await api('GET', '/sso-connections/987654321');
    expectError(missing, 404, 'not_found');
    for (const [method, body] of [['GET', undefined], ['PATCH', { name: 'Mine now' }], ['DELETE', undefined]] as const) {
      const res = await api(method, `/sso-connections/${theirs.id}`, body ? { body } : {});
      expect(res.statusCode).toBe(404);
      expect(res.json()).toEqual(missing.json());
    }
    expect((await api('GET', '/sso-connections')).json().data.map((x: { id: number }) => x.id)).not.toContain(theirs.id);
    expect((await api('GET', `/sso-connections/${theirs.id}`, { org: b })).json()).toEqual(theirs);
    // B's path with A's token: the organization mismatch, before anything else.
    expectError(await api('GET', `/sso-connections/${theirs.id}`, { org: b, token: full.get(a) }), 403, 'organization_mismatch');
    // Ids in other spellings are not ids.
    expectError(await api('GET', `/sso-connections/0${theirs.id}`, { org: b }), 404, 'not_found');
    expectError(await api('GET', '/sso-connections/abc'), 404, 'not_found');
  });
});

describe(`domains in the management API on ${BACKEND}`, () => {
  const domain = `acme-${process.pid}.example`;
  const challenge = `_orgauth-challenge.${domain}`;
  let tokenOfA: string;
  let tokenOfB: string;

  it('claims a domain: pending, with the TXT record to publish', async () => {
    const res = await api('POST', '/domains', { body: { domain: `ACME-${process.pid}.Example.` } });
    expect(res.statusCode, res.body).toBe(201);
    const claimed = res.json();
    expect(claimed).toEqual({
      id: expect.any(Number), domain, state: 'pending', sso_required: false,
      verification: { type: 'TXT', name: challenge, value: expect.stringMatching(/^orgauth-domain-verification=[A-Za-z0-9_-]{20,}$/) },
      verified_at: null, checked_at: null, created_at: expect.any(String),
    });
    expect(res.headers.location).toBe(`/api/v1/${a.organizationId}/domains/${domain}`);
    tokenOfA = claimed.verification.value;
    expect((await api('GET', `/domains/${domain.toUpperCase()}`)).json()).toEqual(claimed);
    expect((await api('GET', '/domains')).json()).toEqual({ data: [claimed] });
    expectError(await api('POST', '/domains', { body: { domain } }), 409, 'conflict');
  });

  it('refuses public mail services and what is not a domain name', async () => {
    const gmail = expectError(await api('POST', '/domains', { body: { domain: 'gmail.com' } }), 400, 'invalid_request');
    expect(gmail.error_description).toMatch(/public mail service/);
    expect(gmail.details).toEqual([{ path: 'domain', message: 'a public mail service cannot be claimed' }]);
    for (const bad of ['localhost', '127.0.0.1', 'not a domain', 'a..b', '']) {
      expect(expectError(await api('POST', '/domains', { body: { domain: bad } }), 400, 'invalid_request').details).toEqual([
        { path: 'domain', message: 'must be a domain name such as example.com' },
      ]);
    }
    expectError(await api('POST', '/domains', { body: {} }), 400, 'invalid_request');
  });

  it('lets another organization claim the same domain while it is pending: claims coexist', async () => {
    const res = await api('POST', '/domains', { org: b, body: { domain } });
    expect(res.statusCode, res.body).toBe(201);
    tokenOfB = res.json().verification.value;
    expect(tokenOfB).not.toBe(tokenOfA);
  });

  it('verification without the record, or with another value, is a 400 that says what to publish', async () => {
    const none = expectError(await api('POST', `/domains/${domain}/verify`), 400, 'invalid_request');
    expect(none.error_description).toBe(`no TXT record found at ${challenge}; publish one holding ${tokenOfA} (DNS changes can take a few minutes)`);
    dns.setTxt(challenge, ['v=spf1 -all', 'orgauth-domain-verification=someone-elses-token']);
    const wrong = expectError(await api('POST', `/domains/${domain}/verify`), 400, 'invalid_request');
    expect(wrong.error_description).toBe(`the TXT records at ${challenge} do not hold this domain's token ${tokenOfA}`);
    expect(dns.queries()).toContain(challenge);
    const shown = (await api('GET', `/domains/${domain}`)).json();
    expect(shown).toMatchObject({ state: 'pending', verified_at: null, checked_at: expect.any(String) });
    expect((await auditEvents()).filter((e) => e.action === 'domain.verification_failed').map((e) => e.details)).toEqual([
      { domain, records_found: 2 },
      { domain, records_found: 0 },
    ]);
  });

  it('verifies once the record holds the token; then the other organization cannot (409), nor can a third claim it (409)', async () => {
    dns.setTxt(challenge, ['v=spf1 -all', tokenOfA]);
    const res = await api('POST', `/domains/${domain}/verify`);
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json()).toMatchObject({ domain, state: 'verified', verified_at: expect.any(String), checked_at: expect.any(String) });
    // Verifying a verified domain answers it as it is.
    expect((await api('POST', `/domains/${domain}/verify`)).json()).toEqual(res.json());

    dns.setTxt(challenge, [tokenOfA, tokenOfB]);
    expect(expectError(await api('POST', `/domains/${domain}/verify`, { org: b }), 409, 'conflict').error_description).toBe(`${domain} is verified by another organization`);
    expect((await api('GET', `/domains/${domain}`, { org: b })).json().state).toBe('pending');
    expect(expectError(await api('POST', '/domains', { org: c, body: { domain } }), 409, 'conflict').error_description).toBe(`${domain} is verified by another organization`);
    expect((await api('GET', '/domains', { org: c })).json()).toEqual({ data: [] });
  });

  it('requires SSO for the domain, and stops requiring it', async () => {
    const on = await api('PATCH', `/domains/${domain}`, { body: { sso_required: true } });
    expect(on.statusCode, on.body).toBe(200);
    expect(on.json()).toMatchObject({ domain, state: 'verified', sso_required: true });
    expect((await api('PATCH', `/domains/${domain}`, { body: {} })).json().sso_required).toBe(true);
    expectError(await api('PATCH', `/domains/${domain}`, { body: { sso_required: 'yes' } }), 400, 'invalid_request');
    expectError(await api('PATCH', `/domains/${domain}`, { body: { state: 'verified' } }), 400, 'invalid_request');
    expect((await api('PATCH', `/domains/${domain}`, { body: { sso_required: false } })).json().sso_required).toBe(false);
  });

  it("another organization's domain is not found here", async () => {
    const theirs = `theirs-${process.pid}.example`;
    expect((await api('POST', '/domains', { org: b, body: { domain: theirs } })).statusCode).toBe(201);
    const missing = await api('GET', '/domains/nowhere.example');
    expectError(missing, 404, 'not_found');
    for (const [method, path, body] of [['GET', '', undefined], ['PATCH', '', { sso_required: true }], ['POST', '/verify', undefined], ['DELETE', '', undefined]] as const) {
      const res = await api(method, `/domains/${theirs}${path}`, body ? { body } : {});
      expect(res.statusCode).toBe(404);
      expect(res.json()).toEqual(missing.json());
    }
    expect((await api('GET', `/domains/${theirs}`, { org: b })).json()).toMatchObject({ domain: theirs, state: 'pending', sso_required: false });
    expectError(await api('GET', `/domains/${theirs}`, { org: b, token: full.get(a) }), 403, 'organization_mismatch');
  });

  it('gives a domain up: 204, then 404; once A lets go, B can verify it', async () => {
    const deleted = await api('DELETE', `/domains/${domain}`);
    expect(deleted.statusCode).toBe(204);
    expectError(await api('GET', `/domains/${domain}`), 404, 'not_found');
    expectError(await api('DELETE', `/domains/${domain}`), 404, 'not_found');
    expect((await api('POST', `/domains/${domain}/verify`, { org: b })).json()).toMatchObject({ domain, state: 'verified' });
  });

  it('writes every change to the audit log, with the application that made it', async () => {
    const events = (await auditEvents()).filter((e) => e.action.startsWith('domain.') && e.details.domain === domain);
    expect(events.map((e) => [e.action, e.details])).toEqual([
      ['domain.deleted', { domain }],
      ['domain.updated', { domain, sso_required: false }],
      ['domain.updated', { domain, sso_required: true, sessions_ended: 0 }],
      ['domain.verified', { domain }],
      ['domain.verification_failed', { domain, records_found: 2 }],
      ['domain.verification_failed', { domain, records_found: 0 }],
      ['domain.added', { domain }],
    ]);
    expect(events.every((e) => e.actor.client_id === a.privateApp.client_id && e.actor.user_id === null)).toBe(true);
    expect((await auditEvents(b)).filter((e) => e.details.domain === domain).map((e) => e.action)).toEqual(['domain.verified', 'domain.added']);
  });
});

describe(`the SSO routes' scopes on ${BACKEND} (BR-2)`, () => {
  const ROUTES: { method: Method; path: string; scope: string; body?: object }[] = [
    { method: 'GET', path: '/sso-connections', scope: 'sso.read' },
    { method: 'POST', path: '/sso-connections', scope: 'sso.write', body: OIDC },
    { method: 'GET', path: '/sso-connections/1', scope: 'sso.read' },
    { method: 'PATCH', path: '/sso-connections/1', scope: 'sso.write', body: { name: 'X' } },
    { method: 'DELETE', path: '/sso-connections/1', scope: 'sso.write' },
    { method: 'GET', path: '/domains', scope: 'sso.read' },
    { method: 'POST', path: '/domains', scope: 'sso.write', body: { domain: 'scopes.example' } },
    { method: 'GET', path: '/domains/scopes.example', scope: 'sso.read' },
    { method: 'POST', path: '/domains/scopes.example/verify', scope: 'sso.write' },
    { method: 'PATCH', path: '/domains/scopes.example', scope: 'sso.write', body: { sso_required: true } },
    { method: 'DELETE', path: '/domains/scopes.example', scope: 'sso.write' },
  ];

  it('refuses every token without the route’s scope (403 insufficient_scope, before the body is read); sso.write does not imply sso.read', async () => {
    const tokens = new Map<string, string>();
    for (const scope of KNOWN_SCOPES) tokens.set(scope, await clientCredentialsToken(app, c, scope));
    for (const route of ROUTES) {
      for (const scope of KNOWN_SCOPES.filter((s) => s !== route.scope)) {
        const res = await api(route.method, route.path, { org: c, token: tokens.get(scope)!, ...(route.body ? { body: route.body } : {}) });
        expect({ route: `${route.method} ${route.path}`, scope, status: res.statusCode, error: res.json().error }).toEqual({ route: `${route.method} ${route.path}`, scope, status: 403, error: 'insufficient_scope' });
        expect(res.headers['www-authenticate']).toBe(`Bearer realm="orgauth", resource_metadata="${issuer}/.well-known/oauth-protected-resource/api/v1", error="insufficient_scope", scope="${route.scope}"`);
      }
    }
    // Nothing was made by the refused calls.
    expect(await t.handle.db.selectFrom('sso_connections').select('id').where('organization_id', '=', c.organizationId).execute()).toEqual([]);
    expect(await t.handle.db.selectFrom('sso_domains').select('id').where('organization_id', '=', c.organizationId).execute()).toEqual([]);
  });

  it('lets the token with the scope through', async () => {
    const read = await clientCredentialsToken(app, c, 'sso.read');
    const write = await clientCredentialsToken(app, c, 'sso.write');
    expect((await api('GET', '/sso-connections', { org: c, token: read })).json()).toEqual({ data: [] });
    expect((await api('POST', '/domains', { org: c, token: write, body: { domain: 'scopes.example' } })).statusCode).toBe(201);
    expect((await api('GET', '/domains/scopes.example', { org: c, token: read })).json().state).toBe('pending');
    expect((await api('DELETE', '/domains/scopes.example', { org: c, token: write })).statusCode).toBe(204);
  });
});

describe(`the SSO routes in the OpenAPI document on ${BACKEND}`, () => {
  it('documents both resources with their scopes, and never a client secret in a response', async () => {
    const doc = (await app.inject('/openapi.json')).json() as { paths: Record<string, Record<string, { security: { oauth2: string[] }[] }>>; components: { schemas: Record<string, { properties: Record<string, unknown> }> } };
    expect(doc.paths['/api/v1/{organization_id}/sso-connections']!.post!.security).toEqual([{ oauth2: ['sso.write'] }]);
    expect(doc.paths['/api/v1/{organization_id}/domains/{domain}/verify']!.post!.security).toEqual([{ oauth2: ['sso.write'] }]);
    expect(Object.keys(doc.components.schemas.SsoConnection!.properties)).not.toContain('client_secret');
    expect(Object.keys(doc.components.schemas.Domain!.properties)).toContain('verification');
  });
});
